"""The ledger of accepted requests: the safety net under every hand-off.

kombu's Redis transport pops a message (BRPOP) and only then records it as unacked, in
a second command. A consumer killed between the two loses that message: one request in
a few hundred per `kill -9` of the collector, in our chaos tests. So the edge writes
every request it accepts into a ledger, atomically with the queue-cap check, and the
outcome writer strikes it off in the same script that stores the answer. The collector
sweeps the ledger: a request still unanswered long after any redelivery would have
happened, and not waiting anywhere, is published again. Publishing twice is safe: the
collector keeps one copy of an id it holds, and only the first answer is ever stored.

    batching:ledger            sorted set: request id -> when it was (re)published
    batching:ledger:payloads   hash: request id -> {"queue": ..., "message": ...}
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis
from redis.commands.core import Script

LEDGER_KEY = "batching:ledger"
PAYLOADS_KEY = "batching:ledger:payloads"

# Admission and record in one step: the depth is the broker queue plus what the
# collector reports holding; over the cap nothing is recorded.
_ADMIT = """
local depth = redis.call('LLEN', KEYS[1])
local raw = redis.call('GET', KEYS[2])
if raw then
    local ok, c = pcall(cjson.decode, raw)
    if ok and type(c) == 'table' and type(c['buffered']) == 'table' and c['buffered'][ARGV[1]] then
        depth = depth + tonumber(c['buffered'][ARGV[1]])
    end
end
local n = (#ARGV - 3) / 2
if depth + n > tonumber(ARGV[2]) then
    return {0, depth}
end
for i = 4, #ARGV, 2 do
    redis.call('ZADD', KEYS[3], ARGV[3], ARGV[i])
    redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
end
return {1, depth}
"""

# Built once: a Script keeps its SHA and runs on whichever client each call names.
_ADMIT_SCRIPT = Script(None, _ADMIT.encode())


def admit(
    r: redis.Redis,
    *,
    queue: str,
    priority: str,
    cap: int,
    collector_key: str,
    entries: list[tuple[str, dict[str, Any]]],
) -> tuple[bool, int]:
    """Record `entries` (id, message) as accepted unless the queue would pass its cap.
    Returns (accepted, depth before)."""
    args: list[Any] = [priority, cap, time.time()]
    for task_id, message in entries:
        args += [task_id, json.dumps({"queue": queue, "message": message})]
    ok, depth = _ADMIT_SCRIPT(keys=[queue, collector_key, LEDGER_KEY, PAYLOADS_KEY], args=args, client=r)
    return bool(ok), int(depth)


def forget(r: redis.Redis, task_ids: list[str]) -> None:
    """Strike requests off (they were never published after all)."""
    if task_ids:
        r.pipeline(transaction=False).zrem(LEDGER_KEY, *task_ids).hdel(PAYLOADS_KEY, *task_ids).execute()


def overdue(r: redis.Redis, older_than_s: float, limit: int = 500) -> list[tuple[str, dict[str, Any]]]:
    """Unanswered requests last published more than `older_than_s` ago."""
    ids = [i.decode() for i in r.zrangebyscore(LEDGER_KEY, "-inf", time.time() - older_than_s, start=0, num=limit)]
    if not ids:
        return []
    out = []
    for task_id, raw in zip(ids, r.hmget(PAYLOADS_KEY, ids), strict=True):
        if raw is None:
            r.zrem(LEDGER_KEY, task_id)  # answered between the two reads
        else:
            out.append((task_id, json.loads(raw)))
    return out


def touch(r: redis.Redis, task_ids: list[str]) -> None:
    """Mark requests as just republished, so the next sweep gives them time again."""
    if task_ids:
        now = time.time()
        r.zadd(LEDGER_KEY, dict.fromkeys(task_ids, now))


def size(r: redis.Redis) -> int:
    return int(r.zcard(LEDGER_KEY))
