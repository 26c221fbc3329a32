"""A circuit breaker for one device: stop pulling work after repeated device failures.

closed --(threshold failures in a row)--> open --(cooldown passes)--> half-open
half-open --(a batch succeeds)--> closed;  half-open --(it fails)--> open again

Pure: the caller reports outcomes and gives a clock; the device worker turns state
changes into "stop / resume consuming the shared batch queue".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"


@dataclass
class CircuitBreaker:
    clock: Callable[[], float]
    #: Device failures in a row that open the circuit.
    threshold: int = 3
    #: How long an open circuit waits before it lets one batch through to test the device.
    cooldown_s: float = 30.0
    failures: int = 0
    opened_at: float | None = None
    trips: int = field(default=0)

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return CLOSED
        if self.clock() - self.opened_at >= self.cooldown_s:
            return HALF_OPEN
        return OPEN

    def allow(self) -> bool:
        """May this device run a batch now?"""
        return self.state != OPEN

    def record_success(self) -> None:
        self.failures = 0
        self.opened_at = None

    def record_failure(self) -> bool:
        """Count a device failure; True if this opened (or re-opened) the circuit."""
        self.failures += 1
        if self.state == HALF_OPEN or (self.opened_at is None and self.failures >= self.threshold):
            self.opened_at = self.clock()
            self.trips += 1
            return True
        return False

    def seconds_until_half_open(self) -> float:
        if self.opened_at is None:
            return 0.0
        return max(0.0, self.opened_at + self.cooldown_s - self.clock())
