"""/healthz tells anybody whether the service is up and what is missing, and only staff
and a probe on this host's own loopback what it is made of (issue 42, finding 5: it
gave anonymous callers Redis and PostgreSQL error texts, hostnames and device ids)."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = [pytest.mark.live, pytest.mark.django_db]

REMOTE = {"REMOTE_ADDR": "203.0.113.9"}


def test_anybody_else_gets_the_verdict_and_the_missing_names_only(bare_redis, django_user_model) -> None:  # type: ignore[no-untyped-def]
    bare_redis.stop("redis")  # a broken broker: its error text must not reach a visitor
    for client, extra in (
        (Client(), REMOTE),
        (Client(), {"HTTP_X_FORWARDED_FOR": "203.0.113.9"}),  # from loopback, but through the front door
    ):
        response = client.get("/healthz", **extra)
        assert response.status_code == 503
        assert response.json() == {"status": "unavailable", "missing": ["broker", "collector", "device worker"]}

    plain = Client()
    plain.force_login(django_user_model.objects.create_user("not-staff"))
    assert set(plain.get("/healthz", **REMOTE).json()) == {"status", "missing"}

    staff = Client()
    staff.force_login(django_user_model.objects.create_user("ops", is_staff=True))
    detail = staff.get("/healthz", **REMOTE).json()
    assert detail["broker"].startswith("unreachable") and "policy" in detail and "models" in detail
    probe = Client().get("/healthz").json()  # the container's or supervisor's own probe
    assert probe["broker"].startswith("unreachable")
