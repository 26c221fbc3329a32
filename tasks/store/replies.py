"""Waiting for the answers of one reply group (tasks/edge/client.py::run_many).

The outcome script pushes each grouped request's answer onto its group's list as it is
stored (set_once.lua), so the caller pops many answers per round trip, and nothing
published before it listened can be missed: a list keeps what a channel would drop.
Written here rather than waiting through Celery's result consumer because that one
subscribes, unsubscribes and yields the GIL once per request, which was half the
client's CPU in a no-op run (docs/benchmarks.md).

Should the list ever lose an answer (a Redis restart without its append-only file), a
quiet second reads the stored answers of what is still missing, so a wait ends with
every answer or with its timeout, never a hang.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis
from celery.exceptions import TimeoutError as CeleryTimeoutError

#: How long one blocking pop waits before the stored answers are read instead.
QUIET_S = 1.0


def wait(
    r: redis.Redis,
    key: str,
    task_ids: Sequence[str],
    backend: Any,
    *,
    timeout: float | None = None,
) -> dict[str, dict[str, Any]]:
    """The answer meta of every id in `task_ids`, popped from the list `key` and
    decoded as Celery's result `backend` (which stores them) decodes its own.
    Raises Celery's TimeoutError if they are not all in within `timeout` seconds; the
    list is dropped either way, and answers that come later stay stored under their ids."""
    pending = set(task_ids)
    got: dict[str, dict[str, Any]] = {}
    end = None if timeout is None else time.monotonic() + timeout
    try:
        while pending:
            left = QUIET_S if end is None else end - time.monotonic()
            if left <= 0:
                raise CeleryTimeoutError(f"{len(pending)} of {len(task_ids)} answers not in after {timeout} s")
            popped = r.blmpop(max(0.01, min(QUIET_S, left)), 1, key, direction="LEFT", count=len(pending))
            if popped:
                raws = popped[1]
            else:
                ids = sorted(pending)
                raws = [v for v in r.mget([backend.get_key_for_task(t) for t in ids]) if v is not None]
            for raw in raws:
                meta = backend.decode_result(raw)
                task_id = meta.get("task_id")
                if task_id in pending:
                    pending.discard(task_id)
                    got[task_id] = meta
    finally:
        # Empty already unless an answer came by the stored copy, or the wait gave up.
        r.delete(key)
    return got
