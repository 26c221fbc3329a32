"""Start-up and shut-down of a device worker (gpu_workers/worker.py).

The model is loaded when the worker starts, on that worker's device, not at import
and not as a module global shared by everything.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import bootsteps, signals

from dynamic_batching.conf import conf
from dynamic_batching.core.lifetime import die_with_parent

from . import runner

log = logging.getLogger(__name__)


class DeviceStep(bootsteps.StartStopStep):
    """Creates this worker's DeviceRunner on start and closes it on stop."""

    def __init__(self, worker: Any, device: str | None = None, preload: str | None = None, **options: Any) -> None:
        super().__init__(worker, **options)
        self.device = device
        self.preload = preload
        self.runner: Any = None

    def start(self, worker: Any) -> None:
        if not self.device:
            raise RuntimeError("a device worker needs --device (cuda:0, cpu:0, ...)")
        die_with_parent()  # a worker left without its supervisor holds a device id it must not
        other = runner.claimed_by_another(self.device)
        if other is not None:
            raise RuntimeError(
                f"device {self.device} is already served on this host by worker pid {other} "
                f"({runner.device_id_of(self.device)}): two workers under one device id hand each other's "
                "batches back. Stop that worker first (a `make run` left behind: kill it), or start this one "
                "for another device"
            )
        models = [m for m in (self.preload or conf.DEFAULT_MODEL).split(",") if m]
        os.environ.setdefault("DEVICE_COUNT", str(max(1, len(conf.DEVICES) or 1)))
        self.runner = runner.DeviceRunner(worker.app, self.device, preload=models, nodename=worker.hostname)
        self.runner.stop_taking = lambda: stop_taking(worker)
        runner.install(self.runner)
        # The consumer's batch messages: their delivery tags are noted as they arrive.
        signals.task_received.connect(self.runner.taken.on_received, weak=False)
        log.info("device worker ready on %s with %s", self.device, ", ".join(models))

    def stop(self, worker: Any) -> None:
        if self.runner is not None:
            signals.task_received.disconnect(self.runner.taken.on_received)
            runner.install(None)
            self.runner.close()
            self.runner = None


def stop_taking(worker: Any) -> None:
    """Close the connection this worker's consumer waits for batch messages on, from
    any thread, so that it takes no more: a hung worker calls it after it has handed its
    batches back, just before it dies. With DEVICE_OVERLAP its other thread may be idle, and its
    consumer blocked in BRPOP on the shared queue; whatever the broker gave it in the
    moment before the kill was lost with it (measured: the halves another device split
    a hand-back into, 2 runs in 3, found again only by the ledger sweep). Redis forgets a
    blocked client whose connection closes. kombu has no public call for this (its
    channel's close first reads the pending BRPOP, for up to a second, and keeps what
    it gets): the redis-py connection under the consumer's channel is closed instead."""
    try:
        channel = worker.consumer.task_consumer.channel
        client = channel.__dict__.get("client")
        if client is not None and client.connection is not None:
            client.connection.disconnect()
    except Exception:  # noqa: BLE001 - the worker dies next in any case
        log.warning("could not close the consumer's connection before dying", exc_info=True)
