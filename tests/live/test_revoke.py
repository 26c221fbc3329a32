"""Revoking requests through Celery's own API (issue 39, cancellation): a request still
queued or held never runs, its state is REVOKED once, `.get()` raises
TaskRevokedError, and its owner's in-flight slots are freed at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from celery.exceptions import TaskRevokedError
from polling import poll_until

from batching_site.celery import app
from dynamic_batching.core.quota import Quota
from dynamic_batching.edge.client import submit_many
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.protocol.names import in_flight_key
from dynamic_batching.store import shared_state

pytestmark = pytest.mark.live

OWNER = "user:revoker"


def test_revoking_100_requests_behind_a_backlog_runs_none_of_them(bare_redis) -> None:  # type: ignore[no-untyped-def]
    r = shared_state.client()
    quota = Quota(rate_per_s=10_000, burst=10_000, max_in_flight=10_000, tier_share=1.0)
    backlog_texts = [f"backlog {i}" for i in range(300)]
    # Fifty before the backlog and fifty after it: with no device yet, the collector
    # holds its window (256, the oldest) and the rest waits queued, so both a held and a
    # queued request are revoked.
    first = submit_many([f"revoked {i}" for i in range(50)], model="synthetic", owner=OWNER, quota=quota)
    backlog = submit_many(backlog_texts, model="synthetic", owner=OWNER, quota=quota)
    last = submit_many([f"revoked {i}" for i in range(50, 100)], model="synthetic", owner=OWNER, quota=quota)
    doomed = first + last
    bare_redis.start_collector()
    poll_until(lambda: r.hlen("batching:held:normal") >= 256, "the collector to hold its window", timeout=60)
    held = set(r.hkeys("batching:held:normal"))
    assert all(x.id.encode() in held for x in first) and not any(x.id.encode() in held for x in last)
    assert r.zcard(in_flight_key(OWNER, "normal")) == 400
    poll_until(lambda: app.control.ping(timeout=0.5), "the collector to answer remote control", timeout=60)

    for result in doomed[:50]:
        result.revoke()  # one by one, as a script would
    app.control.revoke([result.id for result in doomed[50:]])  # and many at once

    poll_until(lambda: all(x.state == "REVOKED" for x in doomed), "every revoked request to read REVOKED", timeout=30)
    # Celery's own revoke handler stores REVOKED at once; the collector's next turn
    # (0.25 s) takes them out and frees their owner's slots.
    t0 = time.monotonic()
    poll_until(lambda: r.zcard(in_flight_key(OWNER, "normal")) == 300, "their in-flight slots to be freed", timeout=10)
    print(f"in-flight slots freed {time.monotonic() - t0:.2f} s after REVOKED")
    with pytest.raises(TaskRevokedError):
        doomed[0].get(timeout=5)

    bare_redis.start_device("cpu:0")
    assert [x.get(timeout=120) for x in backlog] == [synthetic.embed(t) for t in backlog_texts]
    assert all(x.state == "REVOKED" for x in doomed), "a revoked request was answered after all"
    beat = poll_until(
        lambda: (
            next(iter(shared_state.live_devices().values()), {}).get("requests", 0) >= 300
            and shared_state.live_devices()
        ),
        "the device's heartbeat to count the backlog",
        timeout=30,
    )
    [device] = beat.values()
    assert device["requests"] == 300, f"the device ran {device['requests']} requests: a revoked one ran"
    assert r.zcard(in_flight_key(OWNER, "normal")) == 0


def test_celery_purge_of_a_request_queue_sticks(bare_redis) -> None:  # type: ignore[no-untyped-def]
    # `celery purge` deletes the queue's list; the ledger, which queues again whatever
    # an accepted request loses, must not bring purged requests back (up to three times,
    # as it did): each ends REVOKED, frees its owner's slots and never runs.
    owner = "user:purger"
    r = shared_state.client()
    quota = Quota(rate_per_s=10_000, burst=10_000, max_in_flight=10_000, tier_share=1.0)
    doomed = submit_many([f"purged {i}" for i in range(50)], model="synthetic", owner=owner, quota=quota)
    assert r.zcard(in_flight_key(owner, "normal")) == 50
    env = {**os.environ, "REDIS_URL": bare_redis.redis_url, "BATCHING_REDIS_URL": bare_redis.redis_url}
    purge = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "batching_site", "purge", "-f", "-Q", "batching.requests.normal"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert purge.returncode == 0 and "Purged 50 messages" in purge.stdout, purge.stdout + purge.stderr

    # A short ledger grace: the sweep looks for lost requests every 5 s past 5 s.
    bare_redis.start_collector(env={"BATCHING_VISIBILITY_TIMEOUT_S": "4", "BATCHING_LEDGER_GRACE_S": "5"})
    poll_until(lambda: all(x.state == "REVOKED" for x in doomed), "every purged request to read REVOKED", timeout=30)
    poll_until(lambda: r.zcard(in_flight_key(owner, "normal")) == 0, "their in-flight slots to be freed", timeout=10)
    with pytest.raises(TaskRevokedError):
        doomed[0].get(timeout=5)

    bare_redis.start_device("cpu:0")
    [after] = submit_many(["after the purge"], model="synthetic")
    assert after.get(timeout=60) == synthetic.embed("after the purge")
    time.sleep(12)  # past the ledger's grace and two of its sweeps
    stats = (shared_state.read_collector() or {}).get("stats", {})
    assert stats.get("purged") == 50 and stats.get("republished", 0) == 0, stats
    assert all(x.state == "REVOKED" for x in doomed)
    [device] = shared_state.live_devices().values()
    assert device["requests"] == 1, f"the device ran {device['requests']} requests: a purged one ran"


def test_a_request_already_running_when_revoked_finishes(bare_redis) -> None:  # type: ignore[no-untyped-def]
    # With task_track_started (the site's default), a request is STARTED once its batch
    # begins; Celery's revoke handler leaves a started task alone, and so does the
    # collector: it finishes, as a started Celery task revoked without terminate does.
    bare_redis.start_collector()
    bare_redis.start_device("cpu:0", env={"SYNTHETIC_PER_TOKEN_S": "0.01"})  # about 2 s for this text
    bare_redis.wait_ready(1)
    text = "runs for a while " + "w " * 200
    [result] = submit_many([text], model="synthetic")
    poll_until(lambda: result.state == "STARTED", "the request to start", timeout=30)
    result.revoke()
    assert result.get(timeout=30) == synthetic.embed(text)
    assert result.state == "SUCCESS"


@pytest.mark.django_db
def test_an_owner_cancels_a_queued_request_through_the_api(bare_redis, django_user_model) -> None:  # type: ignore[no-untyped-def]
    import json

    from django.test import Client

    owner = Client()
    owner.force_login(django_user_model.objects.create_user("canceller"))
    other = Client()
    other.force_login(django_user_model.objects.create_user("bystander"))
    reply = owner.post(
        "/api/v1/requests",
        data=json.dumps({"text": "never runs", "model": "synthetic"}),
        content_type="application/json",
    )
    assert reply.status_code == 202, reply.content
    [task_id] = reply.json()["ids"]
    bare_redis.start_collector()  # no device: it waits
    # A revoke is a broadcast, heard only by workers listening then: as with Celery.
    poll_until(lambda: app.control.ping(timeout=0.5), "the collector to answer remote control", timeout=60)

    assert other.delete(f"/api/v1/requests/{task_id}").status_code == 404
    cancel = owner.delete(f"/api/v1/requests/{task_id}")
    assert cancel.status_code == 202 and cancel.json()["status"] == "PENDING", cancel.content
    poll_until(lambda: app.AsyncResult(task_id).state == "REVOKED", "the request to be revoked", timeout=30)
    assert owner.get(f"/api/v1/requests/{task_id}").json()["status"] == "REVOKED"
    assert owner.delete(f"/api/v1/requests/{task_id}").status_code == 409


@pytest.mark.django_db
def test_the_request_page_offers_cancel_while_pending_and_shows_revoked(bare_redis, django_user_model) -> None:  # type: ignore[no-untyped-def]
    import json

    from django.test import Client

    owner = Client()
    owner.force_login(django_user_model.objects.create_user("page-owner"))
    reply = owner.post(
        "/api/v1/requests", data=json.dumps({"text": "waits", "model": "synthetic"}), content_type="application/json"
    )
    [task_id] = reply.json()["ids"]
    page = owner.get(f"/requests/{task_id}").content.decode()
    assert 'id="cancel"' in page and f'data-url="/api/v1/requests/{task_id}"' in page
    bare_redis.start_collector()
    poll_until(lambda: app.control.ping(timeout=0.5), "the collector to answer remote control", timeout=60)
    assert owner.delete(f"/api/v1/requests/{task_id}").status_code == 202
    poll_until(lambda: app.AsyncResult(task_id).state == "REVOKED", "the request to be revoked", timeout=30)
    page = owner.get(f"/requests/{task_id}").content.decode()
    assert 'id="cancel"' not in page and "cancelled (revoked) before it ran" in page
    assert 'http-equiv="refresh"' not in page, "a revoked request is final: no more refreshing"
