"""`celery -A dynamic_batching.gpu_workers.worker worker --device cuda:0 ...`: a Celery worker that runs
batches on one device.

The project's app, with the `--device` and `--preload` options and the device's
start-up step added in this process only.
"""

import sys
from typing import Any

from click import Option

from dynamic_batching.conf import conf
from dynamic_batching.protocol.app import configure_worker, get_app

from .step import DeviceStep

# This process consumes batching's queues alone: their settings apply here only.
app = configure_worker(get_app())
# One process per device, so one model copy and one CUDA context. It takes a batch only
# when it has room for one (prefetch 1 a thread), which is what makes dispatch
# worker-pull. With DEVICE_OVERLAP, a thread for the batch holding the device and one
# for each batch the collector sends ahead (at least one): those prepare, or write
# their answers, while it runs (gpu_workers/runner.py).


def pool() -> dict[str, Any]:
    """The device worker's pool settings under this process's DEVICE_OVERLAP."""
    overlap = conf.DEVICE_OVERLAP
    return {
        "worker_pool": "threads" if overlap else "solo",
        "worker_concurrency": 1 + max(1, conf.COLLECTOR_BATCHES_AHEAD) if overlap else 1,
        "worker_prefetch_multiplier": 1,
    }


def switch_interval_s() -> float:
    """How long one of the device worker's threads may hold the GIL while the other
    waits: with DEVICE_OVERLAP the batch taking the device waits that long at most for
    the one encoding its answers (Python's 5 ms made the median gap between two batches
    on a device 5-6 ms open loop, 0.5 ms makes it 2.3; docs/benchmarks.md)."""
    return conf.DEVICE_SWITCH_INTERVAL_MS / 1000 if conf.DEVICE_OVERLAP else sys.getswitchinterval()


app.conf.update(pool())
sys.setswitchinterval(switch_interval_s())
app.user_options["worker"].add(
    Option(["--device"], required=True, help="Run batches on this device (cuda:0, cpu:0, ...).")
)
app.user_options["worker"].add(
    Option(["--preload"], default=None, help="Comma-separated models to load at start (default: DEFAULT_MODEL).")
)
app.steps["worker"].add(DeviceStep)
