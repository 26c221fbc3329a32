"""The ledger of accepted requests: the safety net under every hand-off.

kombu's Redis transport pops a message (BRPOP) and only then records it as unacked, in
a second command. A device worker killed between the two loses that batch message, and
with it every request in the batch. (Request messages do not have that gap: the
collector takes them with one script that moves them into a held hash, see
tasks/store/request_queues.py.) So the edge writes every request it accepts into a ledger, in
the same script that checks the queue cap and queues it, and the outcome writer strikes
it off in the same script that stores the answer. The collector sweeps the ledger: a
request still unanswered long after any redelivery would have happened, and not
waiting anywhere, is queued again. Queuing twice is safe: the collector keeps one copy
of an id it holds, and only the first answer is ever stored.
"""

from __future__ import annotations

import time

import redis

from ..protocol.names import LEDGER_KEY
from ..protocol.names import LEDGER_PAYLOADS_KEY as PAYLOADS_KEY


def overdue(r: redis.Redis, older_than_s: float, limit: int = 500) -> list[tuple[str, bytes]]:
    """Unanswered requests last published more than `older_than_s` ago."""
    ids = [i.decode() for i in r.zrangebyscore(LEDGER_KEY, "-inf", time.time() - older_than_s, start=0, num=limit)]
    if not ids:
        return []
    out = []
    for task_id, raw in zip(ids, r.hmget(PAYLOADS_KEY, ids), strict=True):
        if raw is None:
            r.zrem(LEDGER_KEY, task_id)  # answered between the two reads
        else:
            out.append((task_id, raw))
    return out


def touch(r: redis.Redis, task_ids: list[str]) -> None:
    """Mark requests as just republished, so the next sweep gives them time again."""
    if task_ids:
        now = time.time()
        r.zadd(LEDGER_KEY, dict.fromkeys(task_ids, now))


def size(r: redis.Redis) -> int:
    return int(r.zcard(LEDGER_KEY))
