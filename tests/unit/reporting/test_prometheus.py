"""/metrics' Redis memory gauges, rendered from hand-built Snapshots (no Redis)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from dynamic_batching.metrics import Snapshot
from dynamic_batching.reporting import prometheus
from dynamic_batching.store.redis_memory import RedisMemory

GAUGES = ("batching_redis_used_memory_bytes", "batching_redis_maxmemory_bytes")


def gauges(snap: Snapshot) -> dict[str, float]:
    text = prometheus.render(snap).decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name in GAUGES}


def test_used_and_max_memory_are_exported_as_bytes() -> None:
    snap = Snapshot(at=1.0, redis_memory=RedisMemory(used_bytes=1_900_000_000, max_bytes=2 << 30))
    assert gauges(snap) == {
        "batching_redis_used_memory_bytes": 1.9e9,
        "batching_redis_maxmemory_bytes": 2.0 * (1 << 30),
    }


def test_no_limit_is_exported_as_zero_like_redis_does() -> None:
    snap = Snapshot(at=1.0, redis_memory=RedisMemory(used_bytes=1000, max_bytes=0))
    assert gauges(snap) == {"batching_redis_used_memory_bytes": 1000.0, "batching_redis_maxmemory_bytes": 0.0}


def test_a_server_that_does_not_report_memory_exports_neither_gauge() -> None:
    assert gauges(Snapshot(at=1.0)) == {}
