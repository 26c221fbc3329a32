"""One clock for decisions across hosts: Redis's.

Deadlines, the ledger and heartbeats are written by one process and judged by another,
often on another host. Each process's wall clock may be off (a device host 11 s slow, a
web host a minute behind), so every such time is read from `now()`: this process's monotonic
clock corrected by its offset from Redis's `TIME`, measured over one short round trip
and measured again every `REFRESH_S`. Two processes on hosts whose clocks disagree then agree to
within a round trip. Expiry of keys (heartbeats, the collector's lease) is Redis's own.

Only decisions need it; logs and the per-process timings stay on the local clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from dynamic_batching.conf import conf

from .connection import client, on_connect

log = logging.getLogger(__name__)

#: How often the offset from Redis's clock is measured again.
REFRESH_S = 30.0
#: A measurement whose round trip took longer than this is dropped: Redis read its clock
#: somewhere inside the round trip, so a long one (a retried command after an outage, a
#: stalled process) leaves the offset uncertain by half of it (issue 41, finding 10).
MAX_ROUND_TRIP_S = 0.1
#: After a dropped or failed measurement, try again this soon rather than a refresh later.
RETRY_S = 1.0


class RedisClock:
    """Redis's time as seen from here: this process's monotonic clock plus the measured
    offset between the two.

    Based on the monotonic clock, not this host's wall clock, so a step of the wall
    clock (NTP, an operator) between two measurements moves nothing; `monotonic` times
    both the round trip and the refresh, and `read_redis` returns Redis's `TIME` as
    seconds: both injectable, so the arithmetic is tested with fake clocks."""

    def __init__(
        self,
        read_redis: Callable[[], float] | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        refresh_s: float = REFRESH_S,
        max_round_trip_s: float = MAX_ROUND_TRIP_S,
    ) -> None:
        self._read_redis = read_redis or _redis_time
        self._monotonic = monotonic
        self._refresh_s = refresh_s
        self._max_round_trip_s = max_round_trip_s
        #: Redis's time minus the monotonic clock; None until a first good measurement.
        self._base: float | None = None
        self._next_at: float | None = None
        self._lock = threading.Lock()

    def now(self) -> float:
        if self._next_at is None or self._monotonic() >= self._next_at:
            self._measure()
        if self._base is None:
            # Never measured (Redis unreachable since start): this host's clock, the
            # best there is, until a measurement succeeds.
            return _host_clock()
        return self._monotonic() + self._base

    @property
    def base(self) -> float | None:
        """Redis's clock minus this process's monotonic clock, as last measured."""
        return self._base

    def forget(self) -> None:
        """Measure again on the next read (another Redis)."""
        self._next_at = None

    def _measure(self) -> None:
        with self._lock:
            before = self._monotonic()
            try:
                remote = self._read_redis()
            except Exception:  # noqa: BLE001 - keep the last offset; try again soon
                log.warning("could not read Redis's clock; keeping the last offset", exc_info=True)
                self._next_at = self._monotonic() + RETRY_S
                return
            after = self._monotonic()
            if after - before > self._max_round_trip_s and self._base is not None:
                log.info("dropped a clock reading with a %.3fs round trip; keeping the last offset", after - before)
                self._next_at = after + RETRY_S
                return
            # Redis read its clock somewhere in the round trip: assume the middle.
            self._base = remote - (before + after) / 2
            self._next_at = after + self._refresh_s


def _redis_time() -> float:
    # Through the shared client, which retries a command through an outage: a retried
    # TIME comes back long after Redis read it, and the round-trip filter drops it.
    seconds, micros = client().time()
    return seconds + micros / 1_000_000


def _host_clock() -> float:
    # CLOCK_SKEW_S shifts this process's notion of its host's clock: for tests that
    # stand a worker on a host whose clock is off (settings.py).
    return time.time() + conf.CLOCK_SKEW_S


_clock = RedisClock()
on_connect(_clock.forget)


def now() -> float:
    """Seconds since the epoch by Redis's clock: for every time another process judges."""
    return _clock.now()
