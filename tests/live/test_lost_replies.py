"""Issue 41, finding 3: the shared Redis client retries a command whose connection was
lost, so a script whose reply was lost after Redis ran it runs twice. Each script with
side effects must come out the same run once or twice. The fault is injected: a TCP
proxy between this process and Redis loses the reply to one script call
(tests/faults.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from faults import LosingProxy, losing_proxy

from dynamic_batching.edge.client import submit, submit_many
from dynamic_batching.protocol import wire
from dynamic_batching.protocol.names import (
    COLLECTOR_LEASE_KEY,
    LEDGER_KEY,
    held_key,
    redeliveries_key,
    request_queue_name,
)
from dynamic_batching.store import deliveries, request_queues, shared_state
from dynamic_batching.store.connection import connect

pytestmark = pytest.mark.live


@pytest.fixture
def proxy(bare_redis) -> Iterator[LosingProxy]:  # type: ignore[no-untyped-def]
    """This process talks to the bare Redis through a proxy that can lose a reply."""
    with losing_proxy(bare_redis.redis_url) as p:
        connect(p.url())
        try:
            yield p
        finally:
            connect(bare_redis.redis_url)


def test_finding_3_an_admission_whose_reply_was_lost_is_queued_once(bare_redis, proxy: LosingProxy) -> None:  # type: ignore[no-untyped-def]
    direct = redis.Redis.from_url(bare_redis.redis_url)
    submit("loads the scripts", model="synthetic")
    proxy.lose_reply_to(request_queues._ADMIT_SCRIPT.sha.encode())
    result = submit("admitted once", model="synthetic")
    assert proxy.lost == 1, "the fault did not land"
    queued = [wire.task_id_of(raw) for raw in direct.lrange(request_queue_name("normal"), 0, -1)]
    assert queued.count(result.id) == 1, f"queued {queued.count(result.id)} times"
    assert direct.zscore(LEDGER_KEY, result.id) is not None


def test_finding_3_a_dispatch_whose_reply_was_lost_pushes_its_batch_once(bare_redis, proxy: LosingProxy) -> None:  # type: ignore[no-untyped-def]
    direct = redis.Redis.from_url(bare_redis.redis_url)
    direct.set(COLLECTOR_LEASE_KEY, "7")  # this test is the active collector
    direct.hset(held_key("normal"), "r1", b"its message")
    queue = "batching.test.dispatch"
    request_queues.dispatch(shared_state.client(), "7", [], [])  # loads the script (a first EVALSHA is refused)
    proxy.lose_reply_to(request_queues._DISPATCH_SCRIPT.sha.encode())
    request_queues.dispatch(shared_state.client(), "7", [(queue, "batch message")], [("normal", "r1")])
    assert proxy.lost == 1, "the fault did not land"
    assert direct.lrange(queue, 0, -1) == [b"batch message"]
    assert direct.hexists(held_key("normal"), "r1") == 0


def test_finding_3_a_redelivery_whose_reply_was_lost_counts_once(bare_redis, proxy: LosingProxy) -> None:  # type: ignore[no-untyped-def]
    assert deliveries.count(shared_state.client(), "came-back") == 1
    proxy.lose_reply_to(redeliveries_key("came-back").encode())
    # The second redelivery: its count must read 2, not 3 (a third would end its lone
    # input as WorkerCrashed before POISON_REDELIVERIES redeliveries).
    assert deliveries.count(shared_state.client(), "came-back") == 2
    assert proxy.lost == 1, "the fault did not land"


def test_finding_1_a_take_whose_reply_was_lost_strands_nothing() -> None:
    # Issue 41, finding 1: the collector's take moved requests to its held hash, the
    # reply was lost, and the client ran the script again: the first run's requests sat
    # in the held hash, never sent and counted against the window, until someone
    # restarted the collector. Here every process of the system talks to Redis through
    # the proxy, and the collector's next take loses its reply.
    import signal

    from systems import running

    from batching_site.harness import LocalSystem
    from dynamic_batching.gpu_workers.models import synthetic

    base = LocalSystem(devices=[])
    try:
        base.start_redis()
        with (
            losing_proxy(base.redis_url) as p,
            # A long lease: the stop below must never hand the lease to the standby,
            # whose start-up adoption would hide the finding even on a loaded machine.
            running(
                LocalSystem(redis_url=p.url(), devices=["cpu:0"], env={"BATCHING_COLLECTOR_LEASE_S": "30"})
            ) as system,
        ):
            # One collector: a standby taking over would adopt the held requests at its
            # start, and hide the finding.
            beat = shared_state.read_collector() or {}
            active = next(name for name, pid in system.pids().items() if pid == beat.get("pid"))
            for name in system.pids():
                if name.startswith("collector") and name != active:
                    system.stop(name)
            # Stopped for a moment (well under its lease), so that its next take is
            # the one that takes these requests.
            system.kill(active, signal.SIGSTOP)
            try:
                texts = [f"finding 1, request {i}" for i in range(4)]
                results = submit_many(texts, model="synthetic")
                p.lose_reply_to(request_queues._TAKE_SCRIPT.sha.encode())
            finally:
                system.kill(active, signal.SIGCONT)
            for text, result in zip(texts, results, strict=True):
                assert result.get(timeout=30) == synthetic.embed(text)
            assert p.lost == 1, "the fault did not land"
            now = shared_state.read_collector() or {}
            assert now.get("pid") == beat.get("pid"), "another collector took over: the test proves nothing"
            assert now.get("stats", {}).get("adopted", 0) >= 1
    finally:
        base.close()
