"""The dashboard's numbers: a metrics Snapshot in, plain JSON-safe dict out.

Pure: no Redis, no request, the time passed in; `/api/v1/stats` and the dashboard
call `build(metrics.read(), slo=Slo.from_settings())`.

"Recent" figures (p50/p99 wait, fill ratio, rates, utilisation) cover the last minute
and come from the collector's time series; "total" figures are counters since the
metrics were last reset.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynamic_batching.core.quota import QUOTA_LIMITS
from dynamic_batching.metrics import REQUEST_KINDS, Snapshot
from dynamic_batching.protocol.names import PRIORITIES
from dynamic_batching.store.shared_state import HEARTBEAT_TTL_S

#: A time-series sample older than this means the collector stopped sampling.
STALE_SAMPLE_S = 5.0
#: Throughput "now" is averaged over this many seconds.
RATE_WINDOW_S = 10.0
#: Recent error rate, rejection rate and utilisation cover this many seconds.
RECENT_S = 60.0


@dataclass(frozen=True)
class Slo:
    """Service-level objectives; a breached one turns the dashboard's panel red."""

    #: Most p99 wait before dispatch per tier over the last minute, in milliseconds.
    p99_wait_ms: Mapping[str, float] = field(default_factory=lambda: {"high": 250.0, "normal": 1000.0, "low": 5000.0})
    #: Most (failed + expired) / finished over the last minute.
    error_rate: float = 0.01
    #: Most rejected / (rejected + accepted) over the last minute.
    reject_rate: float = 0.05
    #: Fewest live device workers.
    min_devices: int = 1

    @classmethod
    def from_settings(cls) -> Slo:
        from dynamic_batching.conf import conf

        return cls(
            p99_wait_ms=dict(conf.SLO_P99_WAIT_MS),
            error_rate=conf.SLO_ERROR_RATE,
            reject_rate=conf.SLO_REJECT_RATE,
            min_devices=conf.SLO_MIN_DEVICES,
        )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 4) if den else None


def _at_or_before(series: Sequence[Mapping[str, Any]], t: float) -> Mapping[str, Any] | None:
    """The newest sample taken at or before time t (series is oldest first)."""
    found = None
    for s in series:
        if s.get("t", math.inf) <= t:
            found = s
        else:
            break
    return found


def _delta(series: Sequence[Mapping[str, Any]], seconds: float) -> tuple[Mapping[str, Any], float] | None:
    """(counters gained over the last `seconds`, the exact span) from the series."""
    if len(series) < 2:
        return None
    last = series[-1]
    first = _at_or_before(series, last["t"] - seconds) or series[0]
    span = last["t"] - first["t"]
    if span <= 0:
        return None
    gained = {k: max(0, int(last.get(k, 0)) - int(first.get(k, 0))) for k in REQUEST_KINDS}
    busy = {d: max(0.0, float(b) - float(first.get("busy", {}).get(d, b))) for d, b in last.get("busy", {}).items()}
    return {**gained, "busy": busy}, span


