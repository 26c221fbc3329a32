"""The JSON API at /api/v1/: auth (token and session with CSRF), validation that answers
4xx and never 500, and requests answered end to end on the live system."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client
from polling import poll_until

from dynamic_batching.core.policy import BatchPolicy
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.models import ApiToken
from dynamic_batching.protocol.names import reply_key

pytestmark = pytest.mark.django_db

API = "/api/v1"


@pytest.fixture
def user(django_user_model):  # type: ignore[no-untyped-def]
    # No password: hashing one costs a second per test here, and tokens and
    # force_login need none.
    return django_user_model.objects.create_user("alice")


@pytest.fixture
def token(user) -> str:  # type: ignore[no-untyped-def]
    return ApiToken.objects.issue(user, name="tests")[1]


@pytest.fixture
def api(token: str) -> Client:
    """A script's client: every call carries the bearer token."""
    return Client(headers={"Authorization": f"Bearer {token}"})


def post(client: Client, body: object, **extra: object):  # type: ignore[no-untyped-def]
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post(f"{API}/requests", data=data, content_type="application/json", **extra)


def wait_done(client: Client, request_id: str, timeout: float = 60.0) -> dict[str, object]:
    def finished() -> dict[str, object] | None:
        body = client.get(f"{API}/requests/{request_id}").json()
        return body if body["status"] in ("SUCCESS", "FAILURE") else None

    return poll_until(finished, f"request {request_id} to finish", timeout=timeout, interval=0.05)


# --- auth ------------------------------------------------------------------------------


def test_without_credentials_every_operation_is_401(client: Client) -> None:
    assert post(client, {"text": "hi"}).status_code == 401
    assert client.get(f"{API}/stats").status_code == 401
    assert client.get(f"{API}/requests/{uuid.uuid4()}").status_code == 401
    # A token that is wrong, revoked or of an inactive user is no credential either.
    assert post(client, {"text": "hi"}, headers={"Authorization": "Bearer bt_nope"}).status_code == 401
    assert post(client, {"text": "hi"}, headers={"Authorization": "Basic YTpi"}).status_code == 401


def test_revoked_token_and_inactive_user_are_refused(user, token: str) -> None:  # type: ignore[no-untyped-def]
    from django.utils import timezone

    c = Client(headers={"Authorization": f"Bearer {token}"})
    assert ApiToken.objects.user_for(token) == user
    ApiToken.objects.update(revoked_at=timezone.now())
    assert post(c, {"text": "hi"}).status_code == 401
    ApiToken.objects.update(revoked_at=None)
    user.is_active = False
    user.save()
    assert post(c, {"text": "hi"}).status_code == 401


def test_only_the_tokens_hash_is_stored(token: str) -> None:
    row = ApiToken.objects.get()
    assert token.startswith("bt_") and len(token) > 40
    assert token not in (row.key_hash, row.prefix) and row.key_hash != token
    assert token.startswith(row.prefix)


def test_create_api_token_command_prints_a_working_token(user, capsys) -> None:  # type: ignore[no-untyped-def]
    from django.core.management import CommandError, call_command

    call_command("create_api_token", "alice", "--name", "cli")
    printed = capsys.readouterr().out.strip()
    assert ApiToken.objects.user_for(printed) == user
    with pytest.raises(CommandError, match="no user 'bob'"):
        call_command("create_api_token", "bob")


def test_session_auth_needs_the_csrf_token_on_post(user, bare_redis) -> None:  # type: ignore[no-untyped-def]
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    refused = post(browser, {"text": "hi", "model": "synthetic"})
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    browser.get("/")  # the page sets the csrftoken cookie, as in a browser
    csrf = browser.cookies["csrftoken"].value
    accepted = post(browser, {"text": "hi", "model": "synthetic"}, headers={"X-CSRFToken": csrf})
    assert accepted.status_code == 202, accepted.content
    assert browser.get(f"{API}/stats").status_code == 200  # reads need no CSRF token


