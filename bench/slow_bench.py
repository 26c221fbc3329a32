"""Slow-request isolation: does 1% of pathological inputs hurt everybody else?

Steady open-loop load (Poisson arrivals) on the synthetic model with two devices. The
same arrival stream is run three times in one go:

    baseline     no slow inputs
    isolation    1% of requests are slow (20x cost), drawn from a few repeat offenders
    no-isolation the same slow inputs with isolation switched off (SLOW_ISOLATION=0)

and the p50/p99 latency of the *normal* requests is compared, as ratios to baseline.
Target (issue 4): isolation p99 <= 1.25x baseline p99.

    .venv/bin/python bench/slow_bench.py            # about 2 minutes
    .venv/bin/python bench/slow_bench.py --seconds 10 --rate 80
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
# Benchmarks drive the test model `synthetic`, here and in the processes they start.
os.environ.setdefault("BATCHING_TEST_MODELS", "1")

import django  # noqa: E402

django.setup()

from tqdm import tqdm  # noqa: E402

from batching_site.celery import app  # noqa: E402
from batching_site.harness import LocalSystem  # noqa: E402
from tasks.edge.client import submit  # noqa: E402
from tasks.store.connection import connect  # noqa: E402

SYNTHETIC_ENV = {"SYNTHETIC_OVERHEAD_S": "0.004", "SYNTHETIC_PER_TOKEN_S": "0.0003"}


def arrivals(rate: float, seconds: float, slow_share: float, seed: int) -> list[tuple[float, str, bool]]:
    rng = random.Random(seed)
    offenders = [f"pathological input {k} !slow " + "z " * rng.randint(8, 20) for k in range(4)]
    t, out = 0.0, []
    i = 0
    while t < seconds:
        t += rng.expovariate(rate)
        slow = rng.random() < slow_share
        text = rng.choice(offenders) if slow else f"steady request {i} " + "w " * rng.choice([3] * 7 + [20] * 3)
        out.append((t, text, slow))
        i += 1
    return out


def run(stream: list[tuple[float, str, bool]], label: str) -> list[float]:
    """Submit on schedule; return latencies (ms) of the normal requests."""
    pending: list[tuple[object, bool]] = []
    start = time.monotonic()
    for at, text, slow in tqdm(stream, desc=label, unit="req", leave=False, mininterval=1.0):
        delay = start + at - time.monotonic()
        if delay > 0:
            threading.Event().wait(delay)
        pending.append((submit(text, model="synthetic"), slow))
    latencies = []
    for result, slow in pending:
        result.get(timeout=120)  # type: ignore[attr-defined]
        if slow:
            continue
        meta = app.backend.get_task_meta(result.id)  # type: ignore[attr-defined]
        done = datetime.fromisoformat(meta["date_done"]).timestamp()
        latencies.append((done - meta["batching"]["submitted_at"]) * 1000)
    return latencies


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=100.0, help="requests per second offered")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--slow-share", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--factor", type=float, default=4.0, help="watchdog limit, times the expected batch time")
    ap.add_argument("--floor", type=float, default=0.05, help="watchdog limit never below this, seconds")
    args = ap.parse_args()

    rows = []
    for label, slow_share, isolation in [
        ("baseline", 0.0, "1"),
        ("isolation", args.slow_share, "1"),
        ("no-isolation", args.slow_share, "0"),
    ]:
        stream = arrivals(args.rate, args.seconds, slow_share, args.seed)
        env = {
            **SYNTHETIC_ENV,
            "SLOW_ISOLATION": isolation,
            "SLOW_FACTOR": str(args.factor),
            "SLOW_FLOOR_S": str(args.floor),
        }
        with LocalSystem(preload="synthetic", env=env) as system:
            assert system.redis_url
            connect(system.redis_url)
            warm = arrivals(args.rate, 3.0, 0.0, args.seed + 1)  # let cost models learn first
            run(warm, f"{label} warm-up")
            lat = run(stream, label)
        rows.append((label, len(lat), pct(lat, 0.5), pct(lat, 0.99), max(lat)))

    base_p50, base_p99 = rows[0][2], rows[0][3]
    print(
        f"\n{args.rate:.0f} req/s for {args.seconds:.0f} s, {args.slow_share:.0%} slow inputs (20x cost), "
        f"2 devices, watchdog {args.factor:g}x expected (floor {args.floor:g} s)\n"
    )
    print("| run | normal requests | p50 ms | p99 ms | max ms | p50 vs baseline | p99 vs baseline |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, n, p50, p99, mx in rows:
        print(f"| {label} | {n} | {p50:.1f} | {p99:.1f} | {mx:.1f} | {p50 / base_p50:.2f}x | {p99 / base_p99:.2f}x |")
    ratio = rows[1][3] / base_p99
    print(f"\ntarget: isolation p99 <= 1.25x baseline: {'met' if ratio <= 1.25 else 'MISSED'} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
