"""Recorded rounds (tasks/collector/rounds.py): a capped list, newest first."""

from __future__ import annotations

import json
from typing import Any

import redis

from ..protocol.names import ROUNDS_KEY
from .connection import client

#: Rounds kept; older ones are trimmed.
ROUNDS_KEPT = 1000


def record(summary: dict[str, Any], r: redis.Redis | None = None) -> None:
    pipe = (r or client()).pipeline(transaction=False)
    pipe.lpush(ROUNDS_KEY, json.dumps(summary))
    pipe.ltrim(ROUNDS_KEY, 0, ROUNDS_KEPT - 1)
    pipe.execute()


def recent(count: int = 100, r: redis.Redis | None = None) -> list[dict[str, Any]]:
    """The newest `count` recorded rounds, newest first."""
    return [json.loads(x) for x in (r or client()).lrange(ROUNDS_KEY, 0, count - 1)]