# --- validation: 4xx with a JSON reason, never 500 -----------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({}, 422, "exactly one of"),
        ({"text": "a", "texts": ["b"]}, 422, "exactly one of"),
        ({"texts": []}, 422, "at least 1"),
        ({"texts": ["x"] * 257}, 422, "at most 256"),
        ({"text": 42}, 422, "string"),
        ({"texts": "not a list"}, 422, "list"),
        ({"text": "hi", "priority": "urgent"}, 422, "high"),
        ({"text": "hi", "deadline_s": -1}, 422, "greater than 0"),
        ({"text": "hi", "deadline_s": "soon"}, 422, "number"),
        ({"text": "hi", "model": "gpt-5"}, 422, "gpt-5"),
        ({"text": "   "}, 422, "empty"),
        ({"text": "a\ud800b"}, 422, "surrogate"),
        ({"text": "word " * 30_000}, 413, "limit"),
        (b'{"text": "hi"', 400, "parse"),
        (b'\xff\xfe{"text": 1}', 400, "parse"),
        (b'{"text": "hi", "deadline_s": NaN}', 422, "finite"),
        (b'{"input": {"values": [1, NaN]}}', 422, "NaN or Infinity"),
        (b"[1, 2, 3]", 422, ""),
    ],
)
def test_bad_input_gets_a_json_reason(api: Client, bare_redis, body, status, says) -> None:  # type: ignore[no-untyped-def]
    response = post(api, body)
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    assert says.lower() in json.dumps(response.json()["detail"]).lower()


