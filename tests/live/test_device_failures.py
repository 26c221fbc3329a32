"""Every failure path in a device ends in an answer or a counted redelivery: no batch is
acked with a caller unanswered. Each test hands a batch straight to a device runner
on a Redis of its own (`bare_runner`)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from batches import batch_of
from celery.result import AsyncResult
from kombu import Queue

from batching_site.celery import app
from dynamic_batching.collector import housekeeping
from dynamic_batching.conf import conf
from dynamic_batching.core.errors import ModelUnavailable, WorkerCrashed
from dynamic_batching.core.slots import Slots
from dynamic_batching.gpu_workers import resend
from dynamic_batching.gpu_workers import runner as runner_module
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.gpu_workers.runner import DeviceRunner
from dynamic_batching.gpu_workers.taken import Taken
from dynamic_batching.gpu_workers.task import run_batch
from dynamic_batching.protocol import wire
from dynamic_batching.protocol.app import transport_options
from dynamic_batching.protocol.names import BATCH_QUEUE, UNACKED_KEY, redeliveries_key
from dynamic_batching.store import deliveries, ledger, shared_state


def outcome(request: dict[str, Any]) -> AsyncResult:
    return AsyncResult(str(request["id"]), app=app)


def queued_batches() -> list[dict[str, Any]]:
    """The batch bodies waiting in the shared queue, oldest first."""
    raws = shared_state.client().lrange(BATCH_QUEUE, 0, -1)
    return [wire.body(raw)[0][0] for raw in reversed(raws)]


class Unloadable:
    def load(self, device: str) -> Any:
        raise FileNotFoundError("no weights at /models/custom/model.safetensors")


def test_a_model_that_cannot_load_answers_each_request_naming_model_and_device(
    bare_runner: DeviceRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_module, "get_spec", lambda name: Unloadable())
    batch = batch_of(["one", "two", "three"])
    summary = bare_runner.execute(batch)
    assert summary["written"] == 3
    for req in batch["requests"]:
        with pytest.raises(ModelUnavailable) as err:
            outcome(req).get(timeout=5)
        message = str(err.value)
        assert "'synthetic'" in message and bare_runner.device_id in message and "no weights at" in message
    # Not the device's fault: its circuit stays closed.
    assert bare_runner.health.breaker.failures == 0


class SlowToLoad:
    """The synthetic model, with a first load that takes longer than a batch may run."""

    LOAD_S = 0.6

    def load(self, device: str) -> Any:
        time.sleep(self.LOAD_S)
        return synthetic.SyntheticSpec().load(device)


def test_finding_4_a_models_first_load_is_never_charged_to_its_batch(
    bare_runner: DeviceRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 41, finding 4: the batch's time bound started before its model loaded, so a
    # load plus run over BATCH_HARD_LIMIT_S handed the batch back on every device, and
    # the third answered an innocent request WorkerCrashed without running it.

    monkeypatch.setattr(runner_module, "get_spec", lambda name: SlowToLoad())
    batch = batch_of(["waits for its model to load"])
    with conf.override(BATCH_HARD_LIMIT_S=SlowToLoad.LOAD_S / 3):
        summary = bare_runner.execute(batch)
    assert summary["written"] == 1, summary
    [req] = batch["requests"]
    assert outcome(req).get(timeout=5) == synthetic.embed(req["input"])


def test_a_batch_that_comes_back_is_split_in_halves_and_nobody_is_answered_yet(bare_runner: DeviceRunner) -> None:
    batch = batch_of([f"text {i}" for i in range(7)])
    summary = bare_runner.execute(batch, redelivered=True, task_id=batch["batch_id"])
    assert summary["split"] == [3, 4] and summary["redeliveries"] == 1
    halves = queued_batches()
    assert [[r["id"] for r in h["requests"]] for h in halves] == [
        [r["id"] for r in batch["requests"][:3]],
        [r["id"] for r in batch["requests"][3:]],
    ]
    assert [h["batch_id"] for h in halves] == [f"{batch['batch_id']}.a", f"{batch['batch_id']}.b"]
    assert halves[0]["padded_tokens"] == 3 * max(r["tokens"] for r in batch["requests"][:3])
    assert all(outcome(r).state == "PENDING" for r in batch["requests"])


def test_a_lone_request_that_came_back_once_runs_again(bare_runner: DeviceRunner) -> None:
    batch = batch_of(["alone"])
    bare_runner.execute(batch, redelivered=True, task_id="lone-once")
    assert outcome(batch["requests"][0]).get(timeout=5) == synthetic.embed("alone")


def test_a_lone_request_that_keeps_coming_back_gets_its_own_error(bare_runner: DeviceRunner) -> None:
    batch = batch_of(["kills its worker"])
    # It came back once already, and its worker died again while it ran.
    deliveries.count(shared_state.client(), "lone-twice")
    deliveries.trying(shared_state.client(), "lone-twice", "its-second-run")
    summary = bare_runner.execute(batch, redelivered=True, task_id="lone-twice")
    assert summary["written"] == 1 and summary["redeliveries"] == 2
    with pytest.raises(WorkerCrashed, match=f"2 times running this input alone \\(last on {bare_runner.device_id}"):
        outcome(batch["requests"][0]).get(timeout=5)
    assert shared_state.client().ttl(redeliveries_key("lone-twice")) > 0, "the counter expires"


def test_a_redelivered_batch_already_answered_is_still_counted(bare_runner: DeviceRunner) -> None:
    # A worker killed after it answered every request but before its ack leaves the
    # message unacked; it comes back redelivered with nothing to do. That redelivery
    # happened and is counted like any other (the device-kill chaos test looks for it).
    batch = batch_of(["answered before the kill"])
    bare_runner.execute(batch)
    summary = bare_runner.execute(batch, redelivered=True, task_id="answered-then-killed")
    assert summary["redeliveries"] == 1 and summary["written"] == 0, summary
    assert shared_state.client().scard(redeliveries_key("answered-then-killed")) == 1


def test_a_batch_that_ran_out_of_borrowed_time_goes_back_without_counting_against_it(
    bare_runner: DeviceRunner,
) -> None:
    # Inside another batch (preemption), a batch has only what that one lends. On a busy
    # host every batch runs long and lends, and a lone innocent input handed back twice
    # that way was answered "came back 2 times alone". Now it goes back as it came.
    lonely = batch_of(["innocent, run inside another batch"])
    lonely["handed_back"] = 1
    bare_runner.preempt._untils.append(time.monotonic() - 1.0)  # nothing left to lend
    try:
        summary = bare_runner.execute(lonely)
    finally:
        bare_runner.preempt._untils.pop()
    assert summary["handed_back"] == 1 and summary["written"] == 0
    (back,) = queued_batches()
    assert back["requests"] == lonely["requests"]
    assert back["handed_back"] == 1 and not back["came_back"]
    # On its own bound it runs and is answered.
    assert bare_runner.execute(back)["written"] == 1
    assert outcome(lonely["requests"][0]).get(timeout=5) == synthetic.embed(lonely["requests"][0]["input"])


def test_no_batch_starts_inside_another_with_less_than_a_second_to_run(
    bare_runner: DeviceRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    preempt = bare_runner.preempt
    taken: list[float] = []

    def take() -> object:
        taken.append(time.monotonic())
        return None  # nothing waiting: only whether it looked matters

    monkeypatch.setattr(preempt, "_take", take)
    with preempt.armed("outer", yield_after_s=0.0):
        preempt.between_steps()
        assert len(taken) == 1  # a long batch with time to lend looks for waiting work
        # The same batch, now running inside another with half a second of its bound left.
        preempt._untils.append(time.monotonic() + 0.5)
        try:
            preempt._running[-1].next_poll = 0.0
            preempt.between_steps()
        finally:
            preempt._untils.pop()
    assert len(taken) == 1, "a batch was started with less than MIN_NESTED_S to run"


def test_a_batch_whose_answers_cannot_be_written_is_handed_back_not_acked(
    bare_runner: DeviceRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Through the broker: the batch message is taken unacked from the shared queue, as a
    # device's consumer takes it, and run through Celery's tracer (the worker's own
    # path for a batch run between another's layers, gpu_workers/preempt.py).
    def broken_write(*args: object, **kwargs: object) -> int:
        raise redis.ConnectionError("Redis went away while writing the answers")

    monkeypatch.setattr(bare_runner._outcomes, "write", broken_write)
    batch = batch_of(["one", "two"])
    resend.resend(app, batch, "unwritable")
    runner_module.install(bare_runner)
    try:
        with app.connection_for_read(transport_options=transport_options()) as conn:
            message = Queue(BATCH_QUEUE).bind(conn.default_channel).get(no_ack=False)
            assert message is not None
            bare_runner.preempt._run(message)
    finally:
        runner_module.install(None)
    # Celery's Reject with requeue: the broker has the message back, marked redelivered,
    # and nothing of it is left unacked.
    r = shared_state.client()
    [raw] = r.lrange(BATCH_QUEUE, 0, -1)
    assert wire.body(raw)[0][0]["batch_id"] == batch["batch_id"]
    assert json.loads(raw)["properties"]["delivery_info"]["redelivered"] is True
    assert r.hlen(UNACKED_KEY) == 0
    assert not any(outcome(req).ready() for req in batch["requests"]), "nobody is answered"


def test_a_malformed_batch_is_dropped_not_handed_back_forever(bare_runner: DeviceRunner) -> None:
    runner_module.install(bare_runner)
    try:
        for body in ({"requests": "nope"}, ["not", "a", "dict"], {"batch_id": "b", "model": "m", "requests": [1]}):
            result = run_batch.apply(args=[body])
            assert result.state == "SUCCESS" and result.result == {"malformed": True}, json.dumps(body)
    finally:
        runner_module.install(None)


def test_a_killed_workers_batch_goes_back_when_a_worker_starts_under_its_device_id(bare_runner: DeviceRunner) -> None:
    # A worker takes a batch message unacked, notes it, and dies (kill -9: no ack, no
    # channel close). Its successor under the same device id hands it back at start,
    # marked redelivered as the visibility timeout would, without waiting for it.
    batch = batch_of(["one", "two"])
    resend.resend(app, batch, batch["batch_id"])
    released = batch_of(["answered"])
    resend.resend(app, released, released["batch_id"])
    holder = "cpu:9@a-host"
    # As a device worker's consumer takes them: under batching's own unacked keys.
    with app.connection_for_read(transport_options=transport_options()) as conn:
        queue = Queue(BATCH_QUEUE).bind(conn.default_channel)
        held, done = queue.get(no_ack=False), queue.get(no_ack=False)
        dead = Taken(app, holder)
        dead.took(batch["batch_id"], held.delivery_tag)
        dead.took(released["batch_id"], done.delivery_tag)
        dead.finished(released["batch_id"])  # answered before it died: not handed back
        assert queued_batches() == []

        assert Taken(app, holder).reclaim() == 1
        [raw] = shared_state.client().lrange(BATCH_QUEUE, 0, -1)
        assert wire.body(raw)[0][0]["batch_id"] == batch["batch_id"]
        assert json.loads(raw)["properties"]["delivery_info"]["redelivered"] is True
        # Another worker's notes, and a second start, hand back nothing.
        assert Taken(app, "cpu:9@another-host").reclaim() == 0
        assert Taken(app, holder).reclaim() == 0


def test_a_lone_request_held_beside_the_batch_that_killed_its_worker_is_never_answered_worker_crashed(
    bare_runner: DeviceRunner,
) -> None:
    # Issue 40: with DEVICE_OVERLAP a worker holds two batches, and an input that kills it
    # kills the batch beside it too (waiting for the device, or writing its answers after
    # its run). Each redelivery counted, an innocent lone request that twice shared a
    # worker with a crashing one was answered WorkerCrashed. Only a worker that dies
    # while it is on the device counts against it.
    batch = batch_of(["innocent, alone"])
    r = shared_state.client()
    deliveries.count(r, "held-beside")  # held while another killed its worker
    deliveries.trying(r, "held-beside", "its-run")
    deliveries.tried(r, "held-beside", "its-run")  # ran, then its worker died on the next batch
    deliveries.count(r, "held-beside")
    summary = bare_runner.execute(batch, redelivered=True, task_id="held-beside")
    assert summary["written"] == 1 and "split" not in summary, summary
    [req] = batch["requests"]
    assert outcome(req).get(timeout=5) == synthetic.embed(req["input"])


def test_a_request_whose_worker_keeps_dying_after_its_run_is_answered_at_last(bare_runner: DeviceRunner) -> None:
    # The backstop: a worker that dies on a batch's answers (an output too big to encode
    # in memory) never counts a try against it; every HELD_PER_TRY redeliveries count one.
    batch = batch_of(["its answer kills the worker"])
    for _ in range(runner_module.HELD_PER_TRY * conf.POISON_REDELIVERIES - 1):
        deliveries.count(shared_state.client(), "dies-after")
    summary = bare_runner.execute(batch, redelivered=True, task_id="dies-after")
    assert summary["written"] == 1 and summary["redeliveries"] == conf.POISON_REDELIVERIES, summary
    with pytest.raises(WorkerCrashed):
        outcome(batch["requests"][0]).get(timeout=5)


def test_a_batch_that_came_back_is_counted_on_the_device_while_it_runs(bare_runner: DeviceRunner) -> None:
    batch = batch_of(["came back"])
    seen: list[int] = []
    run = bare_runner.model("synthetic").run_batch

    def noting(inputs: list[Any]) -> list[Any]:
        seen.append(deliveries.tries(shared_state.client(), "counted-first"))
        return run(inputs)

    bare_runner.model("synthetic").run_batch = noting  # type: ignore[method-assign]
    bare_runner.execute(batch, redelivered=True, task_id="counted-first")
    assert seen == [1], "a crash in the run must find this try counted"
    assert deliveries.tries(shared_state.client(), "counted-first") == 0, "withdrawn once the run ended"
    # A first delivery costs nothing of the kind.
    bare_runner.execute(batch_of(["first"]), task_id="first-delivery")
    assert deliveries.tries(shared_state.client(), "first-delivery") == 0


def test_a_batch_popped_by_a_device_that_died_before_recording_it_is_found_nowhere(bare_runner: DeviceRunner) -> None:
    # kombu pops a message (BRPOP) and records it unacked in a second command; a device
    # killed between the two takes the batch with it. The collector tells that batch
    # from one still queued or held, and makes its requests overdue in the ledger.
    r = shared_state.client()
    held, popped, waiting = (batch_of([text]) for text in ("held", "popped", "waiting"))
    for b in (held, popped, waiting):
        resend.resend(app, b, b["batch_id"])
    # As a device worker's consumer takes it: under batching's own unacked keys.
    with app.connection_for_read(transport_options=transport_options()) as conn:
        assert Queue(BATCH_QUEUE).bind(conn.default_channel).get(no_ack=False) is not None  # held, unacked
        r.rpop(BATCH_QUEUE)  # popped, and its device died
        ids = [b["batch_id"] for b in (held, popped, waiting)]
        assert deliveries.nowhere(r, ids, [BATCH_QUEUE]) == [popped["batch_id"]]

    lost_id = popped["requests"][0]["id"]
    r.zadd(ledger.LEDGER_KEY, {lost_id: 1e12})
    ledger.touch(r, [lost_id, "never-accepted"], 0.0)
    assert r.zscore(ledger.LEDGER_KEY, lost_id) == 0.0, "overdue at the next sweep"
    assert r.zscore(ledger.LEDGER_KEY, "never-accepted") is None, "only entries still in the ledger"


def test_the_collector_sends_the_requests_of_a_vanished_batch_back_at_once(bare_runner: DeviceRunner) -> None:
    r = shared_state.client()
    lost = batch_of(["lost with its device"])
    request_id = lost["requests"][0]["id"]
    r.zadd(ledger.LEDGER_KEY, {request_id: 1e12})
    slots = Slots(clock=lambda: 0.0)
    slots.sent(lost["batch_id"], 10, requests=[request_id])
    collector = SimpleNamespace(outbox=SimpleNamespace(device_names=[]), slots=slots, next_sweep=5.0)
    housekeeping.recover_vanished(collector, r, [lost["batch_id"]])  # type: ignore[arg-type]
    assert r.zscore(ledger.LEDGER_KEY, request_id) == 0.0
    assert collector.next_sweep == 0.0 and slots.requests == {}, "swept now, and forgotten"


def test_finding_8_a_batch_handed_back_restarts_its_requests_ledger_clock(bare_runner: DeviceRunner) -> None:
    # Issue 41, finding 8: hand-backs, bounces and splits published new messages without
    # touching the ledger, so a long bisection passed LEDGER_GRACE_S and the sweep queued
    # the batch-mates and the slow input again mid-search.
    r = shared_state.client()
    batch = batch_of(["one", "two", "three"])
    ids = [req["id"] for req in batch["requests"]]
    r.zadd(ledger.LEDGER_KEY, dict.fromkeys(ids, 1.0))  # accepted long ago
    bare_runner._hand_back(batch, batch["requests"][:2], "r", "its batch used up its time bound")
    bare_runner.health.bounce({**batch, "requests": batch["requests"][2:]})
    assert all(r.zscore(ledger.LEDGER_KEY, i) > time.time() - 60 for i in ids), "the ledger still saw them as lost"


def test_finding_6_a_worker_restarted_under_a_device_id_never_takes_back_a_live_devices_batch(
    bare_runner: DeviceRunner,
) -> None:
    # Issue 41, finding 6: kombu keeps a message's delivery tag for life. A worker took a
    # batch and died; the visibility timeout handed the batch to another, live device,
    # under the same tag. The dead worker's successor then restored that tag and pulled
    # the batch out from under the live device: it ran on two.
    batch = batch_of(["taken twice, run once"])
    resend.resend(app, batch, batch["batch_id"])
    r = shared_state.client()
    with app.connection_for_read(transport_options=transport_options()) as conn:
        queue = Queue(BATCH_QUEUE).bind(conn.default_channel)
        first = queue.get(no_ack=False)
        Taken(app, "cpu:9@a-host").took(batch["batch_id"], first.delivery_tag)  # then kill -9
        # The visibility timeout hands it out again (a restore), a live device takes it.
        conn.default_channel.qos.restore_by_tag(first.delivery_tag)
        second = queue.get(no_ack=False)
        assert second.delivery_tag == first.delivery_tag, "kombu gave it a new tag: the finding's premise changed"
        assert Taken(app, "cpu:9@a-host").reclaim() == 0
        assert queued_batches() == [], "the successor took the batch back from the live device"
        assert r.hexists(UNACKED_KEY, first.delivery_tag), "the live device holds it still"
