"""One clock for decisions across hosts: Redis's.

Deadlines, the ledger and heartbeats are written by one process and judged by another,
often on another host. Each process's wall clock may be off (a device host 11 s slow, a
web host a minute behind), so every such time is read from `now()`: this host's clock
corrected by its offset from Redis's `TIME`, measured over one round trip and measured
again every `REFRESH_S`. Two processes on hosts whose clocks disagree then agree to
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


class RedisClock:
    """Redis's time as seen from here: `local()` plus the measured offset.

    `local` is this host's wall clock, `monotonic` times the refresh, and `read_redis`
    returns Redis's `TIME` as seconds: all injectable, so the arithmetic is tested
    with fake clocks."""

    def __init__(
        self,
        read_redis: Callable[[], float] | None = None,
        *,
        local: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        refresh_s: float = REFRESH_S,
    ) -> None:
        self._read_redis = read_redis or _redis_time
        self._local = local
        self._monotonic = monotonic
        self._refresh_s = refresh_s
        self._offset = 0.0
        self._measured_at: float | None = None
        self._lock = threading.Lock()

    def now(self) -> float:
        if self._measured_at is None or self._monotonic() - self._measured_at >= self._refresh_s:
            self._measure()
        return self._local() + self._offset

    @property
    def offset(self) -> float:
        """Redis's clock minus this host's, as last measured."""
        return self._offset

    def forget(self) -> None:
        """Measure again on the next read (another Redis)."""
        self._measured_at = None

    def _measure(self) -> None:
        with self._lock:
            before = self._local()
            try:
                remote = self._read_redis()
            except Exception:  # noqa: BLE001 - keep the last offset; try again next read
                log.warning("could not read Redis's clock; keeping the last offset", exc_info=True)
                self._measured_at = self._monotonic()
                return
            after = self._local()
            # Redis read its clock somewhere in the round trip: assume the middle.
            self._offset = remote - (before + after) / 2
            self._measured_at = self._monotonic()


def _redis_time() -> float:
    seconds, micros = client().time()
    return seconds + micros / 1_000_000


def _host_clock() -> float:
    # CLOCK_SKEW_S shifts this process's notion of its host's clock: for tests that
    # stand a worker on a host whose clock is off (settings.py).
    return time.time() + conf.CLOCK_SKEW_S


_clock = RedisClock(local=_host_clock)
on_connect(_clock.forget)


def now() -> float:
    """Seconds since the epoch by Redis's clock: for every time another process judges."""
    return _clock.now()