def test_a_body_over_the_limit_is_413(api: Client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = post(api, {"texts": ["word " * 100] * 3})
    assert response.status_code == 413 and "over 1000 bytes" in response.json()["detail"]


def test_bad_ids_are_422(api: Client) -> None:
    assert api.get(f"{API}/requests/not-a-uuid").status_code == 422
    assert api.get(f"{API}/stats?since=yesterday").status_code == 422


def test_a_full_queue_is_429_with_retry_after(api: Client, user, bare_redis) -> None:  # type: ignore[no-untyped-def]
    from dynamic_batching.edge import client
    from dynamic_batching.models import ClientQuota
    from dynamic_batching.store import shared_state

    # One client may fill a whole tier only if its quota says so (tests/live/test_quotas.py).
    ClientQuota.objects.create(user=user, tier_share=1.0, max_priority="high")
    shared_state.publish_policy(BatchPolicy(queue_caps={"high": 100, "normal": 100, "low": 3}))
    client._policy._read_at = float("-inf")
    assert post(api, {"texts": ["a", "b", "c"], "priority": "low", "model": "synthetic"}).status_code == 202
    full = post(api, {"text": "one more", "priority": "low", "model": "synthetic"})
    assert full.status_code == 429
    assert int(full["Retry-After"]) >= 1 and "full" in full.json()["detail"]
    # Other tiers have their own caps.
    assert post(api, {"text": "urgent", "priority": "high", "model": "synthetic"}).status_code == 202


def test_an_unreachable_broker_is_503_not_500(api: Client, unreachable_redis: None) -> None:
    assert post(api, {"text": "hi", "model": "synthetic"}).status_code == 503
    assert api.get(f"{API}/stats").status_code == 503
    assert api.get(f"{API}/requests/{uuid.uuid4()}").status_code == 503


# --- the schema ---------------------------------------------------------------------------------


def test_openapi_schema_and_docs_are_served_offline(client: Client) -> None:
    schema = client.get(f"{API}/openapi.json").json()
    assert {"/api/v1/requests", "/api/v1/requests/{request_id}", "/api/v1/stats"} <= set(schema["paths"])
    post_op = schema["paths"]["/api/v1/requests"]["post"]
    assert {"202", "401", "413", "422", "429"} <= set(post_op["responses"])
    assert {"BearerToken", "SessionWithCsrf"} <= set(schema["components"]["securitySchemes"])
    docs = client.get(f"{API}/docs")
    assert docs.status_code == 200
    assert b"cdn" not in docs.content.lower(), "the docs page must not load scripts from the internet"


# --- end to end ----------------------------------------------------------------------------------


@pytest.mark.live
def test_submit_many_and_read_each_result_with_its_timeline(live_system, api: Client) -> None:  # type: ignore[no-untyped-def]
    texts = [f"api request {i}" for i in range(20)] + ["this one is poison !fail"]
    response = post(api, {"texts": texts, "priority": "normal", "model": "synthetic", "deadline_s": 60})
    assert response.status_code == 202
    ids = response.json()["ids"]
    assert len(ids) == len(texts) and len(set(ids)) == len(ids)
    # Read later by id: no reply list is filled for a caller who never pops it.
    assert {reply_key(i) for i in ids} == {None}

    for text, request_id in zip(texts, ids, strict=True):
        body = wait_done(api, request_id)
        events = [e["event"] for e in body["timeline"]]
        assert events == ["submitted", "dispatched", "started", "finished"], body["timeline"]
        assert body["details"]["priority"] == "normal"
        if "!fail" in text:
            assert body["status"] == "FAILURE" and "PoisonInput" in body["error"]
        else:
            assert body["status"] == "SUCCESS" and body["result"] == synthetic.embed(text)

    stats = api.get(f"{API}/stats").json()
    assert stats["totals"]["completed"] >= 20 and stats["totals"]["failed"] >= 1
    assert any(e["id"] == ids[-1] for e in stats["recent"]["failed"])
    assert stats["collector"]["up"] and len(stats["devices"]) >= 2


@pytest.mark.live
def test_a_pending_request_reads_as_pending(live_system, api: Client, user) -> None:  # type: ignore[no-untyped-def]
    from dynamic_batching.protocol.names import owner_key
    from dynamic_batching.store import shared_state

    # A request of this user's that no device has answered yet (as admission records it).
    request_id = str(uuid.uuid4())
    shared_state.client().set(owner_key(request_id), f"normal|user:{user.pk}", ex=60)
    body = api.get(f"{API}/requests/{request_id}").json()
    assert body["status"] == "PENDING" and body["timeline"][-1]["event"] == "pending"


@pytest.mark.live
def test_an_answer_holding_nan_reads_as_json_with_null(live_system, api: Client, user) -> None:  # type: ignore[no-untyped-def]
    # A model of the host project's may answer NaN; Celery stores it as NaN, which is
    # not JSON: a browser's JSON.parse would refuse the whole response.
    from batching_site.celery import app
    from dynamic_batching.protocol.names import owner_key
    from dynamic_batching.protocol.results import Outcome
    from dynamic_batching.store import shared_state
    from dynamic_batching.store.outcomes import OutcomeWriter

    request_id = str(uuid.uuid4())
    shared_state.client().set(owner_key(request_id), f"normal|user:{user.pk}", ex=60)
    OutcomeWriter(app).write([Outcome(request_id, result={"scores": [0.5, float("nan")], "top": float("inf")})])

    def strict(raw: bytes) -> dict[str, object]:
        return json.loads(raw, parse_constant=lambda name: pytest.fail(f"{name} in a JSON response"))

    page = Client()
    page.force_login(user)
    for response in (api.get(f"{API}/requests/{request_id}"), page.get(f"/requests/{request_id}.json")):
        assert response.status_code == 200
        body = strict(response.content)
        assert body["status"] == "SUCCESS" and body["result"] == {"scores": [0.5, None], "top": None}


def test_a_tier_above_the_quota_is_403_naming_the_allowed_one(api: Client, bare_redis) -> None:  # type: ignore[no-untyped-def]
    # Issue 42, finding 2 (it was a 500 on the API until the fuzzer found it).
    response = post(api, {"text": "urgent", "priority": "high", "model": "synthetic"})
    assert response.status_code == 403 and "'normal' at most" in response.json()["detail"]
    for path in ("/api/v1/models/synthetic/requests",):
        typed = api.post(
            path, data=json.dumps({"input": "urgent", "priority": "high"}), content_type="application/json"
        )
        assert typed.status_code == 403, typed.content


def test_a_long_poll_on_someone_elses_request_is_404_at_once(api: Client, bare_redis, django_user_model) -> None:  # type: ignore[no-untyped-def]
    # `?wait=` reads the same owner rule as the status read, before it waits: another
    # user's request is 404 at once, as an id that never existed, never a wait that
    # would tell it is real.
    import time

    bob = django_user_model.objects.create_user("bob-waits")
    bobs = Client(headers={"Authorization": f"Bearer {ApiToken.objects.issue(bob, name='t')[1]}"})
    [theirs] = post(bobs, {"text": "bob's, still queued", "model": "synthetic"}).json()["ids"]
    started = time.monotonic()
    assert api.get(f"{API}/requests/{theirs}?wait=5").status_code == 404
    assert time.monotonic() - started < 2
    # Its owner's long poll waits out its `wait` and answers the state (no device here).
    started = time.monotonic()
    mine = bobs.get(f"{API}/requests/{theirs}?wait=1")
    assert mine.status_code == 200 and mine.json()["status"] == "PENDING"
    assert time.monotonic() - started >= 1
