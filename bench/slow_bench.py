"""Slow-request isolation: does 1% of pathological inputs hurt everybody else, and does a
busy machine make innocent inputs look slow?

Open-loop load (Poisson arrivals) on the synthetic model, on the process set `make run`
starts (web, Flower, collector and standby, one worker per device, under supervisord).
Each row is a fresh system:

    baseline     no slow inputs
    slow 1%      1% of requests are slow (20x cost), from a few repeat offenders
    contention   no slow inputs, and CPU burners (one per core) on the same cores

It records normal traffic's p50/p99 (and their ratio to the baseline on the same
number of devices), how many slow inputs were isolated, and false positives: ordinary
requests isolated as slow. One run's p99 rests on its 30 worst requests, and where a
new offender first lands moves it a lot: `--rounds N` runs N baseline/slow pairs per
device count, each pair on its own arrival stream (seed + round), and reports the
median ratio. For the worst 1% of normal requests it shows how many shared a batch
with a slow input, and where their time went. Targets (issue 17): p99 with 1% slow
inputs <= 1.25x the baseline on one device and on two; 0 false positives under
contention.

    .venv/bin/python bench/slow_bench.py                     # about 6 minutes
    .venv/bin/python bench/slow_bench.py --seconds 10 --devices 2
    .venv/bin/python bench/slow_bench.py --devices 1 --rounds 5 --contention-requests 0
    .venv/bin/python bench/slow_bench.py --devices 1 --rounds 0      # the contention run alone
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from dynamic_batching.conf import conf

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
from dynamic_batching.core.policy import BatchPolicy  # noqa: E402
from dynamic_batching.edge.client import submit  # noqa: E402
from dynamic_batching.store import shared_state  # noqa: E402
from dynamic_batching.store.connection import connect  # noqa: E402

SYNTHETIC_ENV = {"SYNTHETIC_OVERHEAD_S": "0.004", "SYNTHETIC_PER_TOKEN_S": "0.0003"}


def arrivals(
    rate: float, seconds: float, slow_share: float, seed: int, count: int | None = None
) -> list[tuple[float, str, bool]]:
    """Poisson arrivals for `seconds`, or exactly `count` of them."""
    rng = random.Random(seed)
    offenders = [f"pathological input {k} !slow " + "z " * rng.randint(8, 20) for k in range(4)]
    t, out = 0.0, []
    i = 0
    while (t < seconds) if count is None else (i < count):
        t += rng.expovariate(rate)
        slow = rng.random() < slow_share
        text = rng.choice(offenders) if slow else f"steady request {i} " + "w " * rng.choice([3] * 7 + [20] * 3)
        out.append((t, text, slow))
        i += 1
    return out


def run(stream: list[tuple[float, str, bool]], label: str) -> dict[str, Any]:
    """Submit on schedule; the normal requests' latencies (ms), who was isolated, and the
    anatomy of the worst 1%."""
    pending: list[tuple[object, bool]] = []
    start = time.monotonic()
    for at, text, slow in tqdm(stream, desc=label, unit="req", leave=False, mininterval=1.0):
        delay = start + at - time.monotonic()
        if delay > 0:
            threading.Event().wait(delay)
        pending.append((submit(text, model="synthetic"), slow))
    false_positives, slow_total, slow_isolated = 0, 0, 0
    normal: list[tuple[float, dict[str, Any]]] = []  # (latency ms, its `batching` details)
    slow_batches: set[str] = set()
    for result, slow in pending:
        result.get(timeout=120)  # type: ignore[attr-defined]
        meta = app.backend.get_task_meta(result.id)  # type: ignore[attr-defined]
        isolated = bool(meta["batching"].get("isolated"))
        if slow:
            slow_total += 1
            slow_isolated += isolated
            slow_batches.add(meta["batching"].get("batch_id"))
            continue
        false_positives += isolated
        done = datetime.fromisoformat(meta["date_done"]).timestamp()
        normal.append(((done - meta["batching"]["submitted_at"]) * 1000, meta["batching"]))
    return {
        "latencies": [lat for lat, _ in normal],
        "tail": tail_anatomy(normal, slow_batches),
        "false_positives": false_positives,
        "slow_total": slow_total,
        "slow_isolated": slow_isolated,
    }


def tail_anatomy(normal: list[tuple[float, dict[str, Any]]], slow_batches: set[str]) -> dict[str, float]:
    """The worst 1% of normal requests (latency ms, their `batching` details): how many
    shared a batch with a slow input, and their median wait in the queue, their batch's
    own run, and the rest (time the batch lent to others while it yielded, delivery)."""
    if not normal:  # a run of slow inputs only (the --known warm-up)
        return {"with_slow": 0, "count": 0, "wait_ms": 0.0, "run_ms": 0.0, "rest_ms": 0.0}
    worst = sorted(normal, key=lambda x: x[0])[-max(1, len(normal) // 100) :]
    wait = [d.get("waited_ms", 0.0) for _, d in worst]
    run_ = [d.get("run_ms", 0.0) for _, d in worst]
    return {
        "with_slow": sum(1 for _, d in worst if d.get("batch_id") in slow_batches),
        "count": len(worst),
        "wait_ms": statistics.median(wait),
        "run_ms": statistics.median(run_),
        "rest_ms": statistics.median(lat - w - r for (lat, _), w, r in zip(worst, wait, run_, strict=True)),
    }


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _burn() -> None:
    while True:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=100.0, help="requests per second offered")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--contention-requests", type=int, default=5000, help="requests in the contention run")
    ap.add_argument("--slow-share", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--rounds", type=int, default=1, help="baseline/slow pairs per device count (median ratio)")
    ap.add_argument("--devices", type=int, choices=[1, 2], default=None, help="only this many devices")
    ap.add_argument("--lane", choices=["share", "idle"], default="share", help="the slow lane's policy")
    ap.add_argument(
        "--share",
        type=float,
        default=BatchPolicy.slow_lane_share,
        help="under 'share': the slow lane's share of device time",
    )
    ap.add_argument(
        "--factor", type=float, default=conf.SLOW_FACTOR, help="watchdog limit, times the expected batch time"
    )
    ap.add_argument("--floor", type=float, default=conf.SLOW_FLOOR_S, help="watchdog limit never below this, seconds")
    ap.add_argument(
        "--known", action="store_true", help="the warm-up sends each offender once: measure known inputs only"
    )
    args = ap.parse_args()

    plan = []
    for n in [args.devices] if args.devices else [1, 2]:
        for k in range(args.rounds):
            plan += [
                ("baseline", n, k, 0.0, False, None),
                ("slow 1%", n, k, args.slow_share, False, None),
            ]
    if args.contention_requests:
        plan.append(("contention", args.devices or 2, 0, 0.0, True, args.contention_requests))

    rows = []
    for label, devices, round_, slow_share, burn, count in tqdm(plan, desc="rows", unit="row"):
        stream = arrivals(args.rate, args.seconds, slow_share, args.seed + round_, count)
        burners = []
        env = {**SYNTHETIC_ENV, "BATCHING_SLOW_FACTOR": str(args.factor), "BATCHING_SLOW_FLOOR_S": str(args.floor)}
        system = LocalSystem(
            devices=[f"cpu:{i}" for i in range(devices)], preload="synthetic", env=env, web=True, flower=True
        )
        with system:
            connect(system.redis_url)
            shared_state.publish_policy(BatchPolicy(slow_lane=args.lane, slow_lane_share=args.share))
            run(arrivals(args.rate, 3.0, 0.0, args.seed + 1), f"{label} warm-up")  # let cost models learn
            if args.known and slow_share:
                offenders = sorted({text for _, text, slow in stream if slow})
                run([(0.2 * k, text, True) for k, text in enumerate(offenders)], f"{label} offenders")
            if burn:
                ctx = multiprocessing.get_context("fork")
                burners = [ctx.Process(target=_burn, daemon=True) for _ in range(os.cpu_count() or 2)]
                for b in burners:
                    b.start()
            try:
                out = run(stream, f"{label}, {devices} device(s)")
            finally:
                for b in burners:
                    b.kill()
        lat = out["latencies"]
        rows.append(
            {
                "run": label,
                "devices": devices,
                "round": round_,
                "normal": len(lat),
                "p50_ms": pct(lat, 0.5),
                "p99_ms": pct(lat, 0.99),
                "slow": out["slow_total"],
                "slow_isolated": out["slow_isolated"],
                "false_positives": out["false_positives"],
                "tail": out["tail"],
            }
        )

    print(
        f"\n{args.rate:.0f} req/s open loop, {args.slow_share:.0%} slow inputs (20x cost) in the slow runs, "
        f"slow lane policy {args.lane!r} (share {args.share:g}), watchdog {args.factor:g}x expected (floor {args.floor:g} s); "
        f"contention: {os.cpu_count()} CPU burners\n"
    )
    print(
        "| run | devices | round | normal requests | p50 ms | p99 ms | p99 vs baseline | slow isolated "
        "| false positives | worst 1%: a slow input's batch-mates | its wait / run / rest ms |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    base = {(r["devices"], r["round"]): r["p99_ms"] for r in rows if r["run"] == "baseline"}
    ratios: dict[int, list[float]] = {}
    for r in rows:
        t = r["tail"]
        b = base.get((r["devices"], r["round"]))
        ratio = r["p99_ms"] / b if b else float("nan")
        if r["run"] == "slow 1%" and b:
            ratios.setdefault(r["devices"], []).append(ratio)
        print(
            f"| {r['run']} | {r['devices']} | {r['round']} | {r['normal']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} "
            f"| {f'{ratio:.2f}x' if b else '–'} | {r['slow_isolated']}/{r['slow']} | {r['false_positives']} "
            f"| {t['with_slow']}/{t['count']} | {t['wait_ms']:.0f} / {t['run_ms']:.0f} / {t['rest_ms']:.0f} |"
        )
    for devices, rs in ratios.items():
        shown = ", ".join(f"{x:.2f}x" for x in rs)
        print(f"\n{devices} device(s): p99 with slow inputs vs without, median {statistics.median(rs):.2f}x ({shown})")
    print("\n" + json.dumps(rows))


if __name__ == "__main__":
    main()
