"""What Flower sees: request tasks and batch tasks reach their final states in Celery's
event stream (Flower's state is a subclass of the celery.events.state.State used here),
through real device workers on the live system."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from batching_site.celery import app
from tasks.edge.client import details, submit
from tasks.protocol.names import BATCH_TASK, REQUEST_TASK

pytestmark = [pytest.mark.live, pytest.mark.django_db]


@pytest.fixture
def events(live_system) -> Iterator[object]:  # type: ignore[no-untyped-def]
    """Celery's event state, fed by a receiver thread, as Flower keeps it."""
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
        if _state_of(state, probe.id, timeout=1.0) == "SUCCESS":
            break
        assert time.monotonic() < deadline, "the event receiver never received anything"
    yield state
    stop.set()
    for receiver in receivers:
        receiver.should_stop = True  # type: ignore[attr-defined]
    thread.join(timeout=10)
    assert not thread.is_alive(), "the event receiver thread did not stop"


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
    with pytest.raises(Exception, match="PoisonInput"):
        bad.get(timeout=60)

    assert _state_of(events, ok.id, timeout=10, want="SUCCESS") == "SUCCESS"
    assert _state_of(events, bad.id, timeout=10, want="FAILURE") == "FAILURE"
    task = events.tasks[ok.id]
    assert task.name == REQUEST_TASK and task.received and task.started and task.runtime is not None
    # task-sent came from the edge's queuing script, with the queue it went to.
    assert task.sent is not None and task.routing_key == "requests.normal"
    assert task.worker is not None and task.worker.hostname.startswith("gpu-")
    assert "PoisonInput" in events.tasks[bad.id].exception

    batch = events.tasks.get(details(ok)["batch_id"])
    assert batch is not None and batch.name == BATCH_TASK
    assert _state_of(events, batch.uuid, timeout=10, want="SUCCESS") == "SUCCESS"
    assert batch.sent is not None, "the collector's dispatch transaction publishes the batch's task-sent"
