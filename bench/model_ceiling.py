"""Throughput ceiling of one model runner: does batching (and sorting) pay off?

Runs the same mixed-length corpus (70% short ~10 words, 25% medium ~60 words,
5% long ~300 words; seeded) through one runner three ways and prints texts/s:

* batch size 1
* batch size N, texts sorted by token count (minimal padding)
* batch size N, texts in arrival order (random mix, padding to each batch's max)

Usage::

    .venv/bin/python bench/model_ceiling.py                 # minilm, cpu, 2 threads
    .venv/bin/python bench/model_ceiling.py --threads 4 --batch 64
    .venv/bin/python bench/model_ceiling.py --model synthetic --device cuda:0
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# Runnable as a plain script from anywhere.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dynamic_batching.gpu_workers.models import BatchRunner, ModelSpec, get_spec, model_names

WORDS = [
    "the",
    "a",
    "batching",
    "model",
    "token",
    "latency",
    "queue",
    "worker",
    "request",
    "embedding",
    "vector",
    "throughput",
    "padding",
    "sequence",
    "device",
    "memory",
    "kernel",
    "attention",
    "layer",
    "sentence",
    "fast",
    "slow",
    "large",
    "small",
    "cat",
    "dog",
    "house",
    "river",
    "mountain",
    "city",
    "night",
    "morning",
    "people",
    "system",
    "network",
    "server",
    "client",
    "answer",
    "question",
    "result",
    "value",
    "number",
    "because",
    "although",
    "however",
    "therefore",
    "meanwhile",
    "performance",
    "efficient",
    "measure",
    "compute",
]


def make_corpus(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        r = rng.random()
        if r < 0.70:
            length = rng.randint(6, 14)
        elif r < 0.95:
            length = rng.randint(45, 75)
        else:
            length = rng.randint(250, 350)
        texts.append(" ".join(rng.choice(WORDS) for _ in range(length)))
    return texts


def chunks(items: Sequence[str], size: int) -> list[list[str]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def padded_tokens(spec: ModelSpec, batches: list[list[str]]) -> int:
    # Count what the model actually processes: each batch padded to its longest
    # member, which the model itself caps at max_tokens.
    total = 0
    for batch in batches:
        longest = max(min(spec.count_tokens(t), spec.max_tokens) for t in batch)
        total += longest * len(batch)
    return total


def time_batches(runner: BatchRunner, batches: list[list[str]]) -> float:
    start = time.perf_counter()
    for batch in batches:
        runner.run_batch(batch)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=model_names, default="minilm")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (sets TORCH_THREADS)")
    parser.add_argument("-n", type=int, default=300, help="number of texts")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    os.environ["TORCH_THREADS"] = str(args.threads)
    spec = get_spec(args.model)
    texts = make_corpus(args.n, args.seed)
    counts = [spec.count_tokens(t) for t in texts]
    real_tokens = sum(min(c, spec.max_tokens) for c in counts)

    t0 = time.perf_counter()
    runner = spec.load(args.device)
    load_s = time.perf_counter() - t0

    by_length = sorted(texts, key=spec.count_tokens)
    modes = [
        ("batch 1", chunks(texts, 1)),
        (f"batch {args.batch} sorted", chunks(by_length, args.batch)),
        (f"batch {args.batch} unsorted", chunks(texts, args.batch)),
    ]
    # One untimed pass over a slice so allocator growth for the largest shapes
    # does not land in whichever mode happens to run first.
    runner.run_batch(by_length[-args.batch :])

    print(
        f"model={args.model} device={args.device} threads={args.threads} texts={len(texts)} "
        f"tokens(capped)={real_tokens} max={max(counts)} load={load_s:.1f}s"
    )
    print(f"{'mode':<22}{'batches':>8}{'seconds':>9}{'texts/s':>9}{'pad ratio':>11}")
    for label, batches in modes:
        seconds = time_batches(runner, batches)
        ratio = padded_tokens(spec, batches) / real_tokens
        print(f"{label:<22}{len(batches):>8}{seconds:>9.2f}{len(texts) / seconds:>9.1f}{ratio:>11.2f}")
    runner.close()


if __name__ == "__main__":
    main()
