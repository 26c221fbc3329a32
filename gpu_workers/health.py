"""A device's health: when a batch's failure is the device's fault, the circuit that
stops this worker pulling work, and bouncing a batch to a healthy device."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import Celery

from dynamic_batching.conf import conf
from dynamic_batching.core.circuit import CircuitBreaker
from dynamic_batching.protocol.names import SHARED_BATCH_QUEUES

from .resend import resend

log = logging.getLogger(__name__)

#: Words in an error that blame the device rather than the input.
_DEVICE_ERROR_MARKS = ("CUDA", "OutOfMemory", "out of memory", "DeviceFault", "device-side")


def device_failed(results: list[Any]) -> bool:
    """Every input failed and an error blames the device (CUDA, out of memory on a batch
    of one after bisection, a lost device). Inputs that each raise on their own are
    their own errors, however many there are: a burst of poison inputs must never take
    a healthy device offline."""
    errors = [r for r in results if isinstance(r, BaseException)]
    if not results or len(errors) != len(results):
        return False
    return any(m in f"{type(e).__name__}: {e}" for e in errors for m in _DEVICE_ERROR_MARKS)


class DeviceHealth:
    def __init__(self, app: Celery, device_id: str, nodename: str | None) -> None:
        self.app = app
        self.device_id = device_id
        #: The Celery worker's name, to stop and resume its consuming when the circuit trips.
        self.nodename = nodename
        self.breaker = CircuitBreaker(
            time.monotonic, threshold=conf.CIRCUIT_THRESHOLD, cooldown_s=conf.CIRCUIT_COOLDOWN_S
        )

    def may_run(self, batch: dict[str, Any]) -> bool:
        """False while the circuit is open, unless the batch has bounced so often that
        it runs anyway: with every device broken its callers still get errors."""
        return self.breaker.allow() or batch.get("bounces", 0) >= conf.MAX_BOUNCES

    def judge(self, batch: dict[str, Any], results: list[Any]) -> bool:
        """Record how the batch went. True if the device, not the inputs, failed it and
        the batch should go to another device."""
        if device_failed(results):
            if self.breaker.record_failure():
                self._open_circuit()
            return batch.get("bounces", 0) < conf.MAX_BOUNCES
        if any(not isinstance(res, BaseException) for res in results):
            self.breaker.record_success()
        return False

    def bounce(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Hand a batch back to the shared queue for a healthy device."""
        bounces = batch.get("bounces", 0) + 1
        resend(self.app, {**batch, "bounces": bounces}, f"{batch['batch_id']}-bounce{bounces}")
        return {"batch_id": batch["batch_id"], "device": self.device_id, "bounced": bounces}

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
            for queue in SHARED_BATCH_QUEUES:
                if on:
                    self.app.control.add_consumer(queue, destination=[self.nodename])
                else:
                    self.app.control.cancel_consumer(queue, destination=[self.nodename])
        except Exception:  # noqa: BLE001 - the bounce still keeps work away
            log.warning("could not change consuming of %s", ", ".join(SHARED_BATCH_QUEUES), exc_info=True)
