"""Reading the metrics: one Snapshot, in two round trips, for /metrics and the dashboard."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from ..core.histogram import WAIT_BOUNDS_S, Histogram
from ..protocol.names import (
    COLLECTOR_KEY,
    METRICS_COUNTERS_KEY,
    METRICS_HIST_PREFIX,
    METRICS_PREFIX,
    METRICS_RECENT_FAILED_KEY,
    METRICS_RECENT_SLOW_KEY,
    METRICS_REFUSED_BY_OWNER_KEY,
    METRICS_RUN_DEVICES_KEY,
    METRICS_SERIES_KEY,
    PRIORITIES,
    SHARED_BATCH_QUEUES,
    device_queue_name,
    request_queue_name,
)
from ..store import shared_state
from ..store.connection import client
from ..store.redis_memory import RedisMemory
from .schema import HISTOGRAMS, RECENT_LEN, SERIES_LEN, decode_counters


@dataclass
class Snapshot:
    """Everything /metrics and /api/v1/stats are built from, read in two round trips."""

    at: float
    counters: dict[str, int] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    #: Batch run time per device.
    runs: dict[str, Histogram] = field(default_factory=dict)
    #: Time-series samples, oldest first.
    series: list[dict[str, Any]] = field(default_factory=list)
    recent_failed: list[dict[str, Any]] = field(default_factory=list)
    recent_slow: list[dict[str, Any]] = field(default_factory=list)
    #: Messages waiting per broker queue (requests.*, batches, device.*).
    broker: dict[str, int] = field(default_factory=dict)
    collector: dict[str, Any] | None = None
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Redis' own used memory and maxmemory; None if the server does not say.
    redis_memory: RedisMemory | None = None

    def count(self, kind: str, priority: str | None = None) -> int:
        tiers = PRIORITIES if priority is None else (priority,)
        return sum(self.counters.get(f"{kind}:{p}", 0) for p in tiers)

    def depth(self, priority: str) -> tuple[int, int]:
        """(in the broker, held by the collector) for one tier."""
        buffered = (self.collector or {}).get("buffered", {}).get(priority, 0)
        return self.broker.get(request_queue_name(priority), 0), int(buffered)


def _loads(raw: Any) -> Any:
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return None


def read(r: redis.Redis | None = None, *, series: bool = True) -> Snapshot:
    """Read every aggregate at once. Raises redis.RedisError if Redis is unreachable."""
    r = r or client()
    devices = shared_state.live_devices(r)
    run_devices = sorted(d.decode() if isinstance(d, bytes) else d for d in r.smembers(METRICS_RUN_DEVICES_KEY))

    queues = [request_queue_name(p) for p in PRIORITIES] + list(SHARED_BATCH_QUEUES)
    queues += sorted({device_queue_name(str(info.get("device"))) for info in devices.values() if info.get("device")})
    pipe = r.pipeline(transaction=False)
    pipe.hgetall(METRICS_COUNTERS_KEY)
    for name in HISTOGRAMS:
        pipe.hgetall(METRICS_HIST_PREFIX + name)
    for d in run_devices:
        pipe.hgetall(METRICS_HIST_PREFIX + f"run:{d}")
    pipe.lrange(METRICS_SERIES_KEY, 0, (SERIES_LEN if series else 1) - 1)
    pipe.lrange(METRICS_RECENT_FAILED_KEY, 0, RECENT_LEN - 1)
    pipe.lrange(METRICS_RECENT_SLOW_KEY, 0, RECENT_LEN - 1)
    for q in queues:
        pipe.llen(q)
    pipe.get(COLLECTOR_KEY)
    pipe.info("memory")
    res = iter(pipe.execute())

    snap = Snapshot(at=time.time(), devices=devices)
    snap.counters = decode_counters(next(res))
    snap.histograms = {name: Histogram.from_fields(bounds, next(res)) for name, bounds in HISTOGRAMS.items()}
    snap.runs = {d: Histogram.from_fields(WAIT_BOUNDS_S, next(res)) for d in run_devices}
    snap.series = [s for s in (_loads(x) for x in reversed(next(res))) if isinstance(s, dict)]
    snap.recent_failed = [e for e in (_loads(x) for x in next(res)) if isinstance(e, dict)]
    snap.recent_slow = [e for e in (_loads(x) for x in next(res)) if isinstance(e, dict)]
    snap.broker = {q: int(next(res)) for q in queues}
    collector = _loads(next(res))
    snap.collector = collector if isinstance(collector, dict) else None
    snap.redis_memory = RedisMemory.from_info(next(res))
    return snap


def refused_by_owner(r: redis.Redis | None = None) -> dict[str, int]:
    """Requests refused at the edge, per owner, since the metrics were last reset."""
    return decode_counters((r or client()).hgetall(METRICS_REFUSED_BY_OWNER_KEY))


def reset(r: redis.Redis | None = None) -> None:
    """Forget every metric (tests, or an operator starting a clean measurement)."""
    r = r or client()
    keys = list(r.scan_iter(match=METRICS_PREFIX + "*", count=200))
    if keys:
        r.delete(*keys)
