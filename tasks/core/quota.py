"""A client's quota: what one user (or one anonymous demo session) may spend.

Checked by the edge's admission script in Redis (tasks/protocol/lua/admit.lua), in the
same atomic step as the tier's cap, so a flood from one client can never slip past it
between a check and a push. Three limits, each answered with 429 and Retry-After:

- a **rate**: a token bucket of `burst` requests refilled at `rate_per_s`;
- **in flight**: at most `max_in_flight` of the client's requests accepted and not yet
  answered, over all tiers;
- a **share of each tier**: at most `tier_share` of a tier's queue cap held by this
  client, so other clients still get in while one fills its share.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

from .policy import PRIORITIES

#: What can refuse a client's request, as the admission script names it.
QUOTA_LIMITS: tuple[str, ...] = ("rate", "in_flight", "share")


@dataclass(frozen=True)
class Quota:
    #: Sustained requests a second (the bucket's refill rate).
    rate_per_s: float = 50.0
    #: Requests accepted at once from a full bucket.
    burst: int = 200
    #: Most requests accepted and not yet answered, all tiers together.
    max_in_flight: int = 500
    #: Most of one tier's queue cap this client may hold, as a fraction in (0, 1].
    tier_share: float = 0.5
    #: The most urgent tier this client may ask for; above it a call is refused (403),
    #: never quietly lowered, so a caller knows where its requests went.
    max_priority: str = "normal"

    def __post_init__(self) -> None:
        if not (isinstance(self.rate_per_s, (int, float)) and math.isfinite(self.rate_per_s) and self.rate_per_s > 0):
            raise ValueError(f"rate_per_s must be a positive number of requests a second, got {self.rate_per_s!r}")
        for name in ("burst", "max_in_flight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not (isinstance(self.tier_share, (int, float)) and 0 < self.tier_share <= 1):
            raise ValueError(f"tier_share must be a fraction in (0, 1], got {self.tier_share!r}")
        if self.max_priority not in PRIORITIES:
            raise ValueError(f"max_priority must be one of {', '.join(PRIORITIES)}, got {self.max_priority!r}")

    def allows(self, priority: str) -> bool:
        """Whether this client may ask for `priority` (PRIORITIES runs most urgent first)."""
        return priority not in PRIORITIES or PRIORITIES.index(priority) >= PRIORITIES.index(self.max_priority)

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> Quota:
        """A quota from settings ("rate_per_s=50,burst=200"): unknown keys are named."""
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(
                f"unknown quota field(s) {', '.join(sorted(unknown))}; known: {', '.join(cls.__annotations__)}"
            )
        kinds = {"rate_per_s": float, "burst": int, "max_in_flight": int, "tier_share": float, "max_priority": str}
        return cls(**{k: kinds[k](v) for k, v in values.items()})

    def share_of(self, cap: int) -> int:
        """How many of a tier capped at `cap` this client may hold: at least one."""
        return max(1, math.floor(cap * self.tier_share))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RefusalMemory:
    """Who was just refused for their rate, and until when, in one web process.

    The rate bucket cannot refill before the `retry_after` the admission script gave,
    so a request from the same client inside that window would be refused again:
    answering it from here saves the token lookup and the Redis round trip, which is
    most of what a flood of refused requests costs everybody else. Written by hand
    because it is a dict with deadlines: bounded, oldest dropped first.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, size: int = 10_000) -> None:
        self._clock = clock
        self._size = size
        self._until: dict[str, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def remember(self, key: str, seconds: float, value: Any) -> None:
        with self._lock:
            self._until.pop(key, None)
            self._until[key] = (self._clock() + seconds, value)
            while len(self._until) > self._size:
                self._until.pop(next(iter(self._until)))

    def clear(self) -> None:
        with self._lock:
            self._until.clear()

    def recall(self, key: str) -> tuple[Any, float] | None:
        """(what was remembered, seconds left), or None once the window has passed."""
        with self._lock:
            hit = self._until.get(key)
            if hit is None:
                return None
            left = hit[0] - self._clock()
            if left <= 0:
                del self._until[key]
                return None
            return hit[1], left
