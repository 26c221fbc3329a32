"""Many threads through one real-clock DynamicBatcher: every request answered exactly once,
each with its own answer, and no batch over its limits."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import Future

import pytest

from dynamic_batching.core.batcher import DynamicBatcher
from dynamic_batching.core.policy import PRIORITIES, BatchPolicy

THREADS = 32
PER_THREAD = 200
MAX_BATCH = 16
MAX_TOKENS = 16 * 40
WAIT = 20.0


# One list: a second assignment would silently drop the first one's timeout.
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("threads_not_lingering")]


def tokens_of(x: tuple[int, int]) -> int:
    t, i = x
    return 1 + (t * 7919 + i * 104729) % 40


def test_many_threads_each_get_their_own_answer_exactly_once() -> None:
    seen: Counter[tuple[int, int]] = Counter()
    sizes: list[int] = []
    violations: list[str] = []
    seen_lock = threading.Lock()
    running = 0
    max_running = 0

    def run_batch(inputs: list[tuple[int, int]]) -> list[object]:
        nonlocal running, max_running
        with seen_lock:
            running += 1
            max_running = max(max_running, running)
            seen.update(inputs)
            sizes.append(len(inputs))
            padded = len(inputs) * max(tokens_of(x) for x in inputs)
            if len(inputs) > MAX_BATCH or padded > MAX_TOKENS:
                violations.append(f"batch of {len(inputs)}, {padded} padded tokens")
        try:
            # Every tenth request of thread 3 fails on its own; the rest echo their input.
            return [ValueError(x) if x[0] == 3 and x[1] % 10 == 0 else ("ok", x) for x in inputs]
        finally:
            with seen_lock:
                running -= 1

    policy = BatchPolicy(max_batch_size=MAX_BATCH, max_batch_tokens=MAX_TOKENS, max_wait_ms=1.0)
    batcher: DynamicBatcher[tuple[int, int], object] = DynamicBatcher(
        run_batch, policy, tokens=tokens_of, max_concurrent_batches=2
    )
    resolved: Counter[tuple[int, int]] = Counter()
    resolved_lock = threading.Lock()
    failures: list[str] = []
    start = threading.Barrier(THREADS)

    def on_done(key: tuple[int, int]) -> object:
        def callback(_f: Future[object]) -> None:
            with resolved_lock:
                resolved[key] += 1

        return callback

    def client(t: int) -> None:
        rng = random.Random(t)
        start.wait(WAIT)
        futures: list[tuple[tuple[int, int], Future[object]]] = []
        try:
            for i in range(PER_THREAD):
                x = (t, i)
                if t % 4 == 0:
                    # Some callers block on each request in turn, as `infer` users do.
                    f = batcher.submit(x, priority=rng.choice(PRIORITIES))
                    f.add_done_callback(on_done(x))
                    f.exception(timeout=WAIT)
                else:
                    f = batcher.submit(x, priority=rng.choice(PRIORITIES))
                    f.add_done_callback(on_done(x))
                futures.append((x, f))
            for x, f in futures:
                if x[0] == 3 and x[1] % 10 == 0:
                    exc = f.exception(timeout=WAIT)
                    if not (isinstance(exc, ValueError) and exc.args == (x,)):
                        failures.append(f"{x}: expected its own ValueError, got {exc!r}")
                else:
                    got = f.result(timeout=WAIT)
                    if got != ("ok", x):
                        failures.append(f"{x}: got {got!r}")
        except Exception as exc:  # noqa: BLE001 - reported below, not lost in a thread
            failures.append(f"thread {t}: {exc!r}")

    began = time.monotonic()
    threads = [threading.Thread(target=client, args=(t,), name=f"stress-client-{t}") for t in range(THREADS)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(WAIT)
        assert not any(th.is_alive() for th in threads), "a client thread never finished"
    finally:
        closer = threading.Thread(target=batcher.close, name="stress-closer", daemon=True)
        closer.start()
        closer.join(WAIT)
        assert not closer.is_alive(), "close() did not return"
    elapsed = time.monotonic() - began

    everyone = {(t, i) for t in range(THREADS) for i in range(PER_THREAD)}
    assert failures == []
    assert violations == []
    assert set(seen) == everyone, "some request never reached the batch function"
    assert max(seen.values()) == 1, "a request ran more than once"
    assert set(resolved) == everyone and max(resolved.values()) == 1, "a future resolved twice"
    assert sum(sizes) == THREADS * PER_THREAD
    assert max_running <= 2, "more batches ran at once than max_concurrent_batches"
    assert max(sizes) > 1, "nothing was batched"
    assert batcher.pending() == 0
    # How long it took is printed, not judged: a hang is caught by the joins above.
    print(f"stress: {THREADS * PER_THREAD} requests in {elapsed:.1f} s")
