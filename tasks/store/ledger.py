"""The ledger of accepted requests: the safety net under every hand-off.

kombu's Redis transport pops a message (BRPOP) and only then records it as unacked, in
a second command. A device worker killed between the two loses that batch message, and
with it every request in the batch. (Request messages do not have that gap: the
collector takes them with one script that moves them into a held hash, see
tasks/store/request_queues.py.) So the edge writes every request it accepts into a ledger, in
the same script that checks the queue cap and queues it; the collector touches its
entry when it sends it to a device, in the same transaction; and the outcome writer
strikes it off in the same script that stores the answer.

The collector sweeps the ledger (tasks/collector/housekeeping.py), and makes a request
overdue at once (touched at time 0) when it finds the batch it was sent in nowhere. A request is lost
when its entry is older than any redelivery takes, it is not held by the collector, and
it cannot be waiting in its queue: its entry is older than that of the oldest request
still queued there (a queue is first in, first out). That rule holds under any backlog,
so the sweep never waits for a queue to empty. A lost request is queued again, at most
`LEDGER_ATTEMPTS` times; after that it is answered with `RequestLost`, so no caller
waits forever on a failure that always recurs. Queuing twice is safe: the collector
keeps one copy of an id it holds, and only the first answer is ever stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import redis

from ..protocol.names import LEDGER_ATTEMPTS_KEY, LEDGER_KEY
from ..protocol.names import LEDGER_PAYLOADS_KEY as PAYLOADS_KEY

#: How many entries one read of the ledger takes; the sweep reads page after page.
PAGE = 500


def overdue(r: redis.Redis, cutoff: float) -> list[tuple[str, float, bytes]]:
    """Every unanswered request last touched before `cutoff` (a Unix time): its id,
    when it was touched, and its message, oldest first."""
    out: list[tuple[str, float, bytes]] = []
    start = 0
    while True:
        rows = r.zrangebyscore(LEDGER_KEY, "-inf", cutoff, start=start, num=PAGE, withscores=True)
        if not rows:
            return out
        ids = [i.decode() for i, _ in rows]
        answered = []
        for (_, score), task_id, raw in zip(rows, ids, r.hmget(PAYLOADS_KEY, ids), strict=True):
            if raw is None:
                answered.append(task_id)  # answered between the two reads
            else:
                out.append((task_id, float(score), raw))
        if answered:
            r.zrem(LEDGER_KEY, *answered)
        if len(rows) < PAGE:
            return out
        start += len(rows) - len(answered)


def lost(
    candidates: Iterable[tuple[str, float, str | None]],
    held: Mapping[str, object],
    oldest_waiting: Mapping[str, float],
) -> list[str]:
    """The ids among overdue (id, touched at, tier) candidates that are nowhere: not
    held by the collector, and touched before the oldest request still waiting in
    their tier's queue (`oldest_waiting`: tier -> its ledger time, +inf when the
    queue is empty), so not in that queue either."""
    return [
        task_id
        for task_id, touched, tier in candidates
        if tier is not None and task_id not in held and touched < oldest_waiting.get(tier, float("-inf"))
    ]


def touch(pipe: redis.client.Pipeline | redis.Redis, task_ids: Sequence[str], now: float) -> None:
    """Mark requests as just handed on (sent to a device, or queued again), so the
    sweep gives them time again. Only entries still in the ledger are touched."""
    if task_ids:
        pipe.zadd(LEDGER_KEY, dict.fromkeys(task_ids, now), xx=True)


def count_attempts(r: redis.Redis, task_ids: Sequence[str]) -> list[int]:
    """Add one to each request's count of times queued again; returns the new counts."""
    if not task_ids:
        return []
    pipe = r.pipeline(transaction=False)
    for task_id in task_ids:
        pipe.hincrby(LEDGER_ATTEMPTS_KEY, task_id, 1)
    return [int(n) for n in pipe.execute()]


def scores(r: redis.Redis, task_ids: Sequence[str | None]) -> list[float | None]:
    """Each request's ledger time, None where it has none (or no id was given)."""
    pipe = r.pipeline(transaction=False)
    for task_id in task_ids:
        pipe.zscore(LEDGER_KEY, task_id or "")
    return [None if s is None else float(s) for s in pipe.execute()]


def size(r: redis.Redis) -> int:
    return int(r.zcard(LEDGER_KEY))
