"""Where a device's time goes between two batches, under a closed loop of N callers.

At 16 callers the devices run their model only part of the wall time (`make bench`
prints it: "devices busy 84%"). This reads why from each request's own record of its
path (its `details`: dispatched_at, started_at, run_ms, device) and its answer's time
(date_done, stamped as the outcome write is built), batch by batch, device by device:

    run end -> answers          the device's work after the model: outcomes, events
    answers -> next dispatched  the callers of the finished batch get their answers and
                                send their next texts, the collector takes them and
                                sends the next batch (negative: it was already queued)
    next dispatched -> started  the next batch on the broker until the device starts it:
                                its bookkeeping after the last batch (ack, events, the
                                taken set) and its wake-up

The gap is the sum of the first leg and of the larger of the second's end and the
third's start. Times come from different processes on one host, each correct to well
under a millisecond here; medians and means over every pair of consecutive batches.

    .venv/bin/python bench/device_gaps.py                    # the harness, 16 callers
    .venv/bin/python bench/device_gaps.py --callers 64 --make-run
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import django  # noqa: E402

django.setup()

from tqdm import tqdm  # noqa: E402

from batching_site.celery import app  # noqa: E402
from batching_site.harness import LocalSystem  # noqa: E402
from bench.run_all import _publish_and_wait  # noqa: E402
from bench.workload import closed_loop, corpus  # noqa: E402
from tasks.edge.client import submit  # noqa: E402
from tasks.store import shared_state  # noqa: E402
from tasks.store.connection import connect  # noqa: E402

LEGS = ("run end -> answers", "answers -> next dispatched", "next dispatched -> started", "gap")


def run(callers: int, n_texts: int, make_run: bool) -> dict[str, Any]:
    texts = corpus(n_texts + 100)
    env = {"LOG_LEVEL": "INFO" if make_run else "WARNING", "TORCH_THREADS": "1"}
    system = LocalSystem(devices=["cpu:0", "cpu:1"], preload="minilm", env=env, web=make_run, flower=make_run)
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
        batches: dict[str, tuple[str, float, float, float, float, int]] = {}
        for task_id in ids:
            meta = app.backend.get_task_meta(task_id)
            b = meta["batching"]
            answered = datetime.fromisoformat(meta["date_done"]).timestamp()
            row = (b["device"], b["started_at"], b["dispatched_at"], b["run_ms"] / 1000, answered, b["batch_size"])
            batches.setdefault(b["batch_id"], row)
    return {"loop": loop, "batches": batches}


def legs(batches: dict[str, tuple[str, float, float, float, float, int]]) -> dict[str, list[float]]:
    by_device: dict[str, list[tuple[float, float, float, float]]] = {}
    for device, started, dispatched, run_s, answered, _ in batches.values():
        by_device.setdefault(device, []).append((started, dispatched, run_s, answered))
    out: dict[str, list[float]] = {leg: [] for leg in LEGS}
    for rows in by_device.values():
        rows.sort()
        for (started, _, run_s, answered), (next_started, next_dispatched, _, _) in itertools.pairwise(rows):
            ran_until = started + run_s
            out["run end -> answers"].append(answered - ran_until)
            out["answers -> next dispatched"].append(next_dispatched - answered)
            out["next dispatched -> started"].append(next_started - max(next_dispatched, answered))
            out["gap"].append(next_started - ran_until)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--callers", type=int, default=16)
    ap.add_argument("--texts", type=int, default=1000, help="texts measured (after 100 to warm up)")
    ap.add_argument("--make-run", action="store_true", help="make run's process set: web, Flower, INFO logging")
    args = ap.parse_args()
    result = run(args.callers, args.texts, args.make_run)
    loop, batches = result["loop"], result["batches"]
    busy = sum(row[3] for row in batches.values())
    devices = len({row[0] for row in batches.values()})
    sizes = [row[5] for row in batches.values()]
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
