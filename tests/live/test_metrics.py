"""Metrics: what the collector, the runner and the edge record, what /metrics exports,
and the numbers the dashboard shows, first with hand-built inputs, then on the live
system under load."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dynamic_batching import metrics
from dynamic_batching.core.errors import DeadlineExceeded, InferenceError
from dynamic_batching.core.scheduler import Batch, Item
from dynamic_batching.metrics import CollectorMetrics, Snapshot
from dynamic_batching.protocol.names import request_queue_name
from dynamic_batching.protocol.results import Outcome
from dynamic_batching.reporting import prometheus, stats


class FakeWall:
    def __init__(self, t: float = 1_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_batch(waits_by_tier: dict[str, list[float]], *, formed_at: float = 50.0, tokens: int = 10) -> Batch[None]:
    items = tuple(
        Item(id=f"{p}-{i}", tokens=tokens, priority=p, enqueued_at=formed_at - w)
        for p, waits in waits_by_tier.items()
        for i, w in enumerate(waits)
    )
    padded = len(items) * tokens
    return Batch(items=items, padded_tokens=padded * 2, real_tokens=padded, reason="size", formed_at=formed_at)


def families(text: bytes | str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text if isinstance(text, str) else text.decode())}


def sample_value(fams: dict[str, object], name: str, suffix: str = "", **labels: str) -> float:
    for s in fams[name].samples:  # type: ignore[attr-defined]
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise AssertionError(f"no sample {name}{suffix} {labels}")


# --- the collector's counting, no Redis ------------------------------------------------


def test_collector_sample_has_last_minute_waits_and_batch_shape() -> None:
    wall = FakeWall()
    m = CollectorMetrics(wall=wall)
    m.batch_sent(make_batch({"high": [0.010] * 98 + [0.500] * 2, "low": [2.0]}), cap=128)
    s = m.sample(
        wall(),
        broker={"high": 3, "normal": 0, "low": 7},
        buffered={"high": 1, "normal": 0, "low": 0},
        counters={"completed:high": 5, "completed:low": 2, "rejected:normal": 4},
        devices={"cpu:0@h": {"busy_s": 1.5}},
    )
    assert s["depth"] == {"high": 4, "normal": 0, "low": 7}
    assert s["completed"] == 7 and s["rejected"] == 4 and s["failed"] == 0
    high = s["wait"]["high"]
    assert high["n"] == 100
    assert 8.3 <= high["p50_ms"] <= 12.0  # 10 ms, within a fine bucket
    assert 400 <= high["p99_ms"] <= 600
    assert s["wait"]["normal"] == {"n": 0, "p50_ms": None, "p99_ms": None}
    assert s["fill_1m"] == 0.5 and s["size_1m"] == 101 and s["size_over_cap_1m"] == pytest.approx(101 / 128, abs=1e-4)
    assert s["busy"] == {"cpu:0@h": 1.5}

    wall.t += 61  # a minute later the window is empty again
    later = m.sample(wall(), broker={}, buffered={}, counters={}, devices={})
    assert later["wait"]["high"]["n"] == 0 and later["fill_1m"] is None


# --- recording and reading through a real Redis ------------------------------------------


def test_flush_record_and_read_round_trip(bare_redis) -> None:  # type: ignore[no-untyped-def]
    from dynamic_batching.store import shared_state

    r = shared_state.client()
    wall = FakeWall(time.time())
    m = CollectorMetrics(wall=wall)
    m.batch_sent(make_batch({"normal": [0.002, 0.004], "low": [0.3]}), cap=32)
    m.expired([Item(id="x", tokens=1, priority="high")])
    m.flush(r, buffered={"high": 0, "normal": 2, "low": 0})
    r.rpush(request_queue_name("high"), "a", "b", "c")  # three messages waiting in the broker

    batch = {"batch_id": "b1", "requests": [{"id": i, "priority": "normal"} for i in ("ok", "bad", "late", "slow")]}
    outcomes = [
        Outcome("ok", result=[1.0]),
        Outcome("bad", error=InferenceError("model failed on this input: PoisonInput")),
        Outcome("late", error=DeadlineExceeded("late")),
        Outcome("slow", result=[2.0], details={"isolated": True}),
    ]
    metrics.record_batch("cpu:0@test", batch, outcomes, run_s=0.042, r=r)
    metrics.record_rejected("low", 3, r=r)

    snap = metrics.read(r)
    assert snap.count("dispatched") == 3 and snap.count("dispatched", "low") == 1
    assert snap.count("completed", "normal") == 2
    assert snap.count("failed") == 1 and snap.count("expired") == 2  # one at the collector, one at the device
    assert snap.count("rejected", "low") == 3 and snap.count("isolated") == 1
    assert snap.histograms["wait:normal"].count == 2 and snap.histograms["wait:low"].count == 1
    assert snap.histograms["fill"].count == 1
    assert snap.runs["cpu:0@test"].count == 1
    assert snap.broker[request_queue_name("high")] == 3
    assert [e["id"] for e in snap.recent_failed] == ["bad"] and "PoisonInput" in snap.recent_failed[0]["error"]
    assert [e["id"] for e in snap.recent_slow] == ["slow"]
    assert len(snap.series) == 1 and snap.series[0]["dispatched"] == 3

    fams = families(prometheus.render(snap))
    assert sample_value(fams, "batching_queue_depth", priority="high", where="broker") == 3
    assert sample_value(fams, "batching_broker_queue_length", queue=request_queue_name("high")) == 3
    assert sample_value(fams, "batching_requests", "_total", priority="normal", outcome="failed") == 1
    assert sample_value(fams, "batching_wait_seconds", "_count", priority="normal") == 2
    assert sample_value(fams, "batching_wait_seconds", "_bucket", priority="low", le="+Inf") == 1
    assert sample_value(fams, "batching_batch_run_seconds", "_count", device="cpu:0@test") == 1
    assert sample_value(fams, "batching_padded_tokens", "_total") == 6 * 10 * 2 / 2

    metrics.reset(r)
    assert metrics.read(r).counters == {}


@pytest.mark.django_db
def test_redis_memory_on_metrics_and_healthz(admin_client, bare_redis) -> None:  # type: ignore[no-untyped-def]
    from dynamic_batching.store import shared_state

    r = shared_state.client()
    r.config_set("maxmemory", 0)  # no limit, as under `make run`
    fams = families(admin_client.get("/metrics").content)
    used = sample_value(fams, "batching_redis_used_memory_bytes")
    assert used > 0 and sample_value(fams, "batching_redis_maxmemory_bytes") == 0
    health = admin_client.get("/healthz").json()
    assert health["redis_memory"]["state"] == "unlimited" and "warnings" not in health

    r.config_set("maxmemory", int(used * 2))
    fams = families(admin_client.get("/metrics").content)
    assert sample_value(fams, "batching_redis_maxmemory_bytes") == int(used * 2)
    health = admin_client.get("/healthz").json()
    assert health["redis_memory"]["state"] == "ok" and 0 < health["redis_memory"]["fraction"] < 0.9

    # Nearly full: /healthz says so, and its status still depends only on what is
    # missing (no collector or device here: 503 with or without the warning).
    r.config_set("maxmemory", int(used / 0.95))
    response = admin_client.get("/healthz")
    health = response.json()
    assert health["redis_memory"]["state"] == "warning" and health["redis_memory"]["fraction"] >= 0.9
    assert health["warnings"] == ["redis_memory"]
    assert response.status_code == 503 and health["missing"] == ["collector", "device worker"]


def test_a_metric_that_cannot_be_written_never_fails_the_caller() -> None:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    dead = redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    metrics.record_rejected("high", r=dead)
    metrics.record_batch("d", {"requests": []}, [Outcome("a", result=1)], 0.1, r=dead)
    m = CollectorMetrics()
    m.batch_sent(make_batch({"high": [0.1]}), cap=8)
    m.flush(dead, buffered={})
    m.batch_sent(make_batch({"no such tier": [0.1]}), cap=8)  # a bug in the caller, not an outage


# --- the dashboard's numbers, pure -----------------------------------------------------------


def _series(n: int, *, t0: float, per_s: int, depth: int = 0, failed_per_s: int = 0) -> list[dict[str, object]]:
    return [
        {
            "t": t0 + i,
            "depth": {"high": depth, "normal": 0, "low": 0},
            "completed": per_s * i,
            "failed": failed_per_s * i,
            "dispatched": (per_s + failed_per_s) * i,
            "wait": {"high": {"n": 50, "p50_ms": 5.0, "p99_ms": 900.0}},
            "busy": {"cpu:0@h": 0.5 * i},
        }
        for i in range(n)
    ]


def test_stats_rates_utilisation_and_a_breached_slo() -> None:
    now = 10_000.0
    snap = Snapshot(
        at=now,
        series=_series(120, t0=now - 119, per_s=20, failed_per_s=1),
        devices={"cpu:0@h": {"device": "cpu:0", "at": now - 1, "started_at": now - 500, "busy_s": 60.0}},
        collector={
            "at": now - 0.2,
            "buffered": {"high": 2},
            "hostname": "h",
            "policy_version": 3,
            "costs": {"minilm": {"batch_ms": 20.0, "token_us": 500.0, "batches": 9, "used": True}},
        },
        broker={request_queue_name("high"): 5},
    )
    out = stats.build(snap, slo=stats.Slo(p99_wait_ms={"high": 250.0}, error_rate=0.01), flower_url="http://f/")
    assert out["queues"]["high"] == {"broker": 5, "collector": 2, "total": 7}
    assert out["throughput"]["per_s"] == 20.0
    assert out["devices"][0]["utilisation"] == 0.5 and out["devices"][0]["up"]
    checks = {c["name"]: c for c in out["slo"]["checks"]}
    assert not checks["p99 wait (high)"]["ok"] and checks["p99 wait (high)"]["value"] == 900.0
    assert not checks["error rate"]["ok"] and checks["error rate"]["value"] == pytest.approx(1 / 21, abs=1e-3)
    assert checks["live devices"]["ok"] and checks["collector up"]["ok"]
    assert out["slo"]["ok"] is False
    assert len(out["series"]["t"]) == 119 and out["series"]["throughput"][-1] == 20.0
    assert out["links"]["flower"] == "http://f/"
    assert out["costs"]["minilm"] == {
        "batch_ms": 20.0,
        "token_us": 500.0,
        "batches": 9,
        "used": True,
        "tokens_per_batch": 40,
    }

    # A page that has every point up to now - 10 s gets only the ten newer ones.
    assert len(stats.build(snap, slo=stats.Slo(), since=now - 10)["series"]["t"]) == 10

    healthy = Snapshot(
        at=now, series=_series(120, t0=now - 119, per_s=20), devices=snap.devices, collector=snap.collector
    )
    ok = stats.build(healthy, slo=stats.Slo(p99_wait_ms={"high": 1000.0}))
    assert ok["slo"]["ok"], ok["slo"]


def test_stats_without_a_collector_say_so_and_do_not_crash() -> None:
    out = stats.build(Snapshot(at=5.0), slo=stats.Slo())
    assert out["collector"]["up"] is False and out["throughput"]["per_s"] == 0.0
    assert {c["name"]: c["ok"] for c in out["slo"]["checks"]}["collector up"] is False
    assert out["wait"]["high"]["p99_ms"] is None


# --- the live system under load ----------------------------------------------------------------


@pytest.mark.live
@pytest.mark.django_db
def test_metrics_show_depth_per_priority_under_load_then_completions(live_system, admin_client) -> None:  # type: ignore[no-untyped-def]
    from dynamic_batching.edge.client import submit_many

    before = metrics.read()
    # ~200 padded tokens each: at SYNTHETIC_PER_TOKEN_S=0.00005 a batch of 32 runs for
    # about 0.3 s, so requests pile up while the two devices work through 600 of them.
    text = "word " * 200
    results: list[object] = []

    def load() -> None:
        for chunk in range(6):
            for p in ("high", "low"):
                results.extend(
                    submit_many([f"{p} {chunk}.{i} {text}" for i in range(50)], priority=p, model="synthetic")
                )

    loader = threading.Thread(target=load)
    loader.start()
    # Scraped while the load runs: each tier is seen with requests waiting.
    seen = {"high": 0.0, "low": 0.0}
    deadline = time.monotonic() + 60
    while not all(seen.values()):
        fams = families(admin_client.get("/metrics").content)
        for p in seen:
            waiting = sum(
                sample_value(fams, "batching_queue_depth", priority=p, where=w) for w in ("broker", "collector")
            )
            seen[p] = max(seen[p], waiting)
        if not loader.is_alive() and all(r.ready() for r in results):  # type: ignore[attr-defined]
            break
        assert time.monotonic() < deadline
        time.sleep(0.02)
    loader.join()
    assert all(seen.values()), f"/metrics never showed a tier waiting: {seen}"

    for r in results:
        r.get(timeout=120)  # type: ignore[attr-defined]

    # Counters reach the runner's totals; the collector flushes every 0.25 s.
    deadline = time.monotonic() + 10
    while True:
        after = metrics.read()
        done = after.count("completed") - before.count("completed")
        dispatched = {p: after.count("dispatched", p) - before.count("dispatched", p) for p in ("high", "low")}
        if done >= 600 and all(n >= 300 for n in dispatched.values()):
            break
        assert time.monotonic() < deadline, (done, dispatched)
        time.sleep(0.05)
    for p in ("high", "low"):
        gained = after.histograms[f"wait:{p}"].count - before.histograms[f"wait:{p}"].count
        assert gained >= 300
    assert sum(h.count for h in after.runs.values()) > sum(h.count for h in before.runs.values())

    fams = families(admin_client.get("/metrics").content)
    assert sample_value(fams, "batching_collector_up") == 1
    assert sum(s.value for s in fams["batching_device_up"].samples) >= 2  # type: ignore[attr-defined]
    assert sample_value(fams, "batching_requests", "_total", priority="low", outcome="completed") >= 300
    # Redis' own memory, from INFO memory (maxmemory 0 when the harness sets no limit).
    assert sample_value(fams, "batching_redis_used_memory_bytes") > 0
    assert sample_value(fams, "batching_redis_maxmemory_bytes") >= 0

    # The time series is sampled once a second and ends with the latest counters.
    deadline = time.monotonic() + 5
    while metrics.read().series[-1]["completed"] < after.count("completed"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
