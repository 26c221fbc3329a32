"""`celery -A dynamic_batching.gpu_workers.worker worker --device cuda:0 ...`: a Celery worker that runs
batches on one device.

The project's app, with the `--device` and `--preload` options and the device's
start-up step added in this process only.
"""

import sys
from collections.abc import Sequence
from typing import Any

from click import Option

from dynamic_batching.conf import conf
from dynamic_batching.protocol.app import configure_worker, get_app

from .models import get_spec
from .models.base import beside_the_host
from .step import DeviceStep

# This process consumes batching's queues alone: their settings apply here only.
app = configure_worker(get_app())
# One process per device, so one model copy and one CUDA context. It takes a batch only
# when it has room for one (prefetch 1 a thread), which is what makes dispatch
# worker-pull. With DEVICE_OVERLAP, a thread for the batch holding the device and one
# for each batch the collector sends ahead (at least one): those prepare, or write
# their answers, while it runs (gpu_workers/runner.py).


def overlaps(device: str | None, models: Sequence[str]) -> bool:
    """DEVICE_OVERLAP, or by itself ("auto"): on where every model this worker loads
    runs beside the host (an accelerator, or the emulated one), off on a CPU device,
    where one batch's host work and the other's model share the same cores. MiniLM on
    2 CPU cores, `make run`'s set, alternated twice (docs/benchmarks.md, 2026-12-08):
    overlap on made 16 callers 71.5 and 61.3 texts/s against 79.9 and 80.4 off, and a
    lone request 3-4.5 ms slower."""
    if conf.DEVICE_OVERLAP is not None:
        return bool(conf.DEVICE_OVERLAP)
    if device is None:
        return True  # no device yet (imported outside a worker): as on an accelerator
    try:
        return all(get_spec(model).runs_beside_the_host(device) for model in models)
    except ValueError:
        return beside_the_host(device)  # an unknown model: the worker's start says so


def pool(overlap: bool) -> dict[str, Any]:
    """The device worker's pool settings, overlapping or not."""
    return {
        "worker_pool": "threads" if overlap else "solo",
        "worker_concurrency": 1 + max(1, conf.COLLECTOR_BATCHES_AHEAD) if overlap else 1,
        "worker_prefetch_multiplier": 1,
    }


def switch_interval_s(overlap: bool) -> float:
    """How long one of the device worker's threads may hold the GIL while the other
    waits: overlapping, the batch taking the device waits that long at most for the one
    encoding its answers (Python's 5 ms made the median gap between two batches on a
    device 5-6 ms open loop, 0.5 ms makes it 2.3; docs/benchmarks.md)."""
    return conf.DEVICE_SWITCH_INTERVAL_MS / 1000 if overlap else sys.getswitchinterval()


def own_option(flag: str, argv: Sequence[str]) -> str | None:
    """`flag`'s value on this worker's command line (tasks/processes.py::device_command).
    Read before Celery parses it: the pool is settled as the app is imported."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


_preload = own_option("--preload", sys.argv) or conf.DEFAULT_MODEL
OVERLAP = overlaps(own_option("--device", sys.argv), [m for m in _preload.split(",") if m])
app.conf.update(pool(OVERLAP))
sys.setswitchinterval(switch_interval_s(OVERLAP))
app.user_options["worker"].add(
    Option(["--device"], required=True, help="Run batches on this device (cuda:0, cpu:0, ...).")
)
app.user_options["worker"].add(
    Option(["--preload"], default=None, help="Comma-separated models to load at start (default: DEFAULT_MODEL).")
)
app.steps["worker"].add(DeviceStep)
