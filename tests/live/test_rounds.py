"""Rounds: batches sent in one collector turn go out as one chord, whose callback records
the round; a lone batch goes out as a plain task and records nothing.

The live test runs its own system, because a round needs several free device slots at
the moment several batches are ready, and that only happens deterministically when a
device joins while requests are waiting: the collector (with two batches ahead per
device) then sees three free slots at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from polling import poll_until

from batching_site.celery import app
from batching_site.harness import LocalSystem
from dynamic_batching.collector import rounds
from dynamic_batching.conf import conf
from dynamic_batching.core.policy import BatchPolicy
from dynamic_batching.edge.client import details, submit, submit_many
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.protocol.names import BATCH_QUEUE, CONTROL_QUEUE, ROUND_TASK, device_queue_name
from dynamic_batching.store import shared_state
from dynamic_batching.store.connection import connect

# --- the pure pieces -------------------------------------------------------------------


def test_summarize_reports_sizes_devices_and_durations() -> None:
    results = [
        {"batch_id": "a", "device": "cpu:0@h", "size": 2, "run_ms": 10.0},
        {"batch_id": "b", "device": "cpu:1@h", "size": 3, "run_ms": 25.5},
    ]
    s = rounds.summarize(results, {"round_id": "r1", "dispatched_at": 100.0}, finished_at=100.04)
    assert s["round_id"] == "r1"
    assert (s["batches"], s["requests"], s["sizes"]) == (2, 5, [2, 3])
    assert s["devices"] == ["cpu:0@h", "cpu:1@h"]
    assert s["run_ms"] == [10.0, 25.5]
    assert s["wall_ms"] == pytest.approx(40.0)
    assert s["skew_ms"] == pytest.approx(15.5)


def test_round_chord_keeps_batch_queues_and_ids_and_is_json() -> None:
    bodies = [{"batch_id": f"b{i}", "model": "synthetic", "requests": []} for i in range(3)]
    queues = [BATCH_QUEUE, BATCH_QUEUE, device_queue_name("cpu:1")]
    c = rounds.round_chord(app, list(zip(bodies, queues, strict=True)), {"round_id": "r", "dispatched_at": 1.0})
    assert [t.options["queue"] for t in c.tasks] == queues
    assert [t.options["task_id"] for t in c.tasks] == ["b0", "b1", "b2"]
    assert c.body.task == ROUND_TASK
    assert c.body.options["queue"] == CONTROL_QUEUE
    # The callback's signature travels in each header message: it must be plain JSON.
    json.dumps(dict(c.body))
    json.dumps([dict(t) for t in c.tasks])


def test_round_done_names_its_queue_over_any_route_of_the_host() -> None:
    # configure() adds no route: a host's catch-all route must not send it elsewhere.
    from celery import Celery

    host = Celery("host", set_as_current=False)
    host.conf.task_routes = {"*": {"queue": "host-default"}}
    body = rounds.round_chord(host, [({"batch_id": "b0"}, BATCH_QUEUE)], {"round_id": "r"}).body
    assert host.amqp.router.route(dict(body.options), ROUND_TASK)["queue"].name == CONTROL_QUEUE


# --- live --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def late_device_system() -> Iterator[LocalSystem]:
    """Redis and the collector only; the test starts the device when it wants."""
    previous = conf.REDIS_URL
    system = LocalSystem(
        devices=["cpu:0"],
        preload="synthetic",
        # Three batches a device, all sent at once (untimed: timed, a batch ahead leaves
        # only as the device is about to free, so one device would see no rounds).
        env={
            "BATCHING_COLLECTOR_BATCHES_AHEAD": "2",
            "BATCHING_COLLECTOR_AHEAD_TIMED": "0",
            "SYNTHETIC_PER_TOKEN_S": "0.0002",
        },
    )
    try:
        system.start_redis()
        system.start_collector()
        assert system.redis_url
        connect(system.redis_url)
        system._wait(lambda: shared_state.read_collector() is not None, "the collector", 60)
        yield system
    finally:
        system.close()
        connect(previous)


def wait_for(predicate, what: str, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    return poll_until(predicate, what, timeout=timeout, interval=0.05)


@pytest.mark.live
def test_batches_sent_together_form_a_recorded_round(late_device_system: LocalSystem) -> None:
    shared_state.publish_policy(BatchPolicy(max_batch_size=2, version=1))
    wait_for(lambda: (shared_state.read_collector() or {}).get("policy_version") == 1, "the policy")
    texts = [f"round request {i} " + "word " * (i % 5) for i in range(20)]
    results = submit_many(texts, model="synthetic")
    # No device yet: the collector holds all twenty.
    wait_for(lambda: (shared_state.read_collector() or {}).get("buffered", {}).get("normal") == 20, "20 buffered")

    late_device_system.start_device("cpu:0")
    assert [r.get(timeout=60) for r in results] == [synthetic.embed(t) for t in texts]

    device = details(results[0])["device"]
    # The collector's heartbeat (every 0.25 s) may lag the answers.
    wait_for(lambda: shared_state.read_collector()["stats"]["dispatched_requests"] == 20, "the collector's stats")
    assert shared_state.read_collector()["stats"]["rounds"] >= 1, late_device_system.logs("collector")[-3000:]
    # Every round the collector sent is recorded by its callback (which runs after the
    # callers already had their answers, so wait for it).
    recorded = wait_for(
        lambda: (r := rounds.recent()) and len(r) == shared_state.read_collector()["stats"]["rounds"] and r,
        "every round recorded",
    )
    first = recorded[-1]
    assert first["batches"] == 3, first
    assert first["sizes"] == [2, 2, 2]
    assert first["devices"] == [device] * 3
    assert len(first["run_ms"]) == 3 and all(ms > 0 for ms in first["run_ms"])
    assert first["wall_ms"] >= max(first["run_ms"])
    for rnd in recorded:
        assert rnd["batches"] >= 2 and sum(rnd["sizes"]) == rnd["requests"]

    # A lone batch is a plain task: no round.
    before = len(rounds.recent())
    stats = shared_state.read_collector()["stats"]
    rounds_before, dispatched = stats["rounds"], stats["dispatched_requests"]
    assert submit("a lone request", model="synthetic").get(timeout=30) == synthetic.embed("a lone request")
    # "No round" is proven only by a heartbeat that counts the lone request's dispatch:
    # the heartbeat lags the answer, and a round would be counted in the same one.
    wait_for(
        lambda: shared_state.read_collector()["stats"]["dispatched_requests"] == dispatched + 1,
        "a heartbeat that has the lone request's dispatch",
    )
    assert shared_state.read_collector()["stats"]["rounds"] == rounds_before
    assert len(rounds.recent()) == before
