"""Who submitted each request, and what each client has in flight.

The admission script (tasks/protocol/lua/admit.lua) writes an owner key per request,
"<tier>|<owner>", in the same step that queues it; the outcome script keeps it as long
as the answer. The web asks here before it shows anybody a request
(tasks/web/access.py). A request with no owner key was submitted by a trusted
in-process caller (`submit()` from a script), or its answer has expired.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis

from ..protocol.names import OWNERS_INDEX_KEY, PRIORITIES, in_flight_key, owner_key, rate_key
from . import clock


def owners_of(r: redis.Redis, task_ids: Sequence[str]) -> dict[str, str | None]:
    """Each id's owner, or None. One round trip."""
    if not task_ids:
        return {}
    values = r.mget([owner_key(t) for t in task_ids])
    out: dict[str, str | None] = {}
    for task_id, value in zip(task_ids, values, strict=True):
        if value is None:
            out[task_id] = None
        else:
            text = value.decode() if isinstance(value, bytes) else str(value)
            out[task_id] = text.partition("|")[2]
    return out


def owner_of(r: redis.Redis, task_id: str) -> str | None:
    return owners_of(r, [task_id])[task_id]


@dataclass(frozen=True)
class ClientUse:
    owner: str
    #: Accepted and not yet answered, per tier.
    in_flight: dict[str, int]
    #: Requests the rate bucket holds now (None when it is full and forgotten).
    bucket: float | None
    last_admitted_at: float


def recent_clients(r: redis.Redis, *, within_s: float = 600.0, limit: int = 20) -> list[ClientUse]:
    """Clients with a request admitted in the last `within_s`, busiest first."""
    now = clock.now()
    recent = r.zrevrangebyscore(OWNERS_INDEX_KEY, "+inf", now - within_s, start=0, num=200, withscores=True)
    pipe = r.pipeline(transaction=False)
    owners = []
    for raw, at in recent:
        owner = raw.decode() if isinstance(raw, bytes) else str(raw)
        owners.append((owner, float(at)))
        for p in PRIORITIES:
            pipe.zcount(in_flight_key(owner, p), now, "+inf")
        pipe.hget(rate_key(owner), "tokens")
    values = pipe.execute() if owners else []
    step = len(PRIORITIES) + 1
    out = []
    for i, (owner, at) in enumerate(owners):
        row = values[i * step : (i + 1) * step]
        counts = {p: int(c) for p, c in zip(PRIORITIES, row[:-1], strict=True)}
        out.append(ClientUse(owner, counts, None if row[-1] is None else float(row[-1]), at))
    out.sort(key=lambda c: (-sum(c.in_flight.values()), -c.last_admitted_at))
    # Forget clients idle for longer than anyone looks back.
    r.zremrangebyscore(OWNERS_INDEX_KEY, "-inf", now - 24 * 3600)
    return out[:limit]
