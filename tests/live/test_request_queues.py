"""The request queues' scripts, against a real Redis with nothing consuming it: what the
edge queues, what the collector takes, holds, sends and puts back.

The messages are the ones `send_task` would write, so kombu can read them back as it
would for a worker (checked here with kombu's own Message).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from kombu.transport.virtual.base import Message
from polling import poll_until

from batching_site.celery import app
from dynamic_batching.core.quota import Quota
from dynamic_batching.protocol import wire
from dynamic_batching.protocol.names import (
    BATCH_QUEUE,
    BATCH_TASK,
    COLLECTOR_LEASE_KEY,
    EVENTS_QUEUE,
    REQUEST_TASK,
    held_key,
    queued_key,
    request_queue_name,
)
from dynamic_batching.store import ledger, owners, request_queues, shared_state
from dynamic_batching.store.lease import Lease, LeaseLost, epoch_of


def messages(priority: str, n: int, tag: str = "m") -> list[tuple[str, str]]:
    queue = request_queue_name(priority)
    out = []
    for i in range(n):
        task_id = str(uuid.uuid4())
        body = {"input": f"{tag} {i}", "priority": priority}
        out.append((task_id, wire.task_message(app, REQUEST_TASK, task_id, [body], queue, argsrepr=f"{tag} {i}")))
    return out


@pytest.fixture
def r(bare_redis: Any) -> Any:
    return shared_state.client()


@pytest.fixture
def token(r: Any) -> str:
    """The fencing token of this test's collector lease."""
    lease = Lease(r, ttl_s=60)
    assert lease.acquire() and lease.token
    return lease.token


