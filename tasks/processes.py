"""The command lines of the batching worker processes: the collector and a device worker.

One definition for every way they start: `manage.py batching_worker` in any Django
project, and this repository's `make run`, test harness and containers
(batching_site/processes.py), so what a host project runs is what the tests ran.
"""

from __future__ import annotations

import os
import sys

from .protocol.names import CONTROL_QUEUE, SHARED_BATCH_QUEUES, device_queue_name


def celery_command(app: str, *args: str) -> list[str]:
    """`celery -A app ...` on this interpreter, so a worker runs in the caller's venv."""
    return [sys.executable, "-m", "celery", "-A", app, *args]


def log_level(given: str | None) -> str:
    # The same LOG_LEVEL that a settings module's LOGGING may read, so one variable
    # quiets every process: the benchmark runs all systems at WARNING.
    return given or os.environ.get("LOG_LEVEL", "INFO")


def collector_command(*, name: str = "collector", loglevel: str | None = None) -> list[str]:
    """A collector. Any number may run: one is active (it holds the lease), the others
    stand by to take over (tasks/store/lease.py)."""
    level = log_level(loglevel)
    return celery_command(
        "dynamic_batching.collector.worker", "worker", "-n", f"{name}@%h", "-Q", CONTROL_QUEUE,
        "-P", "solo", "-c", "1", "--without-gossip", "--without-mingle", "-l", level,
    )  # fmt: skip


def device_command(device: str, *, preload: str | None = None, loglevel: str | None = None) -> list[str]:
    """A device worker for `device` (cuda:0, or cpu:0 for a simulated device), loading
    `preload` (comma-separated models; default DEFAULT_MODEL) at start."""
    level = log_level(loglevel)
    # The pool, its size and the prefetch are the worker's own (gpu_workers/worker.py:
    # one process, one batch on the device at a time, DEVICE_OVERLAP).
    queues = ",".join([*SHARED_BATCH_QUEUES, device_queue_name(device)])
    cmd = celery_command(
        "dynamic_batching.gpu_workers.worker", "worker", "--device", device, "-n", f"gpu-{device.replace(':', '')}@%h", "-Q", queues,
        "--without-gossip", "--without-mingle", "-l", level,
    )  # fmt: skip
    if preload:
        cmd += ["--preload", preload]
    return cmd
