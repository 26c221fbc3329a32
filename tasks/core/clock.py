"""Clocks the core can be given: the real monotonic one, and a fake one for tests.

A clock also owns *waiting*, so that a thread blocked "until 10 ms from now" wakes when
a test advances a fake clock by 10 ms, without any real sleep.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        """Wait on `cond` (held by the caller) for at most `timeout` clock seconds."""
        ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        cond.wait(timeout)


class FakeClock:
    """Time moves only when a test calls `advance`; waiters then re-check their state."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self._conds: weakref.WeakSet[threading.Condition] = weakref.WeakSet()

    def now(self) -> float:
        return self._now

    def __call__(self) -> float:
        return self._now

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        with self._lock:
            first = cond not in self._conds
            self._conds.add(cond)
        if first:
            # `advance` could not notify a condition it did not know yet, so time may
            # have moved since the caller read it: return at once and let it re-check.
            # From now on every `advance` notifies `cond` under its lock, which the caller
            # holds from its reading until it waits, so no later advance is missed.
            return
        # No timeout: only `advance` or the owner's own notify ends this wait. Callers
        # re-check their state in a loop, so a wake-up that changes nothing is harmless.
        cond.wait()

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
            conds = list(self._conds)
        for cond in conds:
            with cond:
                cond.notify_all()
