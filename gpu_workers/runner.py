"""One device's runner: owns the models loaded on that device and runs batches on them.

A device worker creates exactly one `DeviceRunner` when it starts (see
`gpu_workers/worker_steps.py`) and closes it when it stops. For each batch it:

1. skips requests that already have an outcome (a redelivered batch) and fails those
   past their deadline (they must never run late);
2. runs the rest in one model call; if that raises, splits the batch in halves and
   retries each, so only inputs that fail on their own fail (at most log2(n) levels);
3. writes every request's own outcome in one round trip, under its own task id;
4. tells the collector the device is free again.
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

from batching_site.celery import EVENTS_QUEUE
from gpu_workers.models import get_spec
from gpu_workers.models.base import BatchRunner
from tasks import shared_state
from tasks.errors import BatchOutputMismatch, DeadlineExceeded, InferenceError
from tasks.outcomes import Outcome, OutcomeWriter

log = logging.getLogger(__name__)


class DeviceRunner:
    def __init__(self, app: Celery, device: str, *, preload: Sequence[str] = ()) -> None:
        self.app = app
        self.device = device
        self.device_id = f"{device}@{socket.gethostname()}"
        self._models: dict[str, BatchRunner] = {}
        self._outcomes = OutcomeWriter(app)
        self.batches = 0
        self.requests = 0
        self.busy_s = 0.0
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
        for runner in self._models.values():
            runner.close()
        self._models.clear()

    # --- one batch ------------------------------------------------------------------

    def execute(self, batch: dict[str, Any]) -> dict[str, Any]:
        started = time.time()
        requests: list[dict[str, Any]] = batch["requests"]
        todo_ids = self._outcomes.missing([r["id"] for r in requests])
        todo = [r for r in requests if r["id"] in todo_ids]
        outcomes: list[Outcome] = []
        live = []
        for r in todo:
            if r.get("deadline_at") is not None and started > r["deadline_at"]:
                outcomes.append(
                    Outcome(r["id"], error=DeadlineExceeded(r["id"], "reached its deadline before a device was free")),
                )
            else:
                live.append(r)

        runner = self.model(batch["model"])
        t0 = time.perf_counter()
        results = self._run_isolating(runner, [r["text"] for r in live]) if live else []
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
        for r, res in zip(live, results, strict=True):
            details = {
                **base,
                "tokens": r["tokens"],
                "priority": r["priority"],
                "submitted_at": r["submitted_at"],
                "waited_ms": round(r.get("waited_s", 0.0) * 1000, 3),
                "truncated": bool(r.get("truncated")),
            }
            if isinstance(res, BaseException):
                outcomes.append(Outcome(r["id"], error=res, details=details))
            else:
                outcomes.append(Outcome(r["id"], result=res, details=details))
        written = self._outcomes.write(outcomes)

        self.batches += 1
        self.requests += len(live)
        self.busy_s += run_s
        self._emit({"kind": "done", "batch_id": batch["batch_id"], "device": self.device_id})
        return {
            "batch_id": batch["batch_id"],
            "device": self.device_id,
            "size": len(requests),
            "ran": len(live),
            "written": written,
            "skipped": len(requests) - len(todo),
            "run_ms": base["run_ms"],
        }

    def _run_isolating(self, runner: BatchRunner, texts: list[str]) -> list[Any]:
        """Run texts as one batch; if the batch raises, bisect so that only the inputs
        that fail on their own get an error, and their batch-mates still get answers."""
        try:
            out = runner.run_batch(texts)
            if len(out) != len(texts):
                raise BatchOutputMismatch(len(texts), len(out))
            return list(out)
        except BatchOutputMismatch as exc:
            return [exc] * len(texts)
        except Exception as exc:  # noqa: BLE001 - the model's failure becomes outcomes
            if len(texts) == 1:
                return [InferenceError(f"model failed on this input: {type(exc).__name__}: {exc}")]
            mid = len(texts) // 2
            return self._run_isolating(runner, texts[:mid]) + self._run_isolating(runner, texts[mid:])

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
