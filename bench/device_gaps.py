"""Where a device's time goes between two batches, under a closed loop of N callers.

At 16 callers the devices run their model only part of the wall time (`make bench`
prints it: "devices busy 84%"). This reads why from each request's own record of its
path (its `details`: dispatched_at, started_at, run_ms, device), batch by batch,
device by device:

    run end -> next dispatched   the callers of the finished batch get their answers
                                 and send their next texts, and the collector takes
                                 them and sends the next batch (negative: it was
                                 already queued when the run ended)
    -> started                   from that, or from the run's end if the batch was
                                 queued already, until the device starts it: its
                                 bookkeeping after the last batch (answers, ack,
                                 events) and its wake-up
    gap                          the run's end to the next start, on the device's clock

Every time here is on Redis's clock (tasks/store/clock.py) as each process measures
it, so the two legs that cross processes carry up to half a round trip of error
each, which on a loaded 2-core host is a millisecond or two; the gap does not.
Medians and means over every pair of consecutive batches on one device.

    .venv/bin/python bench/device_gaps.py                    # the harness, 16 callers
    .venv/bin/python bench/device_gaps.py --callers 64 --make-run
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import django  # noqa: E402

django.setup()

from tqdm import tqdm  # noqa: E402

from batching_site.celery import app  # noqa: E402
from batching_site.harness import LocalSystem  # noqa: E402
from bench.workload import closed_loop, corpus  # noqa: E402
from dynamic_batching.edge.client import submit  # noqa: E402
from dynamic_batching.store import shared_state  # noqa: E402
from dynamic_batching.store.connection import connect  # noqa: E402

LEGS = ("run end -> next dispatched", "-> started", "gap")


class Ran(NamedTuple):
    """One batch, as its requests' records tell it (times in seconds, Redis's clock)."""

    device: str
    started: float
    dispatched: float
    run_s: float
    size: int


def run(callers: int, n_texts: int, make_run: bool) -> dict[str, Any]:
    # Here, not at the top: run_all imports the baselines, which need the bench's
    # extra packages, and `legs` is tested without them.
    from bench.run_all import _publish_and_wait, make_run_system

    texts = corpus(n_texts + 100)
    if make_run:
        system = make_run_system(None, Path(tempfile.mkdtemp(prefix="device-gaps-")))
    else:
        # The harness rows of `make bench`: WARNING logging, one torch thread a device.
        env = {"LOG_LEVEL": "WARNING", "TORCH_THREADS": "1"}
        system = LocalSystem(devices=["cpu:0", "cpu:1"], preload="minilm", env=env)
    ids: list[str] = []
    lock = threading.Lock()

    def call(text: str) -> None:
        result = submit(text)
        result.get(timeout=120)
        with lock:
            ids.append(result.id)

    with system:
        connect(system.redis_url)
        policy = shared_state.read_policy()
        # As `make bench`: texts past the model's limit are cut, not refused.
        _publish_and_wait(shared_state, policy.evolve(oversized="truncate", version=policy.version + 1))
        closed_loop("warm-up", call, texts[:100], callers)
        ids.clear()
        with tqdm(total=n_texts, desc=f"{callers} callers", unit="text", leave=False) as bar:
            loop = closed_loop("measured", call, texts[100:], callers, on_done=bar.update)
        batches: dict[str, Ran] = {}
        for task_id in ids:
            meta = app.backend.get_task_meta(task_id)
            b = meta["batching"]
            ran = Ran(b["device"], b["started_at"], b["dispatched_at"], b["run_ms"] / 1000, b["batch_size"])
            batches.setdefault(b["batch_id"], ran)
    return {"loop": loop, "batches": batches}


def legs(batches: dict[str, Ran]) -> dict[str, list[float]]:
    by_device: dict[str, list[Ran]] = {}
    for ran in batches.values():
        by_device.setdefault(ran.device, []).append(ran)
    out: dict[str, list[float]] = {leg: [] for leg in LEGS}
    for rows in by_device.values():
        rows.sort(key=lambda ran: ran.started)
        for this, following in itertools.pairwise(rows):
            ran_until = this.started + this.run_s
            out["run end -> next dispatched"].append(following.dispatched - ran_until)
            out["-> started"].append(following.started - max(following.dispatched, ran_until))
            out["gap"].append(following.started - ran_until)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--callers", type=int, default=16)
    ap.add_argument("--texts", type=int, default=1000, help="texts measured (after 100 to warm up)")
    ap.add_argument(
        "--make-run", action="store_true", help="make run's process set (bench/run_all.py::make_run_system)"
    )
    args = ap.parse_args()
    result = run(args.callers, args.texts, args.make_run)
    loop, batches = result["loop"], result["batches"]
    busy = sum(ran.run_s for ran in batches.values())
    devices = len({ran.device for ran in batches.values()})
    sizes = [ran.size for ran in batches.values()]
    rate = loop.requests / loop.wall_s
    print(
        f"\n{'make run' if args.make_run else 'harness'}, {args.callers} callers, {loop.requests} texts: "
        f"{rate:.1f} texts/s, {len(batches)} batches of {statistics.mean(sizes):.2f} on average, "
        f"devices in their model {busy / (loop.wall_s * devices):.0%} of the wall time\n"
    )
    print("| between two batches on one device | median ms | mean ms |")
    print("| --- | ---: | ---: |")
    for leg, xs in legs(batches).items():
        print(f"| {leg} | {statistics.median(xs) * 1000:.2f} | {statistics.mean(xs) * 1000:.2f} |")


if __name__ == "__main__":
    main()
