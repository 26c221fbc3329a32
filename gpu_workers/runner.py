"""One device's runner: owns the models loaded on that device and runs batches on them.

A device worker creates exactly one `DeviceRunner` when it starts (gpu_workers/step.py)
and closes it when it stops. For each batch it:

1. skips requests that already have an outcome (in a batch the broker redelivered or a
   device bounced) and fails those past their deadline (they must never run late);
2. runs the rest through the bisector (gpu_workers/bisection.py), so only inputs that
   fail on their own fail, and inputs too slow to share a batch run alone;
3. writes every request's own outcome under its own task id and tells the collector
   the device is free again, in one round trip.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery import Celery

from dynamic_batching import metrics
from dynamic_batching.conf import conf
from dynamic_batching.core.errors import DeadlineExceeded, ModelUnavailable, WorkerCrashed
from dynamic_batching.core.slowness import confirms_slow, fingerprint
from dynamic_batching.protocol import events as flower_events
from dynamic_batching.protocol import wire
from dynamic_batching.protocol.names import EVENTS_QUEUE, device_queue_name
from dynamic_batching.protocol.results import Outcome
from dynamic_batching.store import clock, deliveries, shared_state
from dynamic_batching.store.outcomes import OutcomeWriter

from . import resend
from .bisection import SLOW, UNRUN, Bisector
from .device_lock import DeviceLock
from .health import DeviceHealth
from .models import get_spec
from .models.base import BatchRunner
from .preempt import Preemption
from .taken import Taken
from .watchdog import Watchdog

log = logging.getLogger(__name__)


@dataclass
class _Ran:
    """A batch after its run, before its answers are written (DeviceRunner._answer)."""

    live: list[dict[str, Any]]
    borrowed: bool
    run_s: float = 0.0
    base: dict[str, Any] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)
    #: Outcomes left to write after the run.
    to_write: list[Outcome] = field(default_factory=list)
    #: Requests answered while their batch was still being searched for a slow input.
    early: set[str] = field(default_factory=set)
    #: How many answers written were new.
    written: int = 0
    unrun: list[dict[str, Any]] = field(default_factory=list)


#: Redeliveries that count as one try on a device (`_came_back`'s backstop, for a worker
#: that keeps dying after a batch's run): a batch only held beside crashing ones comes
#: back this many times before the backstop counts it once.
HELD_PER_TRY = 3


def device_id_of(device: str) -> str:
    """The id a device worker is known by: its device on this host (cuda:0@gpu-host-3)."""
    return f"{device}@{socket.gethostname()}"


def claimed_by_another(device: str) -> int | None:
    """The pid of another live worker on this host that serves `device` (its heartbeat
    is fresh and its process exists), or None. Two workers under one device id hand each
    other's batches back (gpu_workers/taken.py), so the second must not start."""
    info = shared_state.read_device(device_id_of(device))
    pid = (info or {}).get("pid")
    if not isinstance(pid, int) or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # the worker it was died (kill -9): its successor takes over at once
    except PermissionError:
        pass  # alive, another user's
    return pid


