"""Bounded memory: at a steady rate, what Redis holds stays flat. Answers expire after
RESULT_EXPIRES_S (3 s here), and nothing else a request leaves behind grows: the
ledger, the held hashes, the queues and the redelivery counters all empty as requests
are answered."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from systems import running

from batching_site.harness import LocalSystem
from dynamic_batching.edge.client import submit_many
from dynamic_batching.store import ledger, shared_state

pytestmark = pytest.mark.live

EXPIRES_S = 3
RATE = 150  # requests a second
SECONDS = 15


@pytest.fixture(scope="module")
def soak_system() -> Iterator[LocalSystem]:
    env = {"BATCHING_RESULT_EXPIRES_S": str(EXPIRES_S), "SYNTHETIC_PER_TOKEN_S": "0"}
    with running(LocalSystem(devices=["cpu:0"], env=env)) as system:
        yield system


def test_redis_holds_a_flat_amount_at_a_steady_rate(soak_system: LocalSystem) -> None:
    r = shared_state.client()
    samples: list[tuple[float, int, int]] = []  # (seconds in, keys, used memory)
    pending = []
    start = time.monotonic()
    tick = 0
    while (now := time.monotonic() - start) < SECONDS:
        # Ten requests every 1/15 s: a steady RATE, whatever the answers do.
        pending += submit_many([f"soak {tick} {k} " + "w " * (k % 9) for k in range(RATE // 15)], model="synthetic")
        tick += 1
        if tick % 15 == 0:
            samples.append((now, r.dbsize(), int(r.info("memory")["used_memory"])))
            pending = [p for p in pending if not p.ready()]
        time.sleep(max(0.0, start + tick / 15 - time.monotonic()))
    for p in pending:
        p.get(timeout=30)

    print("\nsoak (s, keys, used_memory):", [(round(s), k, m) for s, k, m in samples])
    # After two expiry periods the answers expire as fast as they are written.
    steady = [k for s, k, _ in samples if s >= 2 * EXPIRES_S]
    middle, last = steady[: len(steady) // 2], steady[len(steady) // 2 :]
    # Without expiry the key count would grow by RATE a second, 1,000+ over the last half.
    assert max(last) <= max(middle) * 1.2 + 50, samples
    assert max(last) < RATE * EXPIRES_S * 2 + 200, samples
    assert ledger.size(r) == 0
    assert not list(r.scan_iter(match="batching:redeliveries:*"))
