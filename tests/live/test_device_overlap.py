"""Two batches in one device worker (DEVICE_OVERLAP): one prepares, or writes its
answers, while the other holds the device, and only one ever runs on it; a worker that
hangs hands back both, the hung one counted and the one that only waited not. Each test
drives a device runner on a Redis of its own (`bare_runner`) from two threads, as the
worker's two pool threads do; the model's run waits on the test's events."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from batches import batch_of
from celery.result import AsyncResult
from polling import poll_until

from batching_site.celery import app
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.gpu_workers.models.base import BatchRunner
from dynamic_batching.gpu_workers.runner import DeviceRunner
from dynamic_batching.protocol import wire
from dynamic_batching.protocol.names import BATCH_QUEUE
from dynamic_batching.store import shared_state

T = 10.0


class Gated(BatchRunner):
    """The synthetic model's answers; each run records itself and waits for the
    test's go, under the device lock."""

    def __init__(self) -> None:
        self.device = "cpu:7"
        self.device_lock = threading.RLock()
        self.log: list[str] = []
        self.running = threading.Event()
        self.go = threading.Event()
        self.prepared: list[list[str]] = []

    def prepare(self, inputs: Sequence[Any]) -> None:
        self.prepared.append(list(inputs))
        self.log.append(f"prepare {inputs[0]}")

    def run_batch(self, inputs: Sequence[Any]) -> list[Any]:
        with self.device_lock:
            self.log.append(f"run {inputs[0]}")
            self.running.set()
            assert self.go.wait(T)
            self.log.append(f"ran {inputs[0]}")
        return [synthetic.embed(t) for t in inputs]

    def close(self) -> None:
        pass


def _install(runner: DeviceRunner, model: Gated) -> None:
    model.device_lock = runner._device  # as DeviceRunner.model does for a model it loads
    runner._models["synthetic"] = model


def test_the_next_batch_prepares_while_one_runs_and_waits_for_the_device(bare_runner: DeviceRunner) -> None:
    model = Gated()
    _install(bare_runner, model)
    first, second = batch_of(["first a", "first b"]), batch_of(["second a"])
    done: dict[str, Any] = {}
    t1 = threading.Thread(target=lambda: done.update(first=bare_runner.execute(first)))
    t1.start()
    assert model.running.wait(T)
    t2 = threading.Thread(target=lambda: done.update(second=bare_runner.execute(second)))
    t2.start()
    # The second batch's host work happens while the first holds the device...
    poll_until(lambda: "prepare second a" in model.log, "the second batch prepared", timeout=T)
    assert bare_runner._device.wanted
    assert "run second a" not in model.log
    model.go.set()
    t1.join(T)
    t2.join(T)
    # ...and it runs only once the first is off the device: one batch at a time.
    assert model.log == [
        "prepare first a",
        "run first a",
        "prepare second a",
        "ran first a",
        "run second a",
        "ran second a",
    ]
    assert done["first"]["written"] == 2 and done["second"]["written"] == 1
    for batch in (first, second):
        for r in batch["requests"]:
            assert AsyncResult(r["id"], app=app).get(timeout=5) == synthetic.embed(r["input"])


def test_a_hung_worker_hands_back_the_hung_batch_counted_and_the_waiting_one_as_it_was(
    bare_runner: DeviceRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Gated()
    _install(bare_runner, model)
    killed: list[bool] = []
    monkeypatch.setattr(bare_runner, "_die", lambda: killed.append(True))
    stopped: list[bool] = []
    bare_runner.stop_taking = lambda: stopped.append(True)
    hung, waiting = batch_of(["hung a", "hung b"]), batch_of(["waiting a"])
    threads = [
        threading.Thread(target=bare_runner.execute, args=(b,), kwargs={"task_id": b["batch_id"]}, daemon=True)
        for b in (hung, waiting)
    ]
    threads[0].start()
    assert model.running.wait(T)
    threads[1].start()
    poll_until(lambda: bare_runner._device.wanted, "a batch waiting for the device", timeout=T)

    bare_runner._hung()  # what the watchdog's thread calls

    assert stopped == [True] and len(killed) == 1
    raws = shared_state.client().lrange(BATCH_QUEUE, 0, -1)
    back = {b["batch_id"]: b for b in (wire.body(raw)[0][0] for raw in raws)}
    assert set(back) == {f"{hung['batch_id']}.h", f"{waiting['batch_id']}.w"}
    counted, as_it_was = back[f"{hung['batch_id']}.h"], back[f"{waiting['batch_id']}.w"]
    assert (counted["came_back"], counted["handed_back"]) == (True, 1)
    assert (as_it_was["came_back"], as_it_was["handed_back"]) == (False, 0)
    assert [r["id"] for r in as_it_was["requests"]] == [r["id"] for r in waiting["requests"]]
    model.go.set()  # let the threads finish (their answers are first answers still)
    for t in threads:
        t.join(T)


def test_a_hung_worker_hands_back_to_another_live_devices_own_queue(
    bare_runner: DeviceRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On the shared queue, its own consumer (idle in its other thread) could take the
    # copy back in the moment before it dies.
    from dynamic_batching.protocol.names import device_queue_name
    from dynamic_batching.store import clock

    shared_state.device_heartbeat("cpu:8@elsewhere", {"device": "cpu:8", "circuit": "closed", "at": clock.now()})
    shared_state.device_heartbeat("cpu:9@elsewhere", {"device": "cpu:9", "circuit": "open", "at": clock.now()})
    model = Gated()
    _install(bare_runner, model)
    monkeypatch.setattr(bare_runner, "_die", lambda: None)
    hung = batch_of(["hung alone"])
    thread = threading.Thread(target=bare_runner.execute, args=(hung,), daemon=True)
    thread.start()
    assert model.running.wait(T)
    bare_runner._hung()
    r = shared_state.client()
    assert r.llen(BATCH_QUEUE) == 0 and r.llen(device_queue_name("cpu:9")) == 0
    raws = r.lrange(device_queue_name("cpu:8"), 0, -1)
    assert [wire.body(raw)[0][0]["batch_id"] for raw in raws] == [f"{hung['batch_id']}.h"]
    model.go.set()
    thread.join(T)
