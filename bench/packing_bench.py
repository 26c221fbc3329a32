"""Packing by the learned cost against packing by length alone, on the system `make run`
starts (web, Flower, collectors and two CPU device workers under supervisord, MiniLM).

Each round starts the system twice on one Redis server, once with BATCHING_COST_PACKING=1 (the
default) and once with BATCHING_COST_PACKING=0, and drives each the way `make bench` drives its
headline run: 16 callers in a closed loop, each `submit(text).get()`. Rounds alternate
the order, so a machine that slows down over the run hurts both alike. It prints each
run, the learned cost line the collector's heartbeat shows, and the ratio.

    .venv/bin/python bench/packing_bench.py                  # 2 rounds of 1,500 texts
    .venv/bin/python bench/packing_bench.py --texts 600 --rounds 1
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # runnable as a plain script
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from tqdm import tqdm  # noqa: E402

from bench import run_all  # noqa: E402
from bench.workload import corpus  # noqa: E402


def one_run(b: run_all.Bench, redis_url: str, texts: list[str], packing: bool, n: int) -> dict[str, Any]:
    from dynamic_batching.store import shared_state

    system = run_all.make_run_system(
        redis_url, b.logs / f"packing-{int(packing)}", BATCHING_COST_PACKING=str(int(packing))
    )
    with run_all._serving(b, system, redis_url) as call:
        b.load("warm-up", call, texts[: b.sizes.warmup], run_all.MAIN_THREADS)
        before = run_all._pipeline_stats(shared_state)
        label = "cost packing" if packing else "length only"
        run = b.load(label, call, texts[b.sizes.warmup : b.sizes.warmup + n], run_all.MAIN_THREADS)
        stats = run_all._pipeline_stats(shared_state, since=before)
        costs = (shared_state.read_collector() or {}).get("costs", {})
    return {
        "packing": label,
        "texts_per_s": round(run.throughput, 1),
        "p50_ms": round(run.percentile_ms(50), 1),
        "p99_ms": round(run.percentile_ms(99), 1),
        "mean_batch": stats["mean_batch_size"],
        "device_busy": stats["device_busy_share"],
        "line": costs.get("minilm"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=1500, help="texts per run (after a 32-text warm-up)")
    ap.add_argument("--rounds", type=int, default=2, help="each round runs both, alternating which goes first")
    args = ap.parse_args()

    out = REPO / "bench" / "out" / "packing"
    texts = corpus(args.texts + run_all.FULL.warmup)
    total = args.rounds * 2 * (args.texts + run_all.FULL.warmup)
    rows = []
    with tqdm(total=total, unit="text", desc="packing") as bar, run_all.redis_server(out / "logs") as (url, pid):
        b = run_all.Bench(sizes=run_all.FULL, out=out, bar=bar, redis_pid=pid)
        for k in range(args.rounds):
            for packing in (True, False) if k % 2 == 0 else (False, True):
                rows.append(one_run(b, f"{url}/0", texts, packing, args.texts))

    print(
        "\n| packing | texts/s | p50 ms | p99 ms | mean batch | devices busy | learned line (ms a batch, us a token) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        line = r["line"] or {}
        print(
            f"| {r['packing']} | {r['texts_per_s']} | {r['p50_ms']} | {r['p99_ms']} | {r['mean_batch']} | "
            f"{r['device_busy']} | {line.get('batch_ms', '-')} / {line.get('token_us', '-')} |"
        )
    mean = {
        label: sum(r["texts_per_s"] for r in rows if r["packing"] == label)
        / max(1, sum(1 for r in rows if r["packing"] == label))
        for label in ("cost packing", "length only")
    }
    print(
        f"\ncost packing / length only: {mean['cost packing']:.1f} / {mean['length only']:.1f} texts/s = "
        f"{mean['cost packing'] / mean['length only']:.2f}x"
    )


if __name__ == "__main__":
    main()
