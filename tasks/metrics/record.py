"""Metrics: counted where they happen, aggregated in Redis, read by /metrics and /dashboard/.

No database write and no extra round trip per request. Who records what:

    edge (client.submit_many)       rejected:<tier>                    one HINCRBY per rejection
    collector (_send/_expire)  dispatched, expired, wait histogram per tier, batch size,
                               tokens and fill; counted in process and written in one
                               pipeline per housekeeping turn (HOUSEKEEPING_S), plus one
                               time-series sample a second
    device runner (execute)    completed / failed / expired per tier, run time per
                               device, recent failures; one pipeline per batch

Keys are in tasks/protocol/names.py (METRICS_*): a counters hash of "<kind>:<tier>"
fields and batch totals, monotonic like Prometheus counters; a hash per histogram; the
devices that have a run-time histogram; a time series (one JSON sample a second, the
last 10 min); and the last failed and isolated requests.

A metric that cannot be written is dropped with a warning: metrics never fail a request.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import redis

from ..core.errors import DeadlineExceeded
from ..core.histogram import FINE_BOUNDS_S, WAIT_BOUNDS_S, Histogram, RollingHistogram, RollingSum
from ..core.scheduler import Batch, Item
from ..protocol.names import (
    METRICS_COUNTERS_KEY,
    METRICS_HIST_PREFIX,
    METRICS_RECENT_FAILED_KEY,
    METRICS_RECENT_SLOW_KEY,
    METRICS_REFUSED_BY_OWNER_KEY,
    METRICS_RUN_DEVICES_KEY,
    METRICS_SERIES_KEY,
    PRIORITIES,
    request_queue_name,
)
from ..protocol.results import Outcome
from ..store import shared_state
from ..store.connection import client
from .schema import HISTOGRAMS, RECENT_LEN, REQUEST_KINDS, SAMPLE_EVERY_S, SERIES_LEN, WINDOW_S, decode_counters

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., None])


def _never_raises(fn: F) -> F:
    """Metrics are recorded on the request path (the edge, the collector's loop, the
    device's batch): a bug or an outage here is logged and the request goes on."""

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception:
            log.warning("could not record metrics in %s", fn.__qualname__, exc_info=True)

    return guarded  # type: ignore[return-value]


def _client(r: redis.Redis | None) -> redis.Redis:
    return r if r is not None else client()


def _add_histogram(pipe: Any, name: str, h: Histogram) -> None:
    key = METRICS_HIST_PREFIX + name
    for f, v in h.to_fields().items():
        if f == "sum":
            pipe.hincrbyfloat(key, f, v)
        else:
            pipe.hincrby(key, f, int(v))


# --- the edge ------------------------------------------------------------------------


@_never_raises
def record_invalid(count: int = 1, r: redis.Redis | None = None, *, owner: str = "") -> None:
    """Inputs refused as invalid after the edge read them (422), charged to their owner's
    rate (tasks/web/access.py::charge_refused)."""
    pipe = _client(r).pipeline(transaction=False)
    pipe.hincrby(METRICS_COUNTERS_KEY, "invalid", count)
    if owner:
        pipe.hincrby(METRICS_REFUSED_BY_OWNER_KEY, owner, count)
    pipe.execute()


@_never_raises
def record_rejected(
    priority: str, count: int = 1, r: redis.Redis | None = None, *, reason: str = "tier", owner: str = ""
) -> None:
    """Requests refused at the edge: by the tier's cap (Overloaded), or by their owner's
    quota (QuotaExceeded: `reason` is "rate", "in_flight" or "share")."""
    pipe = _client(r).pipeline(transaction=False)
    if reason == "tier":
        pipe.hincrby(METRICS_COUNTERS_KEY, f"rejected:{priority}", count)
    else:
        pipe.hincrby(METRICS_COUNTERS_KEY, f"quota:{reason}", count)
    if owner:
        pipe.hincrby(METRICS_REFUSED_BY_OWNER_KEY, owner, count)
    pipe.execute()


# --- the collector ---------------------------------------------------------------------


class CollectorMetrics:
    """What the collector counts. It lives on the collector's one thread, so it needs
    no lock; `flush()` is called from its housekeeping."""

    def __init__(self, *, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        self._counters: Counter[str] = Counter()
        self._hists: dict[str, Histogram] = {}
        #: Last-minute waits per tier, finely bucketed, for the dashboard's p50/p99.
        self.waits = {p: RollingHistogram(FINE_BOUNDS_S, window_s=WINDOW_S) for p in PRIORITIES}
        self.batches = RollingSum(("batches", "requests", "cap", "real", "padded"), window_s=WINDOW_S)
        self._next_sample = 0.0

    def _hist(self, name: str) -> Histogram:
        h = self._hists.get(name)
        if h is None:
            h = self._hists[name] = Histogram(HISTOGRAMS[name])
        return h

    @_never_raises
    def batch_sent(self, batch: Batch[Any], cap: int) -> None:
        """A batch left: each request's wait, and the batch's size, tokens and fill."""
        now = self._wall()
        for item in batch.items:
            # Both on the collector's clock; enqueued_at already counts broker time.
            wait = max(0.0, batch.formed_at - item.enqueued_at)
            self._hist(f"wait:{item.priority}").observe(wait)
            self.waits[item.priority].observe(wait, now)
            self._counters[f"dispatched:{item.priority}"] += 1
        self._counters["batches"] += 1
        self._counters["batch_requests"] += len(batch)
        self._counters["batch_cap"] += cap
        self._counters["real_tokens"] += batch.real_tokens
        self._counters["padded_tokens"] += batch.padded_tokens
        self._hist("batch_size").observe(len(batch))
        self._hist("batch_tokens").observe(batch.padded_tokens)
        self._hist("fill").observe(batch.fill_ratio)
        self.batches.add(
            now, batches=1, requests=len(batch), cap=cap, real=batch.real_tokens, padded=batch.padded_tokens
        )

    @_never_raises
    def expired(self, items: Iterable[Item[Any]]) -> None:
        for item in items:
            self._counters[f"expired:{item.priority}"] += 1

    @_never_raises
    def flush(self, r: redis.Redis, *, buffered: Mapping[str, int]) -> None:
        """Write what was counted since the last flush; once a second, also append a
        time-series sample. `buffered` is what the collector holds per tier."""
        counters, hists = self._counters, self._hists
        self._counters, self._hists = Counter(), {}
        now = self._wall()
        sample_due = now >= self._next_sample
        pipe = r.pipeline(transaction=False)
        for name, n in counters.items():
            pipe.hincrby(METRICS_COUNTERS_KEY, name, n)
        for name, h in hists.items():
            _add_histogram(pipe, name, h)
        if sample_due:
            for p in PRIORITIES:
                pipe.llen(request_queue_name(p))
            pipe.hgetall(METRICS_COUNTERS_KEY)
        results = pipe.execute()
        if not sample_due:
            return
        self._next_sample = now + SAMPLE_EVERY_S
        *lengths, totals = results[-(len(PRIORITIES) + 1) :]
        sample = self.sample(
            now,
            broker=dict(zip(PRIORITIES, lengths, strict=True)),
            buffered=buffered,
            counters=decode_counters(totals),
            devices=shared_state.live_devices(r),
        )
        pipe = r.pipeline(transaction=False)
        pipe.lpush(METRICS_SERIES_KEY, json.dumps(sample, separators=(",", ":")))
        pipe.ltrim(METRICS_SERIES_KEY, 0, SERIES_LEN - 1)
        pipe.execute()

    def sample(
        self,
        now: float,
        *,
        broker: Mapping[str, int],
        buffered: Mapping[str, int],
        counters: Mapping[str, int],
        devices: Mapping[str, Mapping[str, Any]],
    ) -> dict[str, Any]:
        """One point of the dashboard's time series: depths now, counters so far, and
        the last minute's waits and batch shape."""
        waits = {}
        for p in PRIORITIES:
            h = self.waits[p].snapshot(now)
            p50, p99 = h.quantile(0.5), h.quantile(0.99)
            waits[p] = {
                "n": h.count,
                "p50_ms": None if p50 is None else round(p50 * 1000, 3),
                "p99_ms": None if p99 is None else round(p99 * 1000, 3),
            }
        b = self.batches.totals(now)
        return {
            "t": round(now, 3),
            "depth": {p: int(broker.get(p, 0)) + int(buffered.get(p, 0)) for p in PRIORITIES},
            "buffered": {p: int(buffered.get(p, 0)) for p in PRIORITIES},
            **{kind: sum(int(counters.get(f"{kind}:{p}", 0)) for p in PRIORITIES) for kind in REQUEST_KINDS},
            "wait": waits,
            "batches_1m": int(b["batches"]),
            "size_1m": round(b["requests"] / b["batches"], 2) if b["batches"] else None,
            "size_over_cap_1m": round(b["requests"] / b["cap"], 4) if b["cap"] else None,
            "fill_1m": round(b["real"] / b["padded"], 4) if b["padded"] else None,
            "busy": {d: float(info.get("busy_s", 0.0)) for d, info in devices.items()},
        }


# --- the device runner -------------------------------------------------------------------


@_never_raises
def record_batch(
    device: str,
    batch: Mapping[str, Any],
    outcomes: Sequence[Outcome],
    run_s: float,
    r: redis.Redis | None = None,
) -> None:
    """A batch ran: per-tier outcomes, the run time on this device, recent failures,
    and the requests that were isolated as too slow."""
    requests = {req["id"]: req for req in batch.get("requests", ())}
    counts: Counter[str] = Counter()
    failures = []
    now = time.time()
    for o in outcomes:
        priority = requests.get(o.task_id, {}).get("priority", "normal")
        if o.error is None:
            counts[f"completed:{priority}"] += 1
        elif isinstance(o.error, DeadlineExceeded):
            counts[f"expired:{priority}"] += 1
        else:
            counts[f"failed:{priority}"] += 1
            failures.append(
                {
                    "id": o.task_id,
                    "at": now,
                    "priority": priority,
                    "device": device,
                    "batch_id": batch.get("batch_id"),
                    "error": f"{type(o.error).__name__}: {o.error}"[:300],
                }
            )
    run = Histogram(WAIT_BOUNDS_S)
    run.observe(run_s)
    pipe = _client(r).pipeline(transaction=False)
    for name, n in counts.items():
        pipe.hincrby(METRICS_COUNTERS_KEY, name, n)
    _add_histogram(pipe, f"run:{device}", run)
    pipe.sadd(METRICS_RUN_DEVICES_KEY, device)
    _push_recent(pipe, METRICS_RECENT_FAILED_KEY, failures)
    pipe.execute()
    # The runner marks requests it ran alone because they were too slow to share a
    # batch (found now, or known from before and sent in the slow lane).
    isolated = [
        {"id": o.task_id, "priority": requests.get(o.task_id, {}).get("priority", "normal")}
        for o in outcomes
        if o.details.get("isolated")
    ]
    if isolated:
        if batch.get("lane") == "slow":
            reason = "known slow input: sent to the slow lane, ran alone"
        else:
            reason = "too slow to share its batch: found by splitting it, ran alone"
        record_isolated(isolated, reason=reason, device=device, r=r)


@_never_raises
def record_isolated(
    requests: Iterable[Mapping[str, Any]],
    *,
    reason: str,
    device: str | None = None,
    r: redis.Redis | None = None,
) -> None:
    """Requests moved to the slow lane. Each needs "id" and "priority"."""
    now = time.time()
    entries = [
        {"id": req["id"], "at": now, "priority": req.get("priority", "normal"), "device": device, "reason": reason}
        for req in requests
    ]
    if not entries:
        return
    pipe = _client(r).pipeline(transaction=False)
    for e in entries:
        pipe.hincrby(METRICS_COUNTERS_KEY, f"isolated:{e['priority']}", 1)
    _push_recent(pipe, METRICS_RECENT_SLOW_KEY, entries)
    pipe.execute()


def _push_recent(pipe: Any, key: str, entries: Sequence[Mapping[str, Any]]) -> None:
    if entries:
        pipe.lpush(key, *(json.dumps(e, separators=(",", ":")) for e in entries[-RECENT_LEN:]))
        pipe.ltrim(key, 0, RECENT_LEN - 1)