def build(
    snap: Snapshot,
    *,
    slo: Slo,
    now: float | None = None,
    flower_url: str = "",
    since: float | None = None,
) -> dict[str, Any]:
    """The dashboard's numbers. `since` limits the returned chart series to samples
    newer than that time, so a page that already has the rest fetches only new points."""
    now = snap.at if now is None else now
    series = snap.series
    latest = series[-1] if series and now - series[-1].get("t", 0) <= STALE_SAMPLE_S else None

    queues = {}
    for p in PRIORITIES:
        broker, held = snap.depth(p)
        queues[p] = {"broker": broker, "collector": held, "total": broker + held}

    wait = {}
    for p in PRIORITIES:
        lifetime = snap.histograms.get(f"wait:{p}")
        recent = (latest or {}).get("wait", {}).get(p, {})
        wait[p] = {
            "p50_ms": recent.get("p50_ms"),
            "p99_ms": recent.get("p99_ms"),
            "n": recent.get("n", 0),
            "total_count": lifetime.count if lifetime else 0,
            "total_p50_ms": _ms(lifetime.quantile(0.5)) if lifetime else None,
            "total_p99_ms": _ms(lifetime.quantile(0.99)) if lifetime else None,
        }

    totals = {kind: snap.count(kind) for kind in REQUEST_KINDS}
    by_tier = {p: {kind: snap.count(kind, p) for kind in REQUEST_KINDS} for p in PRIORITIES}

    short = _delta(series, RATE_WINDOW_S) if latest else None
    minute = _delta(series, RECENT_S) if latest else None
    throughput = {
        "per_s": round(short[0]["completed"] / short[1], 2) if short else 0.0,
        "per_s_1m": round(minute[0]["completed"] / minute[1], 2) if minute else 0.0,
    }

    c = snap.counters
    size = snap.histograms.get("batch_size")
    batches = {
        "total": c.get("batches", 0),
        "mean_size": _ratio(c.get("batch_requests", 0), c.get("batches", 0)),
        "size_over_cap": _ratio(c.get("batch_requests", 0), c.get("batch_cap", 0)),
        "fill_ratio": _ratio(c.get("real_tokens", 0), c.get("padded_tokens", 0)),
        "mean_padded_tokens": _ratio(c.get("padded_tokens", 0), c.get("batches", 0)),
        "p99_size": size.quantile(0.99) if size and size.count else None,
        "recent": {
            "batches": (latest or {}).get("batches_1m", 0),
            "mean_size": (latest or {}).get("size_1m"),
            "size_over_cap": (latest or {}).get("size_over_cap_1m"),
            "fill_ratio": (latest or {}).get("fill_1m"),
        },
    }

    devices = []
    for dev_id, info in sorted(snap.devices.items()):
        age = max(0.0, now - float(info.get("at", 0)))
        up_for = max(0.0, float(info.get("at", now)) - float(info.get("started_at", now)))
        if minute and dev_id in minute[0]["busy"]:
            utilisation = minute[0]["busy"][dev_id] / minute[1]
        else:
            utilisation = float(info.get("busy_s", 0.0)) / up_for if up_for else 0.0
        run = snap.runs.get(dev_id)
        devices.append(
            {
                "id": dev_id,
                "device": info.get("device"),
                "up": age < HEARTBEAT_TTL_S,
                "heartbeat_age_s": round(age, 2),
                "batches": info.get("batches", 0),
                "requests": info.get("requests", 0),
                "busy_s": info.get("busy_s", 0.0),
                "utilisation": round(min(1.0, max(0.0, utilisation)), 4),
                "mean_run_ms": _ms(run.mean()) if run else None,
                "p99_run_ms": _ms(run.quantile(0.99)) if run and run.count else None,
                **{k: info[k] for k in ("circuit", "state") if k in info},
            }
        )

    collector = snap.collector or {}
    collector_up = bool(collector) and now - float(collector.get("at", 0)) < HEARTBEAT_TTL_S

    return {
        "at": round(now, 3),
        "queues": queues,
        "broker_queues": dict(snap.broker),
        "wait": wait,
        "totals": totals,
        "by_priority": by_tier,
        "throughput": throughput,
        "batches": batches,
        "devices": devices,
        "collector": {
            "up": collector_up,
            "hostname": collector.get("hostname"),
            "policy_version": collector.get("policy_version"),
            "outstanding": collector.get("outstanding"),
        },
        # Known-slow inputs waiting apart (tasks/core/slowlane.py): how many, the oldest's
        # wait, and the lane's share of device time over the last minute.
        "slow_lane": collector.get("slow_lane") or {"depth": 0, "oldest_wait_s": 0.0, "device_share": 0.0},
        # What a batch of each model costs, as the collector learned it and packs by
        # (docs/scheduling.md): ms a batch, us a padded token, and so how many padded
        # tokens cost as much as a second batch.
        "costs": {
            model: {**line, "tokens_per_batch": round(1000 * line["batch_ms"] / line["token_us"])}
            for model, line in (collector.get("costs") or {}).items()
            if line.get("token_us")
        },
        "slo": evaluate_slo(slo, wait=wait, minute=minute, devices=devices, collector_up=collector_up),
        "series": chart_series(series, since=since),
        "recent": {"failed": snap.recent_failed, "slow": snap.recent_slow},
        "quota_refusals": {limit: snap.counters.get(f"quota:{limit}", 0) for limit in QUOTA_LIMITS},
        "invalid_inputs": snap.counters.get("invalid", 0),
        "links": {"flower": flower_url, "metrics": "/metrics"},
    }


def clients(uses: Sequence[Any], refused: Mapping[str, int]) -> list[dict[str, Any]]:
    """Each recent client's use of its quota, for staff: requests in flight per tier,
    what its rate bucket holds, and how many of its requests were refused."""
    return [
        {
            "owner": u.owner,
            "in_flight": u.in_flight,
            "in_flight_total": sum(u.in_flight.values()),
            "bucket": None if u.bucket is None else round(u.bucket, 1),
            "refused": refused.get(u.owner, 0),
            "last_admitted_at": u.last_admitted_at,
        }
        for u in uses
    ]


def evaluate_slo(
    slo: Slo,
    *,
    wait: Mapping[str, Mapping[str, Any]],
    minute: tuple[Mapping[str, Any], float] | None,
    devices: Sequence[Mapping[str, Any]],
    collector_up: bool,
) -> dict[str, Any]:
    checks: list[dict[str, Any]] = []

    def check(name: str, value: float | None, limit: float, *, at_most: bool = True, unit: str = "") -> None:
        ok = value is None or (value <= limit if at_most else value >= limit)
        checks.append({"name": name, "value": value, "limit": limit, "ok": ok, "unit": unit, "at_most": at_most})

    for p in PRIORITIES:
        if p in slo.p99_wait_ms:
            check(f"p99 wait ({p})", wait[p]["p99_ms"] if wait[p]["n"] else None, slo.p99_wait_ms[p], unit="ms")
    gained = minute[0] if minute else {}
    finished = sum(gained.get(k, 0) for k in ("completed", "failed", "expired"))
    errors = gained.get("failed", 0) + gained.get("expired", 0)
    check("error rate", _ratio(errors, finished), slo.error_rate)
    offered = gained.get("rejected", 0) + gained.get("dispatched", 0)
    check("rejection rate", _ratio(gained.get("rejected", 0), offered), slo.reject_rate)
    check("live devices", sum(1 for d in devices if d["up"]), slo.min_devices, at_most=False)
    check("collector up", 1 if collector_up else 0, 1, at_most=False)
    return {"ok": all(c["ok"] for c in checks), "checks": checks}


def chart_series(series: Sequence[Mapping[str, Any]], *, since: float | None = None) -> dict[str, Any]:
    """Columns for the charts: time, depth per tier, completions per second."""
    t: list[float] = []
    depth: dict[str, list[int]] = {p: [] for p in PRIORITIES}
    rate: list[float] = []
    prev = None
    for s in series:
        if prev is not None and (since is None or s["t"] > since):
            dt = s["t"] - prev["t"]
            t.append(s["t"])
            for p in PRIORITIES:
                depth[p].append(int(s.get("depth", {}).get(p, 0)))
            done = int(s.get("completed", 0)) - int(prev.get("completed", 0))
            rate.append(round(max(0, done) / dt, 2) if dt > 0 else 0.0)
        prev = s
    return {"t": t, "depth": depth, "throughput": rate}
