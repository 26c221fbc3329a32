"""What Flower sees: request tasks and batch tasks reach their final states in Celery's
event stream (Flower's state is a subclass of the celery.events.state.State used here),
through real device workers on the live system."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from systems import running

from batching_site.celery import app
from batching_site.harness import LocalSystem
from dynamic_batching.edge.client import details, submit, submit_many
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.protocol.names import BATCH_TASK, REQUEST_TASK, SLOW_BATCH_QUEUE, request_queue_name

pytestmark = [pytest.mark.live, pytest.mark.django_db]


@contextmanager
def _event_state(probe_id: Callable[[object], str]) -> Iterator[object]:
    """Celery's event state, fed by a receiver thread, as Flower keeps it. `probe_id`
    names the task of a probe request whose final state proves the receiver listens."""
    state = app.events.State()
    stop = threading.Event()
    receivers: list[object] = []

    def receive() -> None:
        try:
            with app.connection_for_read() as conn:
                receiver = app.events.Receiver(conn, handlers={"*": state.event})
                receivers.append(receiver)
                # Wakes at least once a second to check should_stop.
                for _ in receiver.itercapture(limit=None, timeout=None, wakeup=False):
                    pass
        except Exception:
            if not stop.is_set():
                raise

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    # Redis delivers events by PUBLISH: wait until the receiver has subscribed, proven
    # by an event from a probe request arriving.
    deadline = time.monotonic() + 30
    while True:
        probe = submit("probe for the event receiver", model="synthetic")
        probe.get(timeout=30)
        if _state_of(state, probe_id(probe), timeout=1.0) == "SUCCESS":
            break
        assert time.monotonic() < deadline, "the event receiver never received anything"
    try:
        yield state
    finally:
        stop.set()
        for receiver in receivers:
            receiver.should_stop = True  # type: ignore[attr-defined]
        thread.join(timeout=10)
    assert not thread.is_alive(), "the event receiver thread did not stop"


@pytest.fixture
def events(live_system) -> Iterator[object]:  # type: ignore[no-untyped-def]
    with _event_state(lambda probe: probe.id) as state:  # type: ignore[attr-defined]
        yield state


def _state_of(state, task_id: str, *, timeout: float, want: str | None = None) -> str | None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        task = state.tasks.get(task_id)
        current = task.state if task is not None else None
        if current in ("SUCCESS", "FAILURE") and (want is None or current == want):
            return current
        if time.monotonic() > deadline:
            return current
        time.sleep(0.02)


def test_request_and_batch_tasks_reach_their_final_state_in_the_event_stream(events) -> None:  # type: ignore[no-untyped-def]
    ok = submit("an ordinary request", model="synthetic")
    bad = submit("a poisoned request !fail", model="synthetic")
    ok.get(timeout=60)
    with pytest.raises(synthetic.PoisonInput):
        bad.get(timeout=60)

    assert _state_of(events, ok.id, timeout=10, want="SUCCESS") == "SUCCESS"
    assert _state_of(events, bad.id, timeout=10, want="FAILURE") == "FAILURE"
    task = events.tasks[ok.id]
    assert task.name == REQUEST_TASK and task.runtime is not None
    # One event per answered request carries its received and started times too: when
    # its batch was dispatched and when the device started it.
    timeline = details(ok)
    assert (task.received, task.started) == (timeline["dispatched_at"], timeline["started_at"])
    # task-sent came from the edge's queuing script, with the queue it went to.
    assert task.sent is not None and task.routing_key == request_queue_name("normal")
    assert task.worker is not None and task.worker.hostname.startswith("gpu-")
    assert "PoisonInput" in events.tasks[bad.id].exception

    batch = events.tasks.get(details(ok)["batch_id"])
    assert batch is not None and batch.name == BATCH_TASK
    assert _state_of(events, batch.uuid, timeout=10, want="SUCCESS") == "SUCCESS"
    assert batch.sent is not None, "the collector's dispatch transaction publishes the batch's task-sent"


def test_slow_lane_batches_show_in_flower_under_their_own_queue(events) -> None:  # type: ignore[no-untyped-def]
    # Warm the devices' cost models, then let a slow input be found among batch-mates.
    # Enough batches on each device to pass the cost model's warm-up.
    for round_ in range(8):
        for r in submit_many([f"warm the lane {round_} {i} " + "w " * (i % 7) for i in range(40)], model="synthetic"):
            r.get(timeout=60)
    slow_text = "a pathological input for the lane !slow " + "y " * 120
    found = submit_many([*(f"a mate {i} w w" for i in range(15)), slow_text], model="synthetic")
    for r in found:
        r.get(timeout=60)
    assert details(found[-1])["isolated"], json.dumps(details(found[-1]))
    # Sent again, it waits in the slow lane and runs as a slow-lane batch.
    deadline = time.monotonic() + 20
    while True:
        again = submit(slow_text, model="synthetic")
        again.get(timeout=60)
        batch_id = details(again)["batch_id"]
        if _state_of(events, batch_id, timeout=5, want="SUCCESS") == "SUCCESS":
            task = events.tasks[batch_id]
            if task.routing_key == SLOW_BATCH_QUEUE:
                break
        assert time.monotonic() < deadline, (details(again), events.tasks.get(batch_id))
    assert task.name == BATCH_TASK and "slow lane" in (task.args or ""), task.args
    assert details(again)["isolated"] and details(again)["batch_size"] == 1


@pytest.fixture
def request_events_off(batching_settings) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """A system started with BATCHING_REQUEST_EVENTS=0, and this process submitting with it too."""
    batching_settings(REQUEST_EVENTS=False)
    system = LocalSystem(
        devices=["cpu:0"], preload="synthetic", env={"TORCH_THREADS": "1", "BATCHING_REQUEST_EVENTS": "0"}
    )
    with running(system, timeout=120):
        yield


def test_with_request_events_off_flower_sees_the_batch_tasks_only(request_events_off) -> None:  # type: ignore[no-untyped-def]
    with _event_state(lambda probe: details(probe)["batch_id"]) as state:
        ok = submit("an ordinary request", model="synthetic")
        bad = submit("a poisoned request !fail", model="synthetic")
        ok.get(timeout=60)
        with pytest.raises(synthetic.PoisonInput):
            bad.get(timeout=60)
        # The device publishes its requests' events before its batch task returns, and
        # the edge before anything: once their batches have succeeded, any would be in.
        for batch_id in {details(ok)["batch_id"], details(bad)["batch_id"]}:
            assert _state_of(state, batch_id, timeout=10, want="SUCCESS") == "SUCCESS"
            assert state.tasks[batch_id].sent is not None, "batches keep their task-sent"
        requests = [t for t in state.tasks.values() if t.name == REQUEST_TASK]
        assert not requests and ok.id not in state.tasks and bad.id not in state.tasks
