"""The ceiling: MiniLM in a bare loop in this process, no serving around it.

The timing and padding logic is `model_ceiling.py`'s; this runs it over several batch
sizes and returns numbers instead of printing them. Both cores go to the model
(`threads` torch threads), as both cores go to the two device workers in the pipeline.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from bench.model_ceiling import chunks, padded_tokens, time_batches
from dynamic_batching.gpu_workers.models import get_spec


def measure(
    texts: Sequence[str],
    *,
    sorted_sizes: Sequence[int],
    unsorted_sizes: Sequence[int],
    unsorted_texts: int,
    threads: int = 2,
    on_done: Callable[[int], Any] = lambda n: None,
) -> dict[str, Any]:
    """Texts/s at batch 1, at each size over texts sorted by length, and at each size in
    arrival order (over the first `unsorted_texts` only: padding makes it slow)."""
    previous = os.environ.get("TORCH_THREADS")
    os.environ["TORCH_THREADS"] = str(threads)
    spec = get_spec("minilm")
    try:
        runner = spec.load("cpu")
    finally:
        if previous is None:
            os.environ.pop("TORCH_THREADS", None)
        else:
            os.environ["TORCH_THREADS"] = previous
    real = sum(min(spec.count_tokens(t), spec.max_tokens) for t in texts)
    by_length = sorted(texts, key=spec.count_tokens)
    head = list(texts[:unsorted_texts])
    head_real = sum(min(spec.count_tokens(t), spec.max_tokens) for t in head)
    # An untimed pass over the largest shapes, so allocator growth lands in no mode.
    runner.run_batch(by_length[-max(sorted_sizes) :])

    modes: list[dict[str, Any]] = []

    def timed(label: str, size: int, order: str, items: list[str], real_tokens: int) -> None:
        batches = chunks(items, size)
        cpu0 = os.times()
        seconds = time_batches(runner, batches)
        cpu1 = os.times()
        cpu_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
        modes.append(
            {
                "mode": label,
                "batch": size,
                "order": order,
                "texts": len(items),
                "seconds": round(seconds, 3),
                "throughput": round(len(items) / seconds, 2),
                "pad_ratio": round(padded_tokens(spec, batches) / real_tokens, 2),
                "cpu_ms_per_request": round(1000 * cpu_s / len(items), 2),
            }
        )
        on_done(len(items))

    try:
        timed("batch 1", 1, "arrival", list(texts), real)
        for size in sorted_sizes:
            timed(f"batch {size} sorted", size, "sorted", by_length, real)
        for size in unsorted_sizes:
            timed(f"batch {size} unsorted", size, "arrival", head, head_real)
    finally:
        runner.close()
    unsorted = [m for m in modes if m["order"] == "arrival"]
    ordered = [m for m in modes if m["order"] == "sorted"]
    return {
        "threads": threads,
        "texts": len(texts),
        "modes": modes,
        "best_unsorted": max(unsorted, key=lambda m: m["throughput"]),
        "best_sorted": max(ordered, key=lambda m: m["throughput"]),
    }
