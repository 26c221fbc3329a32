"""Refused work is not free (issue 42, finding 3): inputs refused as invalid after the
edge read them cost their caller's rate as accepted ones do and are counted; a caller
refused for its rate or its requests in flight is refused again from memory, before
its inputs are read or Redis is asked; the dashboard's numbers are rate-limited per
caller."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from dynamic_batching import metrics
from dynamic_batching.models import ApiToken, ClientQuota
from dynamic_batching.store import request_queues

pytestmark = [pytest.mark.live, pytest.mark.django_db]


def caller(django_user_model: Any, name: str, **quota: Any) -> Client:
    user = django_user_model.objects.create_user(name)
    if quota:
        ClientQuota.objects.create(user=user, **quota)
    return Client(headers={"Authorization": f"Bearer {ApiToken.objects.issue(user, name='t')[1]}"})


def post(client: Client, body: object) -> Any:
    return client.post("/api/v1/requests", data=json.dumps(body), content_type="application/json")


def test_invalid_inputs_cost_their_callers_rate_and_are_counted(bare_redis, django_user_model) -> None:  # type: ignore[no-untyped-def]
    client = caller(django_user_model, "sloppy", rate_per_s=0.5, burst=5)
    before = metrics.read().counters.get("invalid", 0)
    refused = post(client, {"texts": ["fine", "", "", "", ""], "model": "synthetic"})
    assert refused.status_code == 422, refused.content
    assert metrics.read().counters.get("invalid", 0) - before == 5
    # The five refused inputs took the burst: a valid call now waits for the rate.
    late = post(client, {"text": "valid at last", "model": "synthetic"})
    assert late.status_code == 429 and int(late["Retry-After"]) >= 1, late.content
    assert "rate limit" in late.json()["detail"]


def test_a_call_over_the_burst_costs_nothing_it_was_refused_unread(bare_redis, django_user_model) -> None:  # type: ignore[no-untyped-def]
    client = caller(django_user_model, "too-many-at-once", rate_per_s=0.5, burst=5)
    over = post(client, {"texts": [f"text {i}" for i in range(6)], "model": "synthetic"})
    assert over.status_code == 422 and "burst" in over.json()["detail"]
    assert post(client, {"text": "within the burst", "model": "synthetic"}).status_code == 202


def test_a_refusal_for_requests_in_flight_is_answered_again_from_memory(
    bare_redis, django_user_model, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    client = caller(django_user_model, "busy", max_in_flight=2, rate_per_s=100, burst=100)
    assert post(client, {"texts": ["one", "two"], "model": "synthetic"}).status_code == 202
    first = post(client, {"text": "three", "model": "synthetic"})  # nothing runs them: still in flight
    assert first.status_code == 429 and "waiting for answers" in first.json()["detail"]
    admitted = []
    real = request_queues.admit
    monkeypatch.setattr(request_queues, "admit", lambda *a, **k: admitted.append(a) or real(*a, **k))
    again = post(client, {"text": "four", "model": "synthetic"})
    assert again.status_code == 429 and int(again["Retry-After"]) >= 1
    assert admitted == [], "a remembered refusal went to Redis all the same"


def test_the_dashboards_numbers_are_rate_limited_per_caller(bare_redis, django_user_model) -> None:  # type: ignore[no-untyped-def]
    reader = caller(django_user_model, "watcher")
    codes = [reader.get("/api/v1/stats").status_code for _ in range(15)]
    assert codes[:10] == [200] * 10 and 429 in codes[10:], codes
    limited = reader.get("/api/v1/stats")
    assert limited.status_code == 429 and int(limited["Retry-After"]) >= 1
    assert caller(django_user_model, "other-watcher").get("/api/v1/stats").status_code == 200
