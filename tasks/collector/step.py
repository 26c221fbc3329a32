"""Start-up and shut-down of the collector inside its Celery worker.

The collector loop runs in its own thread with its own broker connection; the Celery
worker around it answers pings and remote control, shows up in Flower, and turns
Ctrl-C and SIGTERM into a clean stop that dispatches (or hands back) what is held.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import bootsteps

from dynamic_batching.conf import conf

from ..core.lifetime import die_with_parent
from ..store.lease import LeaseLost
from . import revocations
from .loop import Collector

log = logging.getLogger(__name__)


class CollectorStep(bootsteps.StartStopStep):
    def __init__(self, worker: Any, **options: Any) -> None:
        super().__init__(worker, **options)
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, worker: Any) -> None:
        die_with_parent()  # a collector left without its supervisor is a second active one in waiting
        collector = Collector(
            worker.app,
            window=conf.COLLECTOR_WINDOW,
            batches_ahead=conf.COLLECTOR_BATCHES_AHEAD,
        )
        revocations.listen(collector.revocations.heard)
        self.thread = threading.Thread(target=self._run, args=(collector,), name="collector", daemon=True)
        self.thread.start()

    def _run(self, collector: Collector) -> None:
        try:
            collector.run(self.stop_event)
        except LeaseLost:
            log.warning("collector lost its lease to another; exiting so the supervisor restarts it as a standby")
            os._exit(1)
        except Exception:
            log.critical("collector loop crashed; exiting so the supervisor restarts it", exc_info=True)
            os._exit(1)

    def stop(self, worker: Any) -> None:
        if self.thread is not None:
            self.stop_event.set()
            self.thread.join(timeout=30)
