"""What every benchmark sends, and how it is timed.

The corpus is `model_ceiling.make_corpus` (seeded; ~70% short, 25% medium, 5% long),
so the bare-loop ceiling and every system see the same texts. Load is closed-loop:
N client threads, each sending its next request only when the last one answered, the
way N synchronous callers (web workers, say) would.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.model_ceiling import make_corpus

#: One seed for the whole run, so every system gets the same texts in the same order.
SEED = 0


def corpus(n: int, seed: int = SEED) -> list[str]:
    return make_corpus(n, seed)


@dataclass
class Run:
    """One measured load: how long it took and each request's latency."""

    system: str
    threads: int
    requests: int
    wall_s: float
    latencies_s: list[float] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    #: CPU seconds the system's processes and the client spent on the run (bench/cpu.py).
    cpu_s: float | None = None

    @property
    def throughput(self) -> float:
        return self.requests / self.wall_s if self.wall_s else 0.0

    def percentile_ms(self, q: float) -> float:
        if not self.latencies_s:
            return float("nan")
        return float(np.percentile(np.asarray(self.latencies_s), q) * 1000.0)

    def summary(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "threads": self.threads,
            "requests": self.requests,
            "wall_s": round(self.wall_s, 3),
            "throughput": round(self.throughput, 2),
            "p50_ms": round(self.percentile_ms(50), 2),
            "p99_ms": round(self.percentile_ms(99), 2),
            "cpu_ms_per_request": None if self.cpu_s is None else round(1000 * self.cpu_s / max(1, self.requests), 2),
            "settings": self.settings,
        }


def closed_loop(
    system: str,
    call: Callable[[str], Any],
    texts: Sequence[str],
    threads: int,
    *,
    on_done: Callable[[int], Any] = lambda n: None,
    settings: dict[str, Any] | None = None,
) -> Run:
    """Send every text once, `threads` callers at a time; `call(text)` must block
    until that text's answer is back."""
    next_index = itertools.count()
    lock = threading.Lock()
    latencies: list[float] = []
    errors: list[BaseException] = []

    def caller() -> None:
        mine: list[float] = []
        try:
            while True:
                with lock:
                    i = next(next_index)
                if i >= len(texts) or errors:
                    break
                t0 = time.perf_counter()
                call(texts[i])
                mine.append(time.perf_counter() - t0)
                on_done(1)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread
            errors.append(exc)
        with lock:
            latencies.extend(mine)

    wall = _run_threads(caller, threads)
    if errors:
        raise RuntimeError(f"{system}: {len(errors)} caller(s) failed") from errors[0]
    return Run(system, threads, len(latencies), wall, latencies, settings or {})


def open_loop(
    system: str,
    send: Callable[[str], Any],
    texts: Sequence[str],
    rate_per_s: float,
    *,
    on_done: Callable[[int], Any] = lambda n: None,
    getters: int = 8,
) -> Run:
    """Send the texts at `rate_per_s`, whatever comes back (arrivals do not wait for
    answers, as a site's users do not); `send(text)` returns something whose `.get()`
    blocks until its answer. Latency: from each text's scheduled send to its answer
    read; wall: from the first send to the last answer."""
    sent: queue.Queue[tuple[float, Any] | None] = queue.Queue()
    lock = threading.Lock()
    latencies: list[float] = []
    errors: list[BaseException] = []

    def getter() -> None:
        while (item := sent.get()) is not None:
            due, result = item
            try:
                result.get(timeout=300)
            except BaseException as exc:  # noqa: BLE001 - counted, re-raised below
                errors.append(exc)
                continue
            with lock:
                latencies.append(time.perf_counter() - due)
            on_done(1)

    threads = [threading.Thread(target=getter, daemon=True) for _ in range(getters)]
    for t in threads:
        t.start()
    start = time.perf_counter()
    for i, text in enumerate(texts):
        due = start + i / rate_per_s
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent.put((due, send(text)))
    for _ in threads:
        sent.put(None)
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{system}: {len(errors)} request(s) failed") from errors[0]
    return Run(system, 0, len(latencies), wall, latencies, {"open_loop_rate_per_s": rate_per_s})


def bulk(
    system: str,
    send_many: Callable[[list[str]], list[Any]],
    wait_all: Callable[[list[Any]], Any],
    texts: Sequence[str],
    threads: int,
    *,
    chunk: int = 50,
    on_done: Callable[[int], Any] = lambda n: None,
    settings: dict[str, Any] | None = None,
) -> Run:
    """Throughput only: each thread sends `chunk` texts at once, then waits for all of
    their answers at once (`wait_all`), until every text is answered. Per-request latency is not recorded:
    in a bulk send it measures the queue, not the system."""
    chunks = [list(texts[i : i + chunk]) for i in range(0, len(texts), chunk)]
    next_index = itertools.count()
    lock = threading.Lock()
    errors: list[BaseException] = []
    done = [0]

    def caller() -> None:
        try:
            while not errors:
                with lock:
                    i = next(next_index)
                if i >= len(chunks):
                    return
                wait_all(send_many(chunks[i]))
                with lock:
                    done[0] += len(chunks[i])
                on_done(len(chunks[i]))
        except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread
            errors.append(exc)

    wall = _run_threads(caller, threads)
    if errors:
        raise RuntimeError(f"{system}: {len(errors)} caller(s) failed") from errors[0]
    return Run(system, threads, done[0], wall, [], {"chunk": chunk, **(settings or {})})


def _run_threads(target: Callable[[], None], threads: int) -> float:
    workers = [threading.Thread(target=target, name=f"client-{i}", daemon=True) for i in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - t0