class DeviceRunner:
    def __init__(self, app: Celery, device: str, *, preload: Sequence[str] = (), nodename: str | None = None) -> None:
        self.app = app
        self.device = device
        self.nodename = nodename
        self.device_id = device_id_of(device)
        self.health = DeviceHealth(app, self.device_id, nodename)
        #: The batch messages this worker holds; what a killed predecessor held goes
        #: back to the broker now, not after the visibility timeout.
        self.taken = Taken(app, self.device_id)
        self.taken.reclaim()
        self._models: dict[str, BatchRunner] = {}
        self._loading = threading.Lock()
        self._outcomes = OutcomeWriter(app)
        self.batches = 0
        self.requests = 0
        self.busy_s = 0.0
        self.isolated = 0
        #: Inputs that made a batch too slow but were no slower than a batch-mate alone:
        #: the device was busy, the input innocent. Not remembered.
        self.suspected = 0
        #: Per model, the longest input of the last batch that ran in time: the control
        #: for an input that was too slow with no batch-mate to compare it with.
        self._reference: dict[str, dict[str, Any]] = {}
        self.watchdog = Watchdog(on_hung=self._hung)
        #: The batch being run and its requests to run, for `_hung`.
        self._running: tuple[dict[str, Any], list[dict[str, Any]]] | None = None
        #: Every batch this worker holds now, by task id: with DEVICE_OVERLAP one may wait for
        #: the device, or write its answers, while another runs; for `_hung`.
        self._in_hand: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
        #: Set by the worker's start-up step: stops its consumer taking batch messages.
        self.stop_taking: Callable[[], None] = lambda: None
        #: Held while a batch runs on the device: with DEVICE_OVERLAP two batch tasks
        #: are in this worker at once, and only one may use the device (and the
        #: watchdog, the preemption stack and `_running`, which are the device's). Every
        #: model loaded here runs its batches under it too.
        self._device = DeviceLock()
        #: Long batches let waiting ones run between their layers (gpu_workers/preempt.py).
        self.preempt = Preemption(
            app,
            self.watchdog,
            emit=self._emit,
            device_id=self.device_id,
            hostname=nodename or self.device_id,
            taken=self.taken,
            device_lock=self._device,
        )
        self.bisector = Bisector(self.watchdog, clock=self.preempt.own_clock)
        self.started_at = time.time()
        self._stop = threading.Event()
        for name in preload:
            self.model(name)
        self._heartbeat = threading.Thread(target=self._beat, name=f"heartbeat-{device}", daemon=True)
        self._heartbeat.start()
        self._emit({"kind": "hello", "device": self.device_id})

    def model(self, name: str) -> BatchRunner:
        runner = self._models.get(name)
        if runner is not None:
            return runner
        # Two batches in this worker may want a model not loaded yet: load it once.
        with self._loading:
            return self._load(name)

    def _load(self, name: str) -> BatchRunner:
        runner = self._models.get(name)
        if runner is None:
            t0 = time.perf_counter()
            spec = get_spec(name)
            runner = self._models[name] = spec.load(self.device)
            runner.between_steps = self.preempt.between_steps
            runner.device_lock = self._device
            runner.on_progress = self.watchdog.progress
            log.info("loaded model %s on %s in %.1fs", name, self.device, time.perf_counter() - t0)
            if getattr(spec, "probe", False) and hasattr(runner, "probe_budget"):
                log.info(
                    "model %s on %s: a padded-token budget of %d fits free memory (per_model max_batch_tokens)",
                    name,
                    self.device,
                    runner.probe_budget(),
                )
        return runner

    def close(self) -> None:
        self._stop.set()
        self._heartbeat.join(timeout=5)
        shared_state.forget_device(self.device_id)
        self.watchdog.close()
        self.preempt.close()
        for runner in self._models.values():
            runner.close()
        self._models.clear()

    # --- one batch ------------------------------------------------------------------

    def execute(
        self, batch: dict[str, Any], *, redelivered: bool = False, task_id: str | None = None
    ) -> dict[str, Any]:
        """Run one batch. A first delivery (as the broker says) skips asking which
        requests are already answered: none can be. One that came back (redelivered by
        the broker, or handed back by a device) is counted, and may be split first
        (`_came_back`).

        With DEVICE_OVERLAP, a device worker holds two batches at once in two threads
        (gpu_workers/worker.py): what one does before and after its run (decoding and
        counting, STARTED, the model's host-side `prepare`, then writing every answer
        and the ack) happens while the other holds the device, so the device does not
        wait on it. Only the run itself is under the device lock."""
        if not self.health.may_run(batch):
            return self.health.bounce(batch)
        requests: list[dict[str, Any]] = batch["requests"]
        came_back = redelivered or bool(batch.get("came_back"))
        todo = self._unanswered(requests) if came_back or batch.get("bounces") else list(requests)
        if came_back:
            reply = self._came_back(batch, todo, task_id if redelivered else None)
            if reply is not None:
                return reply
        # By its task id, as the broker's delivery is noted (a bounced batch's differs).
        held_as = task_id or batch["batch_id"]
        self._in_hand[held_as] = (batch, todo)
        try:
            return self._execute(batch, todo, tried_as=task_id if redelivered else None)
        finally:
            self._in_hand.pop(held_as, None)

    def _execute(
        self, batch: dict[str, Any], todo: list[dict[str, Any]], *, tried_as: str | None = None
    ) -> dict[str, Any]:
        started = clock.now()  # Redis's clock, as the edge set the deadlines
        waiting_since = time.monotonic()
        if todo and self.app.conf.task_track_started:
            self._outcomes.started([r["id"] for r in todo if not self._late(r, started)], self.device_id)
        self._prepare(batch["model"], todo)
        # Re-entrant: a batch that preempts another runs inside it, in the same thread.
        with self._device:
            # What waiting for the device took counts against the deadlines.
            started += time.monotonic() - waiting_since
            # A batch that preempts another runs inside it: restore the one it interrupted.
            outer, self._running = self._running, (batch, todo)
            # A batch that came back goes on a device again: the try is counted before it
            # runs and withdrawn when the run ends, so that only a worker that dies while
            # it runs counts against it (`_came_back`). Nor does it let another batch run
            # inside it, which could kill the worker while this one held the device.
            try_nonce = uuid.uuid4().hex if tried_as is not None and todo else None
            if try_nonce is not None:
                deliveries.trying(shared_state.client(), tried_as, try_nonce)
            try:
                yield_after = None if try_nonce is not None else self._yield_after(batch, todo)
                with self.preempt.armed(batch["batch_id"], yield_after_s=yield_after):
                    ran = self._on_device(batch, todo, started)
                model = self._models.get(batch["model"])
                self._device.hand_on_gil = model is None or model.runs_beside_the_host
            finally:
                self._running = outer
            if try_nonce is not None:
                deliveries.tried(shared_state.client(), tried_as, try_nonce)
        return ran if isinstance(ran, dict) else self._answer(batch, todo, ran)

    def _yield_after(self, batch: dict[str, Any], todo: list[dict[str, Any]]) -> float | None:
        """When this batch starts letting waiting batches run between its layers: a
        slow-lane batch at once, any other past PREEMPT_AFTER times its expected time
        and SLOW_FLOOR_S (never, before its model's cost is learned)."""
        if batch.get("lane") == "slow":
            return 0.0
        costs = self.bisector.costs.get(batch["model"])
        expected = costs.expected_s(len(todo) * max((r["tokens"] for r in todo), default=0)) if costs else None
        # Never before SLOW_FLOOR_S: a short batch that runs a little long is only noise,
        # and a batch let in ahead of it would only reorder the two.
        return None if expected is None else max(conf.PREEMPT_AFTER * expected, conf.SLOW_FLOOR_S)

    @staticmethod
    def _late(r: dict[str, Any], now: float) -> bool:
        return r.get("deadline_at") is not None and now > r["deadline_at"]

    def _prepare(self, model: str, todo: list[dict[str, Any]]) -> None:
        """The model's host-side work for these inputs (BatchRunner.prepare), before the
        device lock. A model not loaded yet is loaded by the run, whose time bound allows
        for it (`_run`); a prepare that fails leaves the work to the run, where a failure
        becomes each input's own outcome."""
        runner = self._models.get(model)
        if not todo or runner is None:
            return
        try:
            runner.prepare([r["input"] for r in todo])
        except Exception:  # noqa: BLE001 - the run meets the same failure and answers it
            log.debug("prepare failed for a batch of %s; the run will answer it", model, exc_info=True)

    def _on_device(self, batch: dict[str, Any], todo: list[dict[str, Any]], started: float) -> _Ran | dict[str, Any]:
        """The part of a batch that holds the device: run it, judge the device, isolate
        slow inputs. Returns what is left to write, or a bounce's reply."""
        # One time bound for the whole batch, bisection and isolation included (and for
        # one that preempts another, what that one's bound leaves it).
        until = time.monotonic() + conf.BATCH_HARD_LIMIT_S
        # Inside another batch, this one has only the time that one lends: on a busy
        # host, where every batch runs long and yields, that can run out before the
        # batch does, and that is no fault of its inputs.
        borrowed = self.preempt.nested_until is not None and self.preempt.nested_until < until
        if borrowed:
            until = self.preempt.nested_until
        late: list[dict[str, Any]] = []
        live: list[dict[str, Any]] = []
        for r in todo:
            (late if self._late(r, started) else live).append(r)
        outcomes = [
            Outcome(
                r["id"],
                error=DeadlineExceeded(r["id"], "reached its deadline before a device was free"),
                celery=r.get("celery"),
            )
            for r in late
        ]
        slow_lane = batch.get("lane") == "slow"
        t0 = self.preempt.own_clock()
        ran = _Ran(live=live, borrowed=borrowed)

        def answer_part(reqs: list[dict[str, Any]], results: list[Any]) -> None:
            base = self._base(batch, started, self.preempt.own_clock() - t0)
            ran.written += self._outcomes.write(
                [self._outcome(r, res, base, isolated=False) for r, res in zip(reqs, results, strict=True)]
            )
            ran.early.update(r["id"] for r in reqs)

        results = self._run(batch["model"], live, slow_lane=slow_lane, until=until, on_part=answer_part) if live else []
        ran.run_s = self.preempt.own_clock() - t0
        ran.base = self._base(batch, started, ran.run_s)
        if self.health.judge(batch, [res for res in results if res is not UNRUN]):
            return self.health.bounce(batch)  # the device failed, not these inputs

        slow = [r for r, res in zip(live, results, strict=True) if res is SLOW]
        if live and not slow and not slow_lane and all(not isinstance(res, BaseException) for res in results):
            self._reference[batch["model"]] = max(live, key=lambda r: r["tokens"])
        ran.unrun = [r for r, res in zip(live, results, strict=True) if res is UNRUN]
        outcomes += [
            self._outcome(r, res, ran.base, isolated=slow_lane)
            for r, res in zip(live, results, strict=True)
            if res is not SLOW and res is not UNRUN
        ]
        ran.to_write = [o for o in outcomes if o.task_id not in ran.early]
        if slow:
            # Batch-mates are answered before the slow inputs run on their own.
            ran.written += self._outcomes.write(ran.to_write)
            mates = [
                r
                for r, res in zip(live, results, strict=True)
                if res is not SLOW and res is not UNRUN and not isinstance(res, BaseException)
            ]
            isolated, left = self._isolate(batch["model"], slow, mates, ran.base, until)
            ran.unrun += left
            outcomes += isolated
            ran.to_write = isolated
        ran.outcomes = outcomes
        self.busy_s += self.preempt.own_clock() - t0
        return ran

    def _answer(self, batch: dict[str, Any], todo: list[dict[str, Any]], ran: _Ran) -> dict[str, Any]:
        """After the run, off the device: write the answers left to write (with Flower's
        events and the collector's `done` in the same round trip), hand back what the
        batch's time bound left unrun. The batch task returns, and is acked, after this."""
        ran.written += self._outcomes.write(ran.to_write, also=self._also(batch, ran.outcomes, ran.base, ran.run_s))
        if ran.unrun:
            if ran.borrowed:
                self._hand_back(batch, ran.unrun, "r", "the batch it ran inside had no more time to lend", counts=False)
            else:
                self._hand_back(batch, ran.unrun, "r", "its batch used up its time bound")
        self.batches += 1
        self.requests += len(ran.live)
        metrics.record_batch(self.device_id, batch, ran.outcomes, ran.run_s)
        return {
            "batch_id": batch["batch_id"],
            "device": self.device_id,
            "size": len(batch["requests"]),
            "ran": len(ran.live) - len(ran.unrun),
            "written": ran.written,
            "skipped": len(batch["requests"]) - len(todo),
            "isolated": sum(1 for o in ran.outcomes if o.details.get("isolated")),
            "handed_back": len(ran.unrun),
            "run_ms": ran.base["run_ms"],
        }

    def _run(
        self,
        model: str,
        live: list[dict[str, Any]],
        *,
        slow_lane: bool,
        until: float,
        on_part: Callable[[list[dict[str, Any]], list[Any]], object] | None = None,
    ) -> list[Any]:
        """Each request's result or its own error. A model that cannot load answers
        every request with an error naming the model and this device (health.judge
        bounces the batch when that error blames the device, such as out of memory)."""
        loading = time.monotonic()
        try:
            runner = self.model(model)
        except Exception as exc:  # noqa: BLE001 - becomes each request's error
            log.exception("could not load model %s on %s", model, self.device_id)
            return [ModelUnavailable(model, self.device_id, f"{type(exc).__name__}: {exc}")] * len(live)
        # A first load is the device's cost, never its inputs': the batch's bound starts
        # once the model is there (issue 41, finding 4). The extra time comes out of what
        # the batch may lend to others, so its message is still done with before the
        # broker would hand it to another device (issue 41, finding 7). Inside a
        # borrowed budget the lender's bound stays.
        if self.preempt.nested_until is None:
            until += self.preempt.lend_to_self(time.monotonic() - loading)
        return self.bisector.run(model, runner, live, slow_lane=slow_lane, until=until, on_part=on_part)

    def _came_back(
        self, batch: dict[str, Any], todo: list[dict[str, Any]], redelivered_as: str | None
    ) -> dict[str, Any] | None:
        """A batch that did not finish before: the broker redelivered it (its worker
        died running it, a segfault or an out-of-memory kill, or running another batch
        while it held this one), or a device handed it back (it hung, or its time bound
        ran out). A batch of several is split in halves, each sent on its own, so an
        input at fault ends up alone. A lone request gets its own error once it has
        failed to finish POISON_REDELIVERIES times: its hand-backs (the batch counts
        them), and for one the broker redelivered (`redelivered_as`, its task id) the
        delivery it came back from plus every try on a device since, each counted before
        it ran (`_execute`). A redelivery alone does not add: with DEVICE_OVERLAP a batch
        held beside one that killed its worker comes back too, and counted that way an
        innocent lone request that twice shared a worker with a crashing one was
        answered WorkerCrashed (issue 40). None: run it (again) here. One with every
        request already answered (its worker died between the last answer and the ack)
        is done."""
        times = int(batch.get("handed_back") or 0)
        if redelivered_as is not None:
            r = shared_state.client()
            came_back = deliveries.count(r, redelivered_as)
            times += 1 + deliveries.tries(r, redelivered_as)
            # A backstop for a worker that dies after the run, on this batch's answers
            # (an output too big to encode in memory): every redelivery counts, later.
            times = max(times, came_back // HELD_PER_TRY)
        reply = {"batch_id": batch["batch_id"], "device": self.device_id, "redeliveries": times}
        if not todo:
            return {**reply, "written": 0, "skipped": len(batch["requests"])}
        if len(todo) > 1:
            mid = len(todo) // 2
            for suffix, requests in (("a", todo[:mid]), ("b", todo[mid:])):
                half = {**resend.part(batch, requests, suffix), "came_back": False, "handed_back": 0}
                resend.resend(self.app, half, half["batch_id"])
            log.warning("batch %s came back (%d times): split in halves", batch["batch_id"], times)
            return {**reply, "split": [mid, len(todo) - mid]}
        if times < conf.POISON_REDELIVERIES:
            return None
        r = todo[0]
        log.error("request %s came back %d times alone: answering it with an error", r["id"], times)
        error = WorkerCrashed(r["id"], times, self.device_id)
        written = self._outcomes.write(
            [Outcome(r["id"], error=error, details={"device": self.device_id}, celery=r.get("celery"))]
        )
        return {**reply, "written": written}

    def _hand_back(
        self,
        batch: dict[str, Any],
        requests: list[dict[str, Any]],
        suffix: str,
        why: str,
        *,
        counts: bool = True,
        queue: str | None = None,
    ) -> None:
        """Send requests this device could not finish back to the shared queue (or to
        `queue`), as a batch that counts as having come back once more (`counts`:
        towards the error a lone input gets after POISON_REDELIVERIES); or, when the
        device and not the batch ran out of time, as it was."""
        if counts:
            came_back, handed_back = True, int(batch.get("handed_back") or 0) + 1
        else:
            came_back, handed_back = bool(batch.get("came_back")), int(batch.get("handed_back") or 0)
        part = {**resend.part(batch, requests, suffix), "came_back": came_back, "handed_back": handed_back}
        log.warning("handing %d request(s) of batch %s back: %s", len(requests), batch["batch_id"], why)
        resend.resend(self.app, part, part["batch_id"], queue=queue)

    def _hung(self) -> None:
        """Called by the watchdog's thread when a model call is stuck in native code
        past its hard limit: hand back every batch this worker holds, then die, so the
        supervisor starts a fresh worker (a stuck kernel cannot be interrupted).

        The hung batch comes back counted (towards the error a lone input gets after
        POISON_REDELIVERIES); any other it holds (one waiting for the device in the other
        thread, one it preempted) did nothing wrong and comes back as it was. Each goes to
        another live device's own queue: on the shared queue, this worker's consumer,
        idle in its other thread, took its own hand-back and died with it. Then its
        consumer's connection is closed, so that it takes nothing more in the moment
        before the kill (a batch another device split that hand-back into, say)."""
        hung = self._running
        log.critical("device %s is hung inside a model call; handing its batches back and exiting", self.device_id)
        self._stop.set()  # no more heartbeats from a worker that cannot work
        try:
            queue = self._elsewhere()
            for task_id, (batch, todo) in list(self._in_hand.items()):
                tag = self.taken.tag_of(task_id)
                self.taken.finished(task_id)
                left = self._unanswered(todo)
                if left and hung is not None and batch is hung[0]:
                    self._hand_back(batch, left, "h", "the device hung", queue=queue)
                elif left:
                    self._hand_back(batch, left, "w", "it waited on a device that hung", counts=False, queue=queue)
                # The copy is out: the original must not come back too. Copy first, then
                # settle: dying between the two runs it twice, never loses it.
                if tag is not None:
                    deliveries.settle(shared_state.client(), tag)
            # Only now: a consumer whose connection closes hands back what it holds
            # unacked (kombu restores it), and what was settled above is not there.
            self.stop_taking()
        finally:
            self._die()

    def _die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def _elsewhere(self) -> str | None:
        """The queue of another live device whose circuit is closed, the freshest
        heartbeat first; None (the shared queue) if there is none."""
        own = device_queue_name(self.device)
        try:
            live = shared_state.live_devices()
        except Exception:  # noqa: BLE001 - the shared queue still works
            return None
        for device_id, info in sorted(live.items(), key=lambda kv: -float(kv[1].get("at") or 0)):
            queue = device_queue_name(str(info.get("device", "")))
            if device_id != self.device_id and info.get("circuit") == "closed" and queue != own:
                return queue
        return None

    def _unanswered(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        todo_ids = self._outcomes.missing([r["id"] for r in requests])
        return [r for r in requests if r["id"] in todo_ids]

    def _base(self, batch: dict[str, Any], started: float, run_s: float) -> dict[str, Any]:
        """What every request of the batch is told about how it ran."""
        return {
            "batch_id": batch["batch_id"],
            "device": self.device_id,
            "batch_size": len(batch["requests"]),
            "padded_tokens": batch.get("padded_tokens"),
            "real_tokens": batch.get("real_tokens"),
            "dispatched_at": batch.get("dispatched_at"),
            "started_at": started,
            "run_ms": round(run_s * 1000, 3),
        }

    @staticmethod
    def _outcome(r: dict[str, Any], res: Any, base: dict[str, Any], *, isolated: bool) -> Outcome:
        details = {
            **base,
            "tokens": r["tokens"],
            "priority": r["priority"],
            "submitted_at": r["submitted_at"],
            "waited_ms": round(r.get("waited_s", 0.0) * 1000, 3),
            "truncated": bool(r.get("truncated")),
            "isolated": isolated,
        }
        if isinstance(res, BaseException):
            return Outcome(r["id"], error=res, details=details, celery=r.get("celery"))
        return Outcome(r["id"], result=res, details=details, celery=r.get("celery"))

    def _also(self, batch: dict[str, Any], outcomes: list[Outcome], base: dict[str, Any], run_s: float) -> Any:
        done = {
            "kind": "done",
            "batch_id": batch["batch_id"],
            "device": self.device_id,
            "padded_tokens": batch.get("padded_tokens") or 0,
            "run_ms": base["run_ms"],
            # When the device took it up (Redis's clock, as the batch's dispatched_at):
            # the collector learns from it how early to send a batch ahead.
            "started_at": base["started_at"],
            # The collector's slow lane weighs its share of device time by these.
            "lane": batch.get("lane", "normal"),
        }
        done_message = wire.event_message(done, EVENTS_QUEUE)
        request_events = conf.REQUEST_EVENTS

        def also(pipe: Any) -> None:
            # In the same round trip as the last answers: Flower's events for them, and
            # the collector hears that this device is free, so the next batch is on its
            # way while the bookkeeping runs.
            if request_events:
                flower_events.ran(
                    self.app,
                    batch,
                    outcomes,
                    started_at=base["started_at"],
                    run_s=run_s,
                    hostname=self.nodename or self.device_id,
                ).publish_on(pipe)
            pipe.lpush(EVENTS_QUEUE, done_message)

        return also

    def _isolate(
        self,
        model: str,
        slow: list[dict[str, Any]],
        mates: list[dict[str, Any]],
        base: dict[str, Any],
        until: float,
    ) -> tuple[list[Outcome], list[dict[str, Any]]]:
        """Run each input that made its batch too slow alone, and remember it for the
        slow lane only if it is slow in itself: judged against a batch-mate run alone
        just before it (tasks/core/slowness.py::confirms_slow), so a device that was
        merely busy flags nothing. Returns the outcomes, and the inputs the batch's
        time bound left unrun."""
        runner = self.model(model)
        control = self._control(model, runner, mates, until)
        outcomes, unrun = [], []
        for r in slow:
            res, took = self._run_alone(model, runner, r, until)
            if res is UNRUN:
                unrun.append(r)
                continue
            confirmed, ratio = False, 0.0
            if control is not None and not isinstance(res, BaseException):
                confirmed, ratio = confirms_slow(
                    (r["tokens"], took),
                    control,
                    factor=conf.SLOW_CONFIRM_FACTOR,
                    floor_s=conf.SLOW_FLOOR_S,
                    expected=self.bisector.costs[model].expected_s,
                )
            if confirmed:
                fp = fingerprint(model, r["input"])
                shared_state.remember_slow_input(fp)
                self._emit({"kind": "slow", "fingerprint": fp})
                self.isolated += 1
            else:
                self.suspected += 1
            outcome = self._outcome(r, res, base, isolated=confirmed)
            outcome.details["slow_ratio"] = round(ratio, 2)
            outcomes.append(outcome)
        return outcomes, unrun

    def _control(self, model: str, runner: Any, mates: list[dict[str, Any]], until: float) -> tuple[int, float] | None:
        """The device's speed now: the longest batch-mate that ran in time (else the
        reference input of an earlier batch), run alone again; its answer is already
        written, this run is only timed. None without one."""
        mate = max(mates, key=lambda r: r["tokens"]) if mates else self._reference.get(model)
        if mate is None:
            return None
        res, took = self._run_alone(model, runner, mate, until)
        if res is UNRUN or isinstance(res, BaseException):
            return None
        # What the device does now is also what the cost model should expect next.
        self.bisector.costs[model].observe(mate["tokens"], took)
        return mate["tokens"], took

    def _run_alone(self, model: str, runner: Any, r: dict[str, Any], until: float) -> tuple[Any, float]:
        """One input alone, under the hard limit only: its result (or UNRUN, or its
        error), and the seconds it took of this device's own time."""
        t0 = self.preempt.own_clock()
        res = self.bisector.run(model, runner, [r], slow_lane=True, until=until)[0]
        return res, self.preempt.own_clock() - t0

    # --- talking to the collector -----------------------------------------------------

    def _emit(self, event: dict[str, Any]) -> None:
        try:
            with self.app.producer_pool.acquire(block=True, timeout=5) as producer:
                wire.publish_event(producer, event, EVENTS_QUEUE)
        except Exception:
            log.warning("could not tell the collector %s", event, exc_info=True)

    def _beat(self) -> None:
        while not self._stop.is_set():
            try:
                shared_state.device_heartbeat(
                    self.device_id,
                    {
                        "device": self.device,
                        "hostname": socket.gethostname(),
                        "pid": os.getpid(),
                        "started_at": self.started_at,
                        "batches": self.batches,
                        "requests": self.requests,
                        "busy_s": round(self.busy_s, 3),
                        # What the device itself says it was busy, where its runner
                        # can tell (an emulated accelerator: its duty cycle).
                        "device_busy_s": round(
                            sum(float(getattr(r, "device_busy_s", 0.0)) for r in list(self._models.values())), 4
                        ),
                        "isolated": self.isolated,
                        "preempted": self.preempt.preempted,
                        "circuit": self.health.breaker.state,
                        "circuit_trips": self.health.breaker.trips,
                        # The models loaded here (/healthz's per-model readiness).
                        "models": sorted(self._models),
                        "at": clock.now(),
                    },
                )
            except Exception:
                log.warning("device heartbeat failed", exc_info=True)
            self._stop.wait(shared_state.HEARTBEAT_EVERY_S)


#: The runner of this worker process, set by the device worker's start-up step.
_current: DeviceRunner | None = None


def current() -> DeviceRunner:
    if _current is None:
        raise RuntimeError(
            f"this worker has no device: start device workers with --device (queue {EVENTS_QUEUE!r} is the collector's)"
        )
    return _current


def install(runner: DeviceRunner | None) -> None:
    global _current
    _current = runner
