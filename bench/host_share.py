"""How much of a batch's time under the device lock is host work that `prepare` takes off it.

A torch adapter's batch is tokenized and padded on the host (`TorchRunner.collate`)
and then run on the device (`forward_features`). The device worker calls `prepare`
before the batch waits for the device lock, so with DEVICE_OVERLAP the tokenizing
happens while another batch holds the device. This loads one runner (MiniLM by
default) and, for each batch size, times over the same texts:

    collate     prepare alone: the host's share, done off the device
    unprepared  run_batch as before: collate, forward and the copy to the host, all
                under the device lock
    prepared    run_batch after prepare: only the device's part is under the lock

and prints the share of the lock's time that prepare takes off the device. On a CPU
the forward dwarfs the tokenizing; on a GPU, where a batch of 64 short texts runs in a
few milliseconds, the same host time is a large part of each batch: the device time
each row would have against it is printed for the emulated accelerator's defaults
(gpu_workers/models/emulated.py, calibrated to MiniLM on a V100).

    .venv/bin/python bench/host_share.py                       # MiniLM on cpu:0
    .venv/bin/python bench/host_share.py --sizes 1 16 64 --rounds 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")

import django  # noqa: E402

django.setup()

from tqdm import tqdm  # noqa: E402

from bench.workload import corpus  # noqa: E402
from dynamic_batching.gpu_workers.models import get_spec  # noqa: E402
from dynamic_batching.gpu_workers.models.emulated import DEFAULT_OVERHEAD_MS, DEFAULT_PER_TOKEN_US  # noqa: E402


def timed(fn, *args) -> float:  # noqa: ANN001 - a callable and its arguments
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--device", default="cpu:0")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--rounds", type=int, default=10, help="batches timed per size (after one to warm up)")
    ap.add_argument("--short", action="store_true", help="short texts only (about 10 words), as chat-like traffic")
    args = ap.parse_args()

    spec = get_spec(args.model)
    runner = spec.load(args.device)
    texts = corpus(4000)
    if args.short:
        texts = [t for t in texts if len(t.split()) <= 16]
    rows = []
    for size in args.sizes:
        collate, unprepared, prepared, padded = [], [], [], []
        for i in tqdm(range(args.rounds + 1), desc=f"batches of {size}", unit="batch", leave=False):
            start = (i * size) % max(1, len(texts) - size)
            batch = texts[start : start + size]
            u = timed(runner.run_batch, batch)  # nothing prepared for it: collated under the lock
            c = timed(runner.prepare, batch)
            p = timed(runner.run_batch, batch)  # what prepare kept
            if i:  # the first of each size warms up
                collate.append(c)
                unprepared.append(u)
                prepared.append(p)
                padded.append(size * max(spec.count_tokens(t) for t in batch))
        rows.append(
            {
                "size": size,
                "collate": statistics.median(collate) * 1000,
                "unprepared": statistics.median(unprepared) * 1000,
                "prepared": statistics.median(prepared) * 1000,
                "emulated": DEFAULT_OVERHEAD_MS + statistics.median(padded) * DEFAULT_PER_TOKEN_US / 1000,
            }
        )
    runner.close()
    print(f"\n{args.model} on {args.device}, medians of {args.rounds} batches each (ms)\n")
    print(
        "| batch | collate (host) | under the lock, unprepared | under the lock, prepared "
        "| taken off the lock | emulated V100 device time | collate against it |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        off = 1 - r["prepared"] / r["unprepared"] if r["unprepared"] else float("nan")
        print(
            f"| {r['size']} | {r['collate']:.2f} | {r['unprepared']:.2f} | {r['prepared']:.2f} | {off:.1%} "
            f"| {r['emulated']:.2f} | {r['collate'] / r['emulated']:.2f}x |"
        )


if __name__ == "__main__":
    main()
