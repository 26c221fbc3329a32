"""One active collector at a time: a lease in Redis, with a fencing token.

A collector starts as a standby and becomes active once it holds the lease. The lease is
a key that expires after `ttl_s` unless its holder renews it, so a collector that dies
(or stalls) loses it, and a standby takes over within about `ttl_s`. Expiry is Redis's
own clock, so the collectors' clocks do not matter.

Each holder gets a fencing token, "<epoch>:<nonce>": its epoch larger than every earlier
one, and unique even if a lost write let an epoch repeat (lease.lua). The scripts that take
requests into the held hashes and dispatch batches check it in Redis, in the same
atomic step (tasks/store/request_queues.py). A collector that lost its lease without
knowing it (a long pause) can therefore move nothing; it learns so (`LeaseLost`) and
exits, and the supervisor restarts it as a standby.
"""

from __future__ import annotations

import uuid

import redis
from redis.commands.core import Script

from ..protocol import lua
from ..protocol.names import COLLECTOR_EPOCH_KEY, COLLECTOR_LEASE_KEY

_LEASE_SCRIPT = Script(None, lua.source("lease"))


def epoch_of(token: object) -> int:
    """A fencing token's epoch: which holder it was, in order ("<epoch>:<nonce>")."""
    return int(str(token or "0").partition(":")[0])


class LeaseLost(RuntimeError):
    """This collector no longer holds the lease: another one is active."""


class Lease:
    def __init__(self, r: redis.Redis, ttl_s: float) -> None:
        self.r = r
        self.ttl_ms = max(1, int(ttl_s * 1000))
        #: The fencing token while this process holds the lease, else None.
        self.token: str | None = None

    def acquire(self) -> bool:
        """Take the lease if nobody holds it. True if this process holds it now."""
        token = _LEASE_SCRIPT(
            keys=[COLLECTOR_LEASE_KEY, COLLECTOR_EPOCH_KEY],
            args=["acquire", self.ttl_ms, uuid.uuid4().hex],
            client=self.r,
        )
        if not token:
            return False
        self.token = token.decode() if isinstance(token, bytes) else str(token)
        return True

    def renew(self) -> None:
        """Extend the lease; raises LeaseLost if another collector holds it now."""
        if self.token is None or not self._call("renew", self.ttl_ms):
            self.token = None
            raise LeaseLost("this collector's lease expired or was taken over")

    def release(self) -> None:
        """Give the lease up (a clean stop), so a standby takes over at once."""
        if self.token is not None:
            self._call("release")
            self.token = None

    def _call(self, op: str, *args: object) -> bool:
        keys = [COLLECTOR_LEASE_KEY, COLLECTOR_EPOCH_KEY]
        return bool(_LEASE_SCRIPT(keys=keys, args=[op, self.token, *args], client=self.r))
