"""Where one idle request's time goes, leg by leg, on the system `make run` starts.

One caller sends requests one at a time (a pause between them, so every request finds
the system idle) and reads each request's own record of its path:

    submit        the edge: validate, count tokens, the admission script (caller's clock)
    to collector  queued until the collector put it in a batch and sent it
    to device     the batch task on the broker until the device worker started it
    run           the model call
    to answer     the model call's end until the answer was written
    to caller     the answer written until the caller's .get() returned

Each leg's median is printed for the chosen process set; `--compare` runs the harness's
set (no web, no Flower, WARNING logging) too, and plain Celery's round trip for the same
model (one task per request, a 2-process prefork worker, as in `make bench`): the
target is an idle p50 within 1.2x of plain Celery's. A leg's clock changes hands between
processes on one host, so legs are accurate to well under a millisecond here.

    .venv/bin/python bench/idle_legs.py                   # MiniLM, make run's process set
    .venv/bin/python bench/idle_legs.py --model synthetic --compare
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
# Benchmarks drive the test model `synthetic`, here and in the processes they start.
os.environ.setdefault("BATCHING_TEST_MODELS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import django  # noqa: E402

django.setup()

from tqdm import tqdm  # noqa: E402

from batching_site.celery import app  # noqa: E402
from batching_site.harness import LocalSystem  # noqa: E402
from dynamic_batching.edge.client import submit  # noqa: E402
from dynamic_batching.store.connection import connect  # noqa: E402

LEGS = ("submit", "to collector", "to device", "run", "to answer", "to caller", "total")


def measure(model: str, n: int, pause_s: float, label: str) -> dict[str, float]:
    legs: list[dict[str, float]] = []
    for i in tqdm(range(n), desc=label, unit="req", leave=False):
        t0 = time.time()
        result = submit(f"an idle request {i} with a few words in it", model=model)
        t1 = time.time()
        result.get(timeout=30)
        t2 = time.time()
        meta = app.backend.get_task_meta(result.id)
        b: dict[str, Any] = meta["batching"]
        done = datetime.fromisoformat(meta["date_done"]).timestamp()
        ran_until = b["started_at"] + b["run_ms"] / 1000
        legs.append(
            {
                "submit": t1 - t0,
                "to collector": b["dispatched_at"] - b["submitted_at"],
                "to device": b["started_at"] - b["dispatched_at"],
                "run": b["run_ms"] / 1000,
                "to answer": done - ran_until,
                "to caller": t2 - done,
                "total": t2 - t0,
            }
        )
        threading.Event().wait(pause_s)
    legs = legs[n // 10 :]  # the first few warm connections and caches
    return {leg: statistics.median(x[leg] for x in legs) * 1000 for leg in LEGS}


def plain_celery(model: str, n: int, pause_s: float) -> float:
    """Plain Celery's median idle round trip in ms, `embed.delay(text).get()` (MiniLM),
    or its no-op task for the zero-cost synthetic model."""
    from bench.baselines import plain_celery as plain
    from bench.baselines.common import Worker
    from bench.run_all import redis_server

    task = plain.embed if model == "minilm" else plain.noop
    logs = REPO / "bench/out/idle-legs"
    with (
        redis_server(logs) as (base, _),
        Worker(
            "bench.baselines.plain_celery",
            plain.app,
            f"{base}/1",
            args=["-P", "prefork", "-c", "2", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            env={"TORCH_THREADS": "1", "BENCH_PRELOAD_MINILM": "1" if model == "minilm" else ""},
            log_path=logs / "plain_celery.log",
        ),
    ):
        took = []
        for i in tqdm(range(n), desc="plain Celery", unit="req", leave=False):
            t0 = time.time()
            task.delay(f"an idle request {i} with a few words in it").get(timeout=60)
            took.append(time.time() - t0)
            threading.Event().wait(pause_s)
    return statistics.median(took[n // 10 :]) * 1000


def system(model: str, make_run: bool) -> LocalSystem:
    # Here, not at the top, as in plain_celery(): run_all imports the baselines, which
    # need the bench's extra packages.
    from bench.run_all import ZERO_COST, make_run_system

    if make_run:
        return make_run_system(None, REPO / "bench/out/idle-legs/make-run", preload=model, **ZERO_COST)
    return LocalSystem(devices=["cpu:0", "cpu:1"], preload=model, env={**ZERO_COST, "LOG_LEVEL": "WARNING"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="minilm")
    ap.add_argument("-n", type=int, default=200, help="requests per process set")
    ap.add_argument("--pause", type=float, default=0.02, help="seconds between requests")
    ap.add_argument("--compare", action="store_true", help="also the harness's process set")
    args = ap.parse_args()
    columns = {}
    for name, make_run in [("make run", True)] + ([("harness", False)] if args.compare else []):
        with system(args.model, make_run) as s:
            connect(s.redis_url)
            columns[name] = measure(args.model, args.n, args.pause, name)
    names = list(columns)
    print(f"\nmedian ms per leg, {args.model}, {args.n} idle requests each\n")
    print("| leg | " + " | ".join(names) + " |")
    print("| --- | " + " | ".join("---:" for _ in names) + " |")
    for leg in LEGS:
        print(f"| {leg} | " + " | ".join(f"{columns[n][leg]:.2f}" for n in names) + " |")
    if args.compare:
        plain = plain_celery(args.model, args.n, args.pause)
        ratios = ", ".join(f"{n} {columns[n]['total'] / plain:.2f}x" for n in names)
        print(f"\nplain Celery, one task per request: {plain:.2f} ms; idle p50 against it: {ratios} (target <= 1.2x)")


if __name__ == "__main__":
    main()
