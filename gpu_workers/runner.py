"""One device's runner: owns the models loaded on that device and runs batches on them.

A device worker creates exactly one `DeviceRunner` when it starts (see
`gpu_workers/worker_steps.py`) and closes it when it stops. For each batch it:

1. skips requests that already have an outcome (in a batch the broker redelivered or a
   device bounced) and fails those past their deadline (they must never run late);
2. runs the rest in one model call under a time limit learned from past batches; if
   the call raises or runs too long, splits the batch in halves and retries each, so
   only inputs that fail on their own fail, and inputs too slow to share a batch are
   found and run alone (at most log2(n) levels);
3. writes every request's own outcome under its own task id and tells the collector
   the device is free again, in one round trip.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from celery import Celery
from kombu import Producer

from batching_site.celery import BATCH_QUEUE, BATCH_TASK, EVENTS_QUEUE
from gpu_workers.models import get_spec
from gpu_workers.models.base import BatchRunner
from gpu_workers.watchdog import BatchTooSlow, Watchdog
from tasks import flower_events, metrics, shared_state, wire
from tasks.core.circuit import CircuitBreaker
from tasks.core.slowness import CostModel, fingerprint
from tasks.errors import BatchOutputMismatch, DeadlineExceeded, InferenceError
from tasks.outcomes import Outcome, OutcomeWriter

log = logging.getLogger(__name__)

#: Marks a request that was too slow to run with others; it runs alone afterwards.
_SLOW = object()
#: Device failures in a row that open a device's circuit, and how long it stays open.
CIRCUIT_THRESHOLD = int(os.environ.get("CIRCUIT_THRESHOLD", "3"))
CIRCUIT_COOLDOWN_S = float(os.environ.get("CIRCUIT_COOLDOWN_S", "30"))
#: A batch handed back this many times runs anyway, so that with every device broken
#: its callers still get errors instead of waiting forever.
MAX_BOUNCES = 8
#: 0 turns slow-request isolation off (no time limit, no slow lane): a benchmark baseline.
SLOW_ISOLATION = os.environ.get("SLOW_ISOLATION", "1") != "0"
#: A batch is cut off after this many times its expected time, and never before
#: SLOW_FLOOR_S. Tighter catches slow inputs sooner but cuts more batches on a noisy host.
SLOW_FACTOR = float(os.environ.get("SLOW_FACTOR", "4"))
SLOW_FLOOR_S = float(os.environ.get("SLOW_FLOOR_S", "0.05"))
#: Words in an error that blame the device rather than the input.
_DEVICE_ERROR_MARKS = ("CUDA", "OutOfMemory", "out of memory", "DeviceFault", "device-side")


class DeviceRunner:
    def __init__(self, app: Celery, device: str, *, preload: Sequence[str] = (), nodename: str | None = None) -> None:
        self.app = app
        self.device = device
        #: The Celery worker's name, to stop and resume its consuming when the circuit trips.
        self.nodename = nodename
        self.breaker = CircuitBreaker(time.monotonic, threshold=CIRCUIT_THRESHOLD, cooldown_s=CIRCUIT_COOLDOWN_S)
        self.device_id = f"{device}@{socket.gethostname()}"
        self._models: dict[str, BatchRunner] = {}
        self._outcomes = OutcomeWriter(app)
        self.batches = 0
        self.requests = 0
        self.busy_s = 0.0
        self.isolated = 0
        self.costs: dict[str, CostModel] = {}
        self.watchdog = Watchdog()
        self.started_at = time.time()
        self._stop = threading.Event()
        for name in preload:
            self.model(name)
        self._heartbeat = threading.Thread(target=self._beat, name=f"heartbeat-{device}", daemon=True)
        self._heartbeat.start()
        self._emit({"kind": "hello", "device": self.device_id})

    def model(self, name: str) -> BatchRunner:
        runner = self._models.get(name)
        if runner is None:
            t0 = time.perf_counter()
            runner = self._models[name] = get_spec(name).load(self.device)
            log.info("loaded model %s on %s in %.1fs", name, self.device, time.perf_counter() - t0)
        return runner

    def close(self) -> None:
        self._stop.set()
        self._heartbeat.join(timeout=5)
        shared_state.forget_device(self.device_id)
        self.watchdog.close()
        for runner in self._models.values():
            runner.close()
        self._models.clear()

    # --- one batch ------------------------------------------------------------------

    def execute(self, batch: dict[str, Any], *, redelivered: bool = True) -> dict[str, Any]:
        """Run one batch. `redelivered=False` (a first delivery, as the broker says) skips
        asking which requests are already answered: none can be."""
        if not self.breaker.allow() and batch.get("bounces", 0) < MAX_BOUNCES:
            return self._bounce(batch)
        started = time.time()
        model = batch["model"]
        requests: list[dict[str, Any]] = batch["requests"]
        if redelivered or batch.get("bounces"):
            todo_ids = self._outcomes.missing([r["id"] for r in requests])
            todo = [r for r in requests if r["id"] in todo_ids]
        else:
            todo = list(requests)
        outcomes: list[Outcome] = []
        live = []
        for r in todo:
            if r.get("deadline_at") is not None and started > r["deadline_at"]:
                outcomes.append(
                    Outcome(r["id"], error=DeadlineExceeded(r["id"], "reached its deadline before a device was free")),
                )
            else:
                live.append(r)

        runner = self.model(model)
        slow_lane = batch.get("lane") == "slow"
        t0 = time.perf_counter()
        results = self._run_guarded(model, runner, live, slow_lane=slow_lane) if live else []
        run_s = time.perf_counter() - t0

        base = {
            "batch_id": batch["batch_id"],
            "device": self.device_id,
            "batch_size": len(requests),
            "padded_tokens": batch.get("padded_tokens"),
            "real_tokens": batch.get("real_tokens"),
            "dispatched_at": batch.get("dispatched_at"),
            "started_at": started,
            "run_ms": round(run_s * 1000, 3),
        }
        if self._device_failed(results):
            if self.breaker.record_failure():
                self._open_circuit()
            if batch.get("bounces", 0) < MAX_BOUNCES:
                # The device failed, not these inputs: another device answers them.
                return self._bounce(batch)
        elif any(not isinstance(res, BaseException) for res in results):
            self.breaker.record_success()
        slow: list[dict[str, Any]] = []
        for r, res in zip(live, results, strict=True):
            if res is _SLOW:
                slow.append(r)
                continue
            details = self._details(base, r, isolated=slow_lane)
            if isinstance(res, BaseException):
                outcomes.append(Outcome(r["id"], error=res, details=details))
            else:
                outcomes.append(Outcome(r["id"], result=res, details=details))
        done = {
            "kind": "done",
            "batch_id": batch["batch_id"],
            "device": self.device_id,
            "padded_tokens": batch.get("padded_tokens") or 0,
            "run_ms": base["run_ms"],
        }
        done_message = wire.event_message(done, EVENTS_QUEUE)

        def also(pipe: Any) -> None:
            # In the same round trip as the last answers: Flower's events for them, and
            # the collector hears that this device is free, so the next batch is on its
            # way while the bookkeeping below runs.
            flower_events.ran(
                self.app, batch, outcomes, started_at=started, run_s=run_s, hostname=self.nodename or self.device_id
            ).publish_on(pipe)
            pipe.lpush(EVENTS_QUEUE, done_message)

        if slow:
            # Batch-mates are answered before the slow inputs run on their own.
            written = self._outcomes.write(outcomes)
            isolated = self._isolate(model, runner, slow, base)
            outcomes += isolated
            written += self._outcomes.write(isolated, also=also)
        else:
            written = self._outcomes.write(outcomes, also=also)
        self.batches += 1
        self.requests += len(live)
        self.busy_s += time.perf_counter() - t0
        metrics.record_batch(self.device_id, batch, outcomes, run_s)
        return {
            "batch_id": batch["batch_id"],
            "device": self.device_id,
            "size": len(requests),
            "ran": len(live),
            "written": written,
            "skipped": len(requests) - len(todo),
            "isolated": len(slow),
            "run_ms": base["run_ms"],
        }

    # --- device health ----------------------------------------------------------------

    @staticmethod
    def _device_failed(results: list[Any]) -> bool:
        """Every input failed, and not because of itself: several inputs failing on
        their own at once, or an error that names the device."""
        errors = [r for r in results if isinstance(r, BaseException)]
        if not results or len(errors) != len(results):
            return False
        return len(errors) >= 2 or any(m in str(errors[0]) for m in _DEVICE_ERROR_MARKS)

    def _open_circuit(self) -> None:
        log.error(
            "device %s failed %d batches in a row: circuit open, not pulling work for %.0fs",
            self.device_id,
            self.breaker.failures,
            self.breaker.cooldown_s,
        )
        self._consume(False)
        timer = threading.Timer(self.breaker.seconds_until_half_open(), self._consume, args=(True,))
        timer.daemon = True
        timer.start()

    def _consume(self, on: bool) -> None:
        """Stop or resume pulling from the shared batch queue (pinned work still comes)."""
        if not self.nodename:
            return
        try:
            if on:
                log.info("device %s circuit half-open: pulling one batch to test it", self.device_id)
                self.app.control.add_consumer(BATCH_QUEUE, destination=[self.nodename])
            else:
                self.app.control.cancel_consumer(BATCH_QUEUE, destination=[self.nodename])
        except Exception:  # noqa: BLE001 - the bounce below still keeps work away
            log.warning("could not change consuming of %s", BATCH_QUEUE, exc_info=True)

    def _bounce(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Hand a batch back to the shared queue for a healthy device."""
        bounces = batch.get("bounces", 0) + 1
        self.app.send_task(
            BATCH_TASK,
            args=[{**batch, "bounces": bounces}],
            task_id=f"{batch['batch_id']}-bounce{bounces}",
            queue=BATCH_QUEUE,
        )
        return {"batch_id": batch["batch_id"], "device": self.device_id, "bounced": bounces}

    @staticmethod
    def _details(base: dict[str, Any], r: dict[str, Any], *, isolated: bool = False) -> dict[str, Any]:
        return {
            **base,
            "tokens": r["tokens"],
            "priority": r["priority"],
            "submitted_at": r["submitted_at"],
            "waited_ms": round(r.get("waited_s", 0.0) * 1000, 3),
            "truncated": bool(r.get("truncated")),
            "isolated": isolated,
        }

    def _run_guarded(
        self, model: str, runner: BatchRunner, reqs: list[dict[str, Any]], *, slow_lane: bool = False
    ) -> list[Any]:
        """Run requests as one batch under a time limit learned from past batches.

        A batch that raises is bisected, so only inputs that fail on their own fail and
        their batch-mates still get answers (at most log2(n) levels). A batch cut off
        for running too long is bisected the same way, and a single request that is
        too slow on its own comes back as _SLOW, to be run alone afterwards.
        """
        costs = self.costs.setdefault(model, CostModel(factor=SLOW_FACTOR, floor_s=SLOW_FLOOR_S))
        padded = len(reqs) * max(r["tokens"] for r in reqs)
        limit = costs.limit_s(padded) if SLOW_ISOLATION and not slow_lane else costs.hard_limit_s
        t0 = time.perf_counter()
        try:
            with self.watchdog.limit(limit):
                out = runner.run_batch([r["text"] for r in reqs])
            if len(out) != len(reqs):
                raise BatchOutputMismatch(len(reqs), len(out))
        except BatchOutputMismatch as exc:
            return [exc] * len(reqs)
        except BatchTooSlow:
            log.warning("batch of %d (%d padded tokens) passed its %.3fs limit", len(reqs), padded, limit)
            if slow_lane or len(reqs) == 1:
                return [_SLOW if not slow_lane else InferenceError(f"ran past the {limit:.0f}s hard limit")]
            mid = len(reqs) // 2
            return self._run_guarded(model, runner, reqs[:mid]) + self._run_guarded(model, runner, reqs[mid:])
        except Exception as exc:  # noqa: BLE001 - the model's failure becomes outcomes
            runner.after_failure(exc)
            if len(reqs) == 1:
                return [InferenceError(f"model failed on this input: {type(exc).__name__}: {exc}")]
            mid = len(reqs) // 2
            return self._run_guarded(model, runner, reqs[:mid]) + self._run_guarded(model, runner, reqs[mid:])
        if not slow_lane:
            costs.observe(padded, time.perf_counter() - t0)
        return list(out)

    def _isolate(
        self, model: str, runner: BatchRunner, slow: list[dict[str, Any]], base: dict[str, Any]
    ) -> list[Outcome]:
        """Run each too-slow input alone, remember it so the collector sends it to the
        slow lane next time, and mark its result as isolated."""
        outcomes = []
        r_client = shared_state.client()
        for r in slow:
            fp = fingerprint(model, r["text"])
            r_client.sadd(shared_state.SLOW_INPUTS_KEY, fp)
            r_client.expire(shared_state.SLOW_INPUTS_KEY, shared_state.SLOW_INPUTS_TTL_S)
            self._emit({"kind": "slow", "fingerprint": fp})
            self.isolated += 1
            res = self._run_guarded(model, runner, [r], slow_lane=True)[0]
            details = self._details(base, r, isolated=True)
            if isinstance(res, BaseException):
                outcomes.append(Outcome(r["id"], error=res, details=details))
            else:
                outcomes.append(Outcome(r["id"], result=res, details=details))
        return outcomes

    # --- talking to the collector -----------------------------------------------------

    def _emit(self, event: dict[str, Any]) -> None:
        try:
            with self.app.producer_pool.acquire(block=True, timeout=5) as producer:
                _publish_event(producer, event)
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
                        "isolated": self.isolated,
                        "circuit": self.breaker.state,
                        "circuit_trips": self.breaker.trips,
                        "at": time.time(),
                    },
                )
            except Exception:
                log.warning("device heartbeat failed", exc_info=True)
            self._stop.wait(shared_state.HEARTBEAT_EVERY_S)


def _publish_event(producer: Producer, event: dict[str, Any]) -> None:
    from tasks.collector import events_queue

    q = events_queue()
    producer.publish(event, exchange=q.exchange, routing_key=q.routing_key, serializer="json", declare=[q])


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
