"""How often the broker has handed a batch task out again.

A batch message comes back (kombu marks it redelivered) when its device worker died
running it, or when the worker could not finish it and requeued it. A first delivery
costs nothing here; each redelivery adds one, so a device worker knows how often a
batch has already failed to finish (gpu_workers/runner.py splits it, and answers a
lone request that keeps killing workers with its own error).
"""

from __future__ import annotations

import redis

from ..protocol.names import redeliveries_key

#: A counter outlives any redelivery by far; it only has to outlive the batch.
KEEP_S = 3600


def count(r: redis.Redis, task_id: str) -> int:
    """Count one more redelivery of `task_id`; returns how many there have been."""
    key = redeliveries_key(task_id)
    pipe = r.pipeline(transaction=False)
    pipe.incr(key)
    pipe.expire(key, KEEP_S)
    return int(pipe.execute()[0])
