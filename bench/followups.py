"""What a request's Celery follow-ups cost its writer, per request (issue 39).

    .venv/bin/python bench/followups.py            # 2,000 outcomes per case
    .venv/bin/python bench/followups.py -n 5000

On a Redis of its own, the outcome writer stores N answers (in writes of 32, as a
device answers a batch), in four cases measured in turns in the same run:

- plain: no follow-ups, nothing listening to Celery's signals (the check alone);
- link: each request carries a `link` callback (the tracer runs, and publishes it);
- signals: a `task_success` receiver is connected (the tracer runs for every request);
- started: the STARTED state stored before the answer (task_track_started).

Prints microseconds per request and each case's ratio to `plain`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")

import django  # noqa: E402

django.setup()

from celery import signals, signature  # noqa: E402
from tqdm import tqdm  # noqa: E402

from batching_site.celery import app  # noqa: E402
from batching_site.harness import LocalSystem  # noqa: E402
from dynamic_batching.protocol.results import Outcome  # noqa: E402
from dynamic_batching.store.connection import connect  # noqa: E402
from dynamic_batching.store.outcomes import OutcomeWriter  # noqa: E402

BATCH = 32


def run(case: str, n: int, writer: OutcomeWriter) -> float:
    link = {"callbacks": [dict(signature("bench.noop", queue="bench.followups"))]}
    ids = [str(uuid.uuid4()) for _ in range(n)]
    t0 = time.perf_counter()
    for i in range(0, n, BATCH):
        part = ids[i : i + BATCH]
        if case == "started":
            writer.started(part, "cpu:0@bench")
        writer.write([Outcome(t, result=[0.5] * 8, celery=link if case == "link" else None) for t in part])
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=2000, help="outcomes per case and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    system = LocalSystem()
    try:
        system.start_redis()
        assert system.redis_url
        connect(system.redis_url)
        from dynamic_batching.edge import task  # noqa: F401 - registers batching.infer

        writer = OutcomeWriter(app)

        def heard(**_: object) -> None:
            pass

        cases = ["plain", "link", "signals", "started"]
        took: dict[str, list[float]] = {c: [] for c in cases}
        with tqdm(total=args.rounds * len(cases), desc="cases", unit="case") as bar:
            for _ in range(args.rounds):
                for case in cases:
                    if case == "signals":
                        signals.task_success.connect(heard)
                    try:
                        took[case].append(run(case, args.n, writer))
                    finally:
                        signals.task_success.disconnect(heard)
                    bar.update()
        base = statistics.median(took["plain"])
        print(f"outcome writes of {BATCH}, {args.n} requests per case, {args.rounds} rounds (median):")
        for case in cases:
            us = statistics.median(took[case])
            print(f"  {case:8s} {us:8.1f} us/request   x{us / base:.2f} of plain   (+{us - base:.1f} us)")
    finally:
        system.close()


if __name__ == "__main__":
    main()
