"""`/metrics` in the Prometheus text format, built from one metrics Snapshot.

A custom collector on a registry made per scrape: nothing is kept in the process's
global default registry, so every web process answers with the same numbers (those
in Redis) and a restart loses nothing. Broker queue depth per queue is here, which
Flower does not export (flower#1191).

Example queries:

    histogram_quantile(0.99, sum by (le, priority) (rate(batching_wait_seconds_bucket[5m])))
    sum by (priority) (batching_queue_depth)
    rate(batching_requests_total{outcome="completed"}[1m])
    rate(batching_padded_tokens_total[5m]) / rate(batching_real_tokens_total[5m])
    batching_redis_used_memory_bytes / (batching_redis_maxmemory_bytes > 0) > 0.9

The last is the Redis memory alert (docs/deployment.md, "Redis memory"): `> 0` drops
a Redis without maxmemory, whose used/0 would be +Inf.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from dynamic_batching.core.histogram import Histogram
from dynamic_batching.core.quota import QUOTA_LIMITS
from dynamic_batching.metrics import REQUEST_KINDS, Snapshot
from dynamic_batching.protocol.names import PRIORITIES
from dynamic_batching.store.shared_state import HEARTBEAT_TTL_S

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _buckets(h: Histogram) -> list[tuple[str, float]]:
    return [("+Inf" if math.isinf(b) else floatToGoString(b), float(n)) for b, n in h.cumulative()]


class SnapshotCollector(Collector):
    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def collect(self) -> Iterator[Metric]:
        s = self.snap
        depth = GaugeMetricFamily(
            "batching_queue_depth",
            "Requests waiting per priority: in the broker queue, or held by the collector.",
            labels=["priority", "where"],
        )
        for p in PRIORITIES:
            broker, held = s.depth(p)
            depth.add_metric([p, "broker"], broker)
            depth.add_metric([p, "collector"], held)
        yield depth

        broker = GaugeMetricFamily(
            "batching_broker_queue_length", "Messages waiting in each broker queue (LLEN).", labels=["queue"]
        )
        for q, n in sorted(s.broker.items()):
            broker.add_metric([q], n)
        yield broker

        requests = CounterMetricFamily(
            "batching_requests",
            "Requests by priority and outcome: dispatched in a batch, completed, failed, expired "
            "(deadline passed), rejected (Overloaded at the edge), isolated (moved to the slow lane).",
            labels=["priority", "outcome"],
        )
        for p in PRIORITIES:
            for kind in REQUEST_KINDS:
                requests.add_metric([p, kind], s.count(kind, p))
        yield requests

        wait = HistogramMetricFamily(
            "batching_wait_seconds", "Time from submission to dispatch in a batch, per priority.", labels=["priority"]
        )
        for p in PRIORITIES:
            h = s.histograms.get(f"wait:{p}")
            if h is not None:
                wait.add_metric([p], _buckets(h), h.total)
        yield wait

        for name, key, doc in (
            ("batching_batch_size", "batch_size", "Requests per dispatched batch."),
            ("batching_batch_padded_tokens", "batch_tokens", "Padded tokens (size x longest) per batch."),
            ("batching_batch_fill_ratio", "fill", "Real over padded tokens per batch; 1 means no padding."),
        ):
            h = s.histograms.get(key)
            if h is not None:
                yield HistogramMetricFamily(name, doc, buckets=_buckets(h), sum_value=h.total)

        c = s.counters
        for name, key, doc in (
            ("batching_batches", "batches", "Batches dispatched."),
            ("batching_real_tokens", "real_tokens", "Real tokens dispatched."),
            ("batching_padded_tokens", "padded_tokens", "Padded tokens dispatched (what devices compute)."),
            ("batching_batch_capacity", "batch_cap", "Sum of max_batch_size over dispatched batches."),
        ):
            yield CounterMetricFamily(name, doc, value=c.get(key, 0))

        quota = CounterMetricFamily(
            "batching_quota_refusals",
            "Requests refused by their owner's quota (tasks/core/quota.py), by the limit that refused them.",
            labels=["limit"],
        )
        for limit in QUOTA_LIMITS:
            quota.add_metric([limit], c.get(f"quota:{limit}", 0))
        yield quota
        yield CounterMetricFamily(
            "batching_invalid_inputs",
            "Inputs refused as invalid (422) after the edge read them; each is charged to its caller's rate.",
            value=c.get("invalid", 0),
        )

        run = HistogramMetricFamily(
            "batching_batch_run_seconds", "Model time per batch, per device.", labels=["device"]
        )
        for dev, h in sorted(s.runs.items()):
            run.add_metric([dev], _buckets(h), h.total)
        yield run

        up = GaugeMetricFamily("batching_device_up", "1 while the device worker heartbeats.", labels=["device"])
        busy = CounterMetricFamily("batching_device_busy_seconds", "Seconds spent running batches.", labels=["device"])
        done = CounterMetricFamily("batching_device_batches", "Batches run by the device worker.", labels=["device"])
        for dev, info in sorted(s.devices.items()):
            up.add_metric([dev], 1.0 if s.at - float(info.get("at", 0)) < HEARTBEAT_TTL_S else 0.0)
            busy.add_metric([dev], float(info.get("busy_s", 0.0)))
            done.add_metric([dev], float(info.get("batches", 0)))
        yield up
        yield busy
        yield done

        collector = s.collector or {}
        alive = bool(collector) and s.at - float(collector.get("at", 0)) < HEARTBEAT_TTL_S
        lane = collector.get("slow_lane") or {}
        for name, key, doc in (
            ("batching_slow_lane_depth", "depth", "Known-slow inputs waiting in the slow lane."),
            ("batching_slow_lane_oldest_wait_seconds", "oldest_wait_s", "How long the slow lane's oldest has waited."),
            ("batching_slow_lane_device_share", "device_share", "The slow lane's share of device time, last minute."),
        ):
            yield GaugeMetricFamily(name, doc, value=float(lane.get(key) or 0.0))
        yield GaugeMetricFamily(
            "batching_collector_up", "1 while the collector heartbeats.", value=1.0 if alive else 0.0
        )
        yield GaugeMetricFamily(
            "batching_policy_version",
            "Version of the batching policy the collector applies.",
            value=float(collector.get("policy_version") or 0),
        )

        memory = s.redis_memory
        if memory is not None:
            yield GaugeMetricFamily(
                "batching_redis_used_memory_bytes",
                "Bytes Redis has allocated (INFO memory used_memory).",
                value=float(memory.used_bytes),
            )
            yield GaugeMetricFamily(
                "batching_redis_maxmemory_bytes",
                "Redis' maxmemory, 0 for no limit. Under noeviction every write fails once used memory reaches it.",
                value=float(memory.max_bytes),
            )


def render(snap: Snapshot) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snap))
    return generate_latest(registry)
