"""What processes tell each other through Redis, besides messages: the policy, the
heartbeats of devices and of the collector, and the slow inputs (keys in
tasks/protocol/names.py).

Every key that describes a live process has a TTL, so a killed process disappears by
itself instead of being counted forever.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import redis

from ..core.policy import BatchPolicy
from ..protocol.names import COLLECTOR_KEY, DEVICE_PREFIX, DEVICES_INDEX, POLICY_KEY, SLOW_INPUTS_KEY
from . import clock
from .connection import client, on_connect

# `client` is reached through here by most callers: the one Redis client of this process.
__all__ = ["client"]

#: How long a slow input is remembered.
SLOW_INPUTS_TTL_S = 3600
#: A device or collector that has not written its key for this long is gone.
HEARTBEAT_TTL_S = 10
HEARTBEAT_EVERY_S = 2.0

# --- policy --------------------------------------------------------------------------


def publish_policy(policy: BatchPolicy, r: redis.Redis | None = None) -> None:
    (r or client()).set(POLICY_KEY, json.dumps(policy.to_dict()))


def read_policy(r: redis.Redis | None = None) -> BatchPolicy:
    raw = (r or client()).get(POLICY_KEY)
    return BatchPolicy() if raw is None else BatchPolicy.from_dict(json.loads(raw))


class PolicyCache:
    """The policy as the edge sees it: re-read at most every `max_age_s` seconds."""

    def __init__(self, max_age_s: float = 1.0) -> None:
        self._max_age_s = max_age_s
        self._lock = threading.Lock()
        self._policy = BatchPolicy()
        self._read_at = float("-inf")
        on_connect(self.forget)

    def forget(self) -> None:
        """Read the policy again on the next get()."""
        self._read_at = float("-inf")

    def get(self) -> BatchPolicy:
        now = time.monotonic()
        if now - self._read_at >= self._max_age_s:
            with self._lock:
                if now - self._read_at >= self._max_age_s:
                    self._policy = read_policy()
                    self._read_at = now
        return self._policy


# --- devices ---------------------------------------------------------------------------


def device_heartbeat(device_id: str, info: dict[str, Any], r: redis.Redis | None = None) -> None:
    pipe = (r or client()).pipeline(transaction=False)
    pipe.set(DEVICE_PREFIX + device_id, json.dumps(info), ex=HEARTBEAT_TTL_S)
    pipe.zadd(DEVICES_INDEX, {device_id: clock.now()})
    pipe.execute()


def forget_device(device_id: str, r: redis.Redis | None = None) -> None:
    pipe = (r or client()).pipeline(transaction=False)
    pipe.delete(DEVICE_PREFIX + device_id)
    pipe.zrem(DEVICES_INDEX, device_id)
    pipe.execute()


def read_device(device_id: str, r: redis.Redis | None = None) -> dict[str, Any] | None:
    """A device worker's last heartbeat, while it lives (its key's TTL), or None."""
    raw = (r or client()).get(DEVICE_PREFIX + device_id)
    return None if raw is None else json.loads(raw)


def live_devices(r: redis.Redis | None = None) -> dict[str, dict[str, Any]]:
    r = r or client()
    cutoff = clock.now() - HEARTBEAT_TTL_S
    pipe = r.pipeline(transaction=False)
    pipe.zremrangebyscore(DEVICES_INDEX, "-inf", cutoff)
    pipe.zrange(DEVICES_INDEX, 0, -1)
    _, members = pipe.execute()
    ids = [m.decode() if isinstance(m, bytes) else m for m in members]
    if not ids:
        return {}
    out: dict[str, dict[str, Any]] = {}
    # The key's own TTL still decides: an index entry whose key has expired is dead.
    for device_id, raw in zip(ids, r.mget([DEVICE_PREFIX + i for i in ids]), strict=True):
        if raw is not None:
            out[device_id] = json.loads(raw)
    return out


# --- collector -------------------------------------------------------------------------


def collector_heartbeat(info: dict[str, Any], r: redis.Redis | None = None) -> None:
    (r or client()).set(COLLECTOR_KEY, json.dumps(info), ex=HEARTBEAT_TTL_S)


def read_collector(r: redis.Redis | None = None) -> dict[str, Any] | None:
    raw = (r or client()).get(COLLECTOR_KEY)
    return None if raw is None else json.loads(raw)


# --- slow inputs ---------------------------------------------------------------------------


def remember_slow_input(fp: str, r: redis.Redis | None = None) -> None:
    """A device confirmed this input slow in itself: remembered for SLOW_INPUTS_TTL_S
    from now, each input on its own clock (a sorted set scored by when to forget it)."""
    (r or client()).zadd(SLOW_INPUTS_KEY, {fp: clock.now() + SLOW_INPUTS_TTL_S})


def slow_inputs(r: redis.Redis | None = None) -> set[str]:
    """The inputs still remembered as slow; the forgotten ones are dropped."""
    r = r or client()
    now = clock.now()
    pipe = r.pipeline(transaction=False)
    pipe.zremrangebyscore(SLOW_INPUTS_KEY, "-inf", now)
    pipe.zrangebyscore(SLOW_INPUTS_KEY, now, "+inf")
    return {m.decode() for m in pipe.execute()[1]}