def test_a_message_reads_back_through_kombu_as_send_task_would_write_it(bare_redis: Any) -> None:
    task_id, raw = messages("high", 1)[0]
    payload = json.loads(raw)
    message = Message(payload, channel=app.connection_for_read().default_channel)
    assert message.headers["task"] == REQUEST_TASK and message.headers["id"] == task_id
    assert message.delivery_info["routing_key"] == request_queue_name("high")
    assert message.decode() == [
        [{"input": "m 0", "priority": "high"}],
        {},
        {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
    ]
    decoded = wire.decode(raw)
    assert (decoded.task, decoded.task_id, decoded.args[0]["input"]) == (REQUEST_TASK, task_id, "m 0")


def test_admit_queues_records_and_wakes_or_refuses_all(r: Any, token: str) -> None:
    batch = messages("low", 3)
    assert request_queues.admit(r, "low", 4, batch) == (True, 0, "", 0.0)
    assert r.llen(request_queue_name("low")) == 3 and r.llen(request_queues.WAKE_KEY) == 1
    assert ledger.size(r) == 3
    # Two more would pass the cap of 4: neither is queued, nothing is recorded.
    assert request_queues.admit(r, "low", 4, messages("low", 2)) == (False, 3, "tier", 0.0)
    assert r.llen(request_queue_name("low")) == 3 and ledger.size(r) == 3
    # Caps are per tier.
    assert request_queues.admit(r, "high", 4, messages("high", 2))[0]


# --- a client's quota (tasks/core/quota.py) ---------------------------------------------------


def test_a_clients_rate_is_a_token_bucket_refilled_by_the_clock(r: Any) -> None:
    quota = Quota(rate_per_s=2, burst=4, max_in_flight=100, tier_share=1.0)

    def admit(n: int, at: float) -> request_queues.Admission:
        return request_queues.admit(r, "normal", 100, messages("normal", n), owner="user:1", quota=quota, now=at)

    assert admit(4, 1000.0).accepted
    refused = admit(1, 1000.0)
    assert (refused.accepted, refused.refused_by, refused.retry_after) == (False, "rate", 0.5)
    assert r.llen(request_queue_name("normal")) == 4, "a refused request was queued"
    assert admit(1, 1000.5).accepted  # half a second refills one
    assert not admit(2, 1000.5).accepted
    assert admit(4, 1010.0).accepted  # refilled to the burst, no further
    assert not admit(1, 1010.0).accepted


def test_in_flight_and_share_limits_hold_until_answers_arrive(r: Any) -> None:
    from dynamic_batching.protocol.results import Outcome
    from dynamic_batching.store.outcomes import OutcomeWriter

    quota = Quota(rate_per_s=1000, burst=1000, max_in_flight=5, tier_share=0.3)
    a, b = "user:1", "user:2"
    first = messages("normal", 3)
    assert request_queues.admit(r, "normal", 10, first, owner=a, quota=quota).accepted
    share = request_queues.admit(r, "normal", 10, messages("normal", 1), owner=a, quota=quota)
    assert (share.accepted, share.refused_by, share.depth) == (False, "share", 3), "3 of a cap of 10 is A's share"
    # Another tier is another share, but the in-flight limit counts every tier.
    assert request_queues.admit(r, "low", 10, messages("low", 2), owner=a, quota=quota).accepted
    assert request_queues.admit(r, "high", 10, messages("high", 1), owner=a, quota=quota).refused_by == "in_flight"
    # Another client is not held back by A.
    assert request_queues.admit(r, "normal", 10, messages("normal", 3), owner=b, quota=quota).accepted
    assert owners.owners_of(r, [first[0][0], "never-submitted"]) == {first[0][0]: a, "never-submitted": None}

    # An answer takes a request out of its owner's in-flight set, and keeps its owner.
    OutcomeWriter(app).write([Outcome(first[0][0], result=[1.0])])
    assert request_queues.admit(r, "normal", 10, messages("normal", 1), owner=a, quota=quota).accepted
    assert owners.owner_of(r, first[0][0]) == a
    uses = {u.owner: u for u in owners.recent_clients(r)}
    assert uses[a].in_flight == {"high": 0, "normal": 3, "low": 2} and sum(uses[b].in_flight.values()) == 3


def test_a_lost_answer_cannot_pin_a_quota_forever(r: Any) -> None:
    quota = Quota(rate_per_s=1000, burst=1000, max_in_flight=2, tier_share=1.0)
    admit = request_queues.admit
    assert admit(r, "normal", 10, messages("normal", 2), owner="u", quota=quota, in_flight_s=30, now=1000.0).accepted
    assert admit(r, "normal", 10, messages("normal", 1), owner="u", quota=quota, now=1029.0).refused_by == "in_flight"
    assert admit(r, "normal", 10, messages("normal", 1), owner="u", quota=quota, now=1031.0).accepted


def test_take_holds_up_to_the_window_oldest_first_and_held_count_toward_the_cap(r: Any, token: str) -> None:
    queued = messages("normal", 5)
    assert request_queues.admit(r, "normal", 5, queued)[0]
    tiers, events, _ = request_queues.take(r, 3, token)
    assert [wire.task_id_of(m) for m in tiers["normal"]] == [t for t, _ in queued[:3]]
    assert tiers["high"] == tiers["low"] == [] and events == []
    assert r.llen(request_queues.WAKE_KEY) == 0
    # Held requests still count: the tier is full.
    assert request_queues.depths(r) == {"high": 0, "normal": 5, "low": 0}
    assert not request_queues.admit(r, "normal", 5, messages("normal", 1))[0]
    # The window is full until something is sent: a second take takes nothing more.
    assert request_queues.take(r, 3, token)[0]["normal"] == []
    assert len(request_queues.held(r)["normal"]) == 3


def test_dispatch_sends_the_batch_and_strikes_its_requests_together(r: Any, token: str) -> None:
    queued = messages("high", 2)
    request_queues.admit(r, "high", 10, queued)
    request_queues.take(r, 10, token)
    batch = wire.task_message(app, BATCH_TASK, "b1", [{"requests": []}], BATCH_QUEUE)
    request_queues.dispatch(r, token, [(BATCH_QUEUE, batch)], [("high", t) for t, _ in queued])
    assert request_queues.held(r)["high"] == []
    assert r.lrange(BATCH_QUEUE, 0, -1) == [batch.encode()]
    assert request_queues.depths(r)["high"] == 0


def test_release_puts_held_requests_back_at_the_head_in_order(r: Any, token: str) -> None:
    first = messages("normal", 3, "first")
    request_queues.admit(r, "normal", 10, first)
    request_queues.take(r, 10, token)
    later = messages("normal", 2, "later")
    request_queues.admit(r, "normal", 10, later)
    request_queues.release(r, [("normal", t) for t, _ in first])
    tiers, _, _ = request_queues.take(r, 10, token)
    assert [wire.task_id_of(m) for m in tiers["normal"]] == [t for t, _ in first + later]


def test_only_a_request_someone_else_removed_from_its_queue_reads_as_purged(r: Any, token: str) -> None:
    queued = messages("normal", 4)
    request_queues.admit(r, "normal", 10, queued)
    request_queues.take(r, 1, token)  # taken: the collector's now
    # Put back, and queued again by the ledger: still waiting, not purged.
    request_queues.release(r, [("normal", queued[0][0])])
    request_queues.republish(r, [("normal", queued[1][0], queued[1][1].encode())])
    assert request_queues.purged(r) == []
    request_queues.take(r, 1, token)
    r.delete(request_queue_name("normal"))  # what `celery purge` does to the list
    high = messages("high", 1)
    request_queues.admit(r, "high", 10, high)
    assert sorted(request_queues.purged(r)) == sorted(("normal", t) for t, _ in queued[1:])
    assert request_queues.purged(r) == [], "each purged request is reported once"
    # A take that did not strike its ids off (a collector from before the queued sets,
    # mid-upgrade) leaves them in the set: held, they are never taken for purged.
    late = messages("normal", 1)
    request_queues.admit(r, "normal", 10, late)
    raw = r.rpop(request_queue_name("normal"))
    r.hset(held_key("normal"), late[0][0], raw)
    assert request_queues.purged(r) == []
    assert not r.sismember(queued_key("normal"), late[0][0])


def test_take_drains_events_oldest_first(r: Any, token: str) -> None:
    with app.producer_or_acquire() as producer:
        from dynamic_batching.protocol.wire import publish_event

        for i in range(3):
            publish_event(producer, {"kind": "done", "batch_id": f"b{i}"}, EVENTS_QUEUE)
    _, events, _ = request_queues.take(r, 10, token)
    assert [wire.body(e)["batch_id"] for e in events] == ["b0", "b1", "b2"]
    assert request_queues.take(r, 10, token)[1] == []


def test_a_message_without_an_id_is_returned_but_never_held(r: Any, token: str) -> None:
    r.lpush(request_queue_name("low"), "not json at all", json.dumps({"headers": {}, "body": "e30="}))
    tiers, _, _ = request_queues.take(r, 10, token)
    assert len(tiers["low"]) == 2
    assert request_queues.held(r)["low"] == []
    with pytest.raises(ValueError, match="not a task message"):
        wire.decode(tiers["low"][0])


def test_one_lease_at_a_time_and_each_holder_gets_a_larger_token(r: Any) -> None:
    first, second = Lease(r, ttl_s=60), Lease(r, ttl_s=60)
    assert first.acquire() and not second.acquire()
    first.renew()
    first_token = epoch_of(first.token)
    first.release()
    assert second.acquire() and epoch_of(second.token) > first_token
    # The lease expires (Redis's clock) unless renewed: then another takes it, and the
    # old holder learns it lost it.
    r.pexpire(COLLECTOR_LEASE_KEY, 1)
    poll_until(lambda: r.exists(COLLECTOR_LEASE_KEY) == 0, "the lease to expire", timeout=2)
    third = Lease(r, ttl_s=60)
    assert third.acquire()
    with pytest.raises(LeaseLost):
        second.renew()


def test_a_collector_without_the_lease_moves_nothing(r: Any, token: str) -> None:
    queued = messages("normal", 3)
    request_queues.admit(r, "normal", 10, queued)
    stale = f"{epoch_of(token) - 1}:an-earlier-holder"  # paused past its lease
    with pytest.raises(LeaseLost):
        request_queues.take(r, 10, stale)
    assert r.llen(request_queue_name("normal")) == 3 and request_queues.held(r)["normal"] == []
    request_queues.take(r, 10, token)
    batch = wire.task_message(app, BATCH_TASK, "b-stale", [{"requests": []}], BATCH_QUEUE)
    with pytest.raises(LeaseLost):
        request_queues.dispatch(r, stale, [(BATCH_QUEUE, batch)], [("normal", t) for t, _ in queued])
    assert r.llen(BATCH_QUEUE) == 0 and len(request_queues.held(r)["normal"]) == 3


def test_finding_13_a_lost_epoch_never_gives_two_collectors_one_token(bare_redis) -> None:  # type: ignore[no-untyped-def]
    # Issue 41, finding 13: a host crash that loses the append-only file's last second
    # can lose the INCR of the epoch; the next collector then got the same token as the
    # one before, and both passed every fence.
    from dynamic_batching.protocol.names import COLLECTOR_EPOCH_KEY, COLLECTOR_LEASE_KEY
    from dynamic_batching.store.lease import Lease, LeaseLost

    r = shared_state.client()
    before = Lease(r, 2.0)
    assert before.acquire()
    # The crash: Redis comes back without the INCR and without the lease key.
    r.decr(COLLECTOR_EPOCH_KEY)
    r.delete(COLLECTOR_LEASE_KEY)
    after = Lease(r, 2.0)
    assert after.acquire()
    assert after.token != before.token
    with pytest.raises(LeaseLost):
        before.renew()
    after.renew()
