"""How full Redis is: `INFO memory`'s used_memory against maxmemory, for /metrics and
/healthz.

Redis runs with `maxmemory-policy noeviction` (docker-compose.yml): evicting would
silently drop queued requests or answers, so once used memory reaches maxmemory every
write fails instead. The operator must hear of it before then (docs/deployment.md,
"Redis memory").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

from .connection import client

#: used / maxmemory at or above this is a warning on /healthz. The documented
#: Prometheus alert uses the same threshold.
WARN_FRACTION = 0.9


@dataclass(frozen=True)
class RedisMemory:
    #: INFO memory's used_memory: bytes Redis has allocated for data and buffers.
    used_bytes: int
    #: INFO memory's maxmemory; 0 means no limit.
    max_bytes: int

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> RedisMemory | None:
        """From the fields of `INFO memory`, or None when a Redis-compatible server
        leaves used_memory out."""
        try:
            return cls(used_bytes=int(info["used_memory"]), max_bytes=int(info.get("maxmemory") or 0))
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def fraction(self) -> float | None:
        """used / max, or None when there is no limit."""
        return self.used_bytes / self.max_bytes if self.max_bytes > 0 else None

    @property
    def state(self) -> str:
        """What /healthz reports: "unlimited" without maxmemory, "warning" from
        WARN_FRACTION of it, else "ok"."""
        fraction = self.fraction
        if fraction is None:
            return "unlimited"
        return "warning" if fraction >= WARN_FRACTION else "ok"

    def to_dict(self) -> dict[str, Any]:
        fraction = self.fraction
        return {
            "used_bytes": self.used_bytes,
            "max_bytes": self.max_bytes,
            "fraction": None if fraction is None else round(fraction, 4),
            "state": self.state,
        }


def read(r: redis.Redis | None = None) -> RedisMemory | None:
    """One INFO call. Raises redis.RedisError if Redis is unreachable."""
    return RedisMemory.from_info((r or client()).info("memory"))
