"""Preemption on one device (gpu_workers/preempt.py): while a slow input runs, whether
it is new (cut off, bisected, isolated) or known (the slow lane), requests sent after it
are answered before it ends, by batches run between its layers; it is still answered,
still judged by its own time, and the batches that ran inside it show in Celery's event
stream as ordinary batch tasks."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from systems import running

from batching_site.celery import app
from batching_site.harness import LocalSystem
from dynamic_batching.edge.client import details, submit, submit_many
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.protocol.names import BATCH_TASK

pytestmark = [pytest.mark.live, pytest.mark.django_db]

#: A slow input of about 2 s alone on this device (20x the cost of its 500 words).
SLOW_TEXT = "a pathological input to preempt !slow " + "p " * 500


@pytest.fixture(scope="module")
def one_device() -> Iterator[LocalSystem]:
    with running(
        LocalSystem(
            devices=["cpu:0"],
            preload="synthetic",
            # Preemption lends the device to a batch waiting in the worker's other
            # thread: two threads, as on an accelerator.
            env={"SYNTHETIC_OVERHEAD_S": "0.002", "SYNTHETIC_PER_TOKEN_S": "0.0002", "BATCHING_DEVICE_OVERLAP": "1"},
        ),
        timeout=120,
    ) as system:
        # Warm the device's cost model: preemption starts from what a batch should take.
        for k in range(10):
            for r in submit_many([f"warm {k} {i} " + "w " * (i % 7) for i in range(8)], model="synthetic"):
                r.get(timeout=30)
        yield system


def _answered_while_pending(slow: object, label: str) -> list[object]:
    """Send normal requests one after another until `slow` is answered; the ones that
    were answered while it was still pending."""
    before = []
    deadline = time.monotonic() + 60
    k = 0
    while not slow.ready():  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the slow input was never answered"
        r = submit(f"{label} {k} w w w", model="synthetic")
        value = r.get(timeout=30)
        assert value == synthetic.embed(f"{label} {k} w w w")
        if not slow.ready():  # type: ignore[attr-defined]
            before.append(r)
        k += 1
    return before


def test_requests_sent_during_a_new_slow_input_are_answered_before_it(one_device: LocalSystem) -> None:
    slow = submit(SLOW_TEXT, model="synthetic")
    before = _answered_while_pending(slow, "during the first sighting")
    assert slow.get(timeout=30) == synthetic.embed(SLOW_TEXT)
    d = details(slow)
    assert d["isolated"] is True, json.dumps(d)
    # Without preemption nothing sent after it could finish first: one device, busy.
    assert len(before) >= 5, f"only {len(before)} request(s) answered while the slow input ran"
    assert all(details(r)["device"] == d["device"] for r in before)


def test_a_known_slow_input_in_the_slow_lane_lets_others_run_first(one_device: LocalSystem) -> None:
    seen = threading.Event()
    state = app.events.State()

    def on_event(event: dict[str, object]) -> None:
        state.event(event)
        seen.set()

    stop = threading.Event()

    def receive() -> None:
        with app.connection_for_read() as conn:
            receiver = app.events.Receiver(conn, handlers={"*": on_event})
            for _ in receiver.itercapture(limit=None, timeout=None, wakeup=False):
                if stop.is_set():
                    break

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    # Events sent before the receiver has bound its queue are lost to it: wait for one
    # (a worker's heartbeat). A device worker with two threads (DEVICE_OVERLAP) takes a
    # batch, and sends its task-received, well before it runs it: one taken in that
    # moment showed here as SUCCESS with no name (Flower, connected all along, sees it).
    assert seen.wait(10), "no event reached the receiver"
    # The first test made it known; wait until the collector knows it too.
    deadline = time.monotonic() + 20
    while True:
        slow = submit(SLOW_TEXT.replace("  ", " "), model="synthetic")
        before = _answered_while_pending(slow, "beside the slow lane")
        slow.get(timeout=30)
        if details(slow).get("batch_size") == 1 and details(slow)["isolated"]:
            break
        assert time.monotonic() < deadline, details(slow)
    assert len(before) >= 5, f"only {len(before)} request(s) answered while the slow-lane input ran"
    # The batches that ran inside it reach SUCCESS in the event stream, as Flower sees them.
    batch_ids = {details(r)["batch_id"] for r in before}
    end = time.monotonic() + 10
    while True:
        # A worker with two threads may publish a task's events out of order (its
        # `task-received` after its `task-succeeded`); Flower's state, like this one,
        # merges them.
        states = {b: (state.tasks[b].state, state.tasks[b].name) if b in state.tasks else None for b in batch_ids}
        if all(s == ("SUCCESS", BATCH_TASK) for s in states.values()):
            break
        assert time.monotonic() < end, states
        seen.wait(0.2)
        seen.clear()
    stop.set()
    # Wake the receiver so it sees `stop`.
    submit("wake the receiver", model="synthetic").get(timeout=30)
    thread.join(timeout=10)
