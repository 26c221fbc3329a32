"""Flower on a host name of its own (issue 42, finding 10): staff carry their login from
the site's host name with a one-time ticket (batching_site/gate.py). The front door's
part, in a browser, is in tests/live/test_tls_proxy.py."""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core import signing
from django.test import Client

from batching_site import gate

pytestmark = [pytest.mark.live, pytest.mark.django_db]

SITE, FLOWER = "localhost", "flower.localhost:8443"


@pytest.fixture
def flower_url(batching_settings, settings) -> None:  # type: ignore[no-untyped-def]
    batching_settings(FLOWER_URL=f"https://{FLOWER}/flower/")
    settings.ALLOWED_HOSTS = [SITE, "flower.localhost"]


@pytest.fixture
def staff(django_user_model):  # type: ignore[no-untyped-def]
    return django_user_model.objects.create_user("flower-staff", password="not-a-real-one", is_staff=True)


def ticket_link(client: Client, next_path: str = "/flower/tasks") -> str:
    response = client.get("/auth/flower", {"next": next_path}, HTTP_HOST=SITE)
    assert response.status_code == 302, response.status_code
    return response["Location"]


def enter(link: str) -> tuple[Client, int, str]:
    """Follow a ticket link in a browser that has never been to the site's host name."""
    parts = urlsplit(link)
    client = Client()
    response = client.get(parts.path, parse_qs(parts.query), HTTP_HOST=parts.netloc)
    return client, response.status_code, response.get("Location", "")


def test_staff_logged_in_on_the_site_are_logged_in_on_flowers_host_name_once(
    flower_url: None, staff: object, bare_redis: object
) -> None:
    site = Client()
    site.force_login(staff)
    link = ticket_link(site)
    assert link.startswith(f"https://{FLOWER}/_staff/enter?")

    browser, status, location = enter(link)
    assert (status, location) == (302, "/flower/tasks")
    # Its own session, on Flower's host name: the gate lets it through there.
    assert browser.get("/auth/staff", HTTP_HOST=FLOWER).status_code == 204
    assert browser.cookies["sessionid"].value != site.cookies["sessionid"].value
    assert not browser.cookies["sessionid"]["domain"], "the session must stay on Flower's host name"

    _, again, _ = enter(link)
    assert again == 403, "a ticket opens Flower once"


def test_nobody_but_active_staff_gets_a_ticket(flower_url: None, django_user_model) -> None:  # type: ignore[no-untyped-def]
    anonymous = Client().get("/auth/flower", {"next": "/flower/"}, HTTP_HOST=SITE)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/admin/login/?next=/auth/flower")
    user = Client()
    user.force_login(django_user_model.objects.create_user("not-staff"))
    assert user.get("/auth/flower", HTTP_HOST=SITE).status_code == 403


def test_a_ticket_is_refused_when_forged_expired_stale_or_on_the_sites_host_name(
    flower_url: None, staff, bare_redis: object, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    site = Client()
    site.force_login(staff)

    # On the site's host name the link opens nothing (the session there is the site's).
    parts = urlsplit(ticket_link(site))
    assert Client().get(parts.path, parse_qs(parts.query), HTTP_HOST=SITE).status_code == 404

    forged = signing.dumps({"u": staff.pk, "h": staff.get_session_auth_hash(), "n": "x"}, salt="another salt")
    assert enter(f"https://{FLOWER}/_staff/enter?ticket={forged}")[1] == 403

    link = ticket_link(site)
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + gate.TICKET_S + 1)
    assert enter(link)[1] == 403, "a ticket past its minute"
    monkeypatch.undo()

    link = ticket_link(site)
    staff.set_password("changed since")
    staff.save()
    assert enter(link)[1] == 403, "a ticket from before a password change"


@pytest.mark.parametrize("asked", ["https://elsewhere.example/", "//elsewhere.example/flower/", "/admin/", None])
def test_a_ticket_lands_under_flower_only(flower_url: None, staff, bare_redis: object, asked: str | None) -> None:  # type: ignore[no-untyped-def]
    site = Client()
    site.force_login(staff)
    response = site.get("/auth/flower", {} if asked is None else {"next": asked}, HTTP_HOST=SITE)
    assert parse_qs(urlsplit(response["Location"]).query)["next"] == ["/flower/"]


def test_a_ticket_checked_while_redis_is_away_is_answered_503_not_500(
    flower_url: None, staff, bare_redis: object, unreachable_redis: None
) -> None:  # type: ignore[no-untyped-def]
    site = Client()
    site.force_login(staff)
    link = ticket_link(site)
    _, status, _ = enter(link)
    assert status == 503, "never a 500, never a session without the once-only check"
