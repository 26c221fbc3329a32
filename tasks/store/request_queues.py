"""The request queues in Redis: the edge puts requests in, the collector takes them out.

Each tier has a list of waiting request messages (newest on the left) and a held hash
of the ones the collector has taken and not yet sent in a batch (its "unacked"
requests). The three steps of the hot path are each one Lua script or one transaction,
atomic and one round trip however many requests they move:

- `admit` (the edge): check the tier's depth against its cap and the owner's quota
  (tasks/core/quota.py), record who owns each request, record the requests in
  the ledger (tasks/store/ledger.py), push their messages and the wake token, and publish
  their task-sent events. All of a `submit_many` is accepted, or none of it.
- `take` (the collector): move up to its window of messages per tier from the queue
  into the held hash, and drain the devices' done events, in one call.
- `dispatch` (the collector): push a batch task for the devices, strike its requests
  off the held hash and touch their ledger entries, in one transaction, so no request
  is ever both held and sent.

A tier's depth is LLEN(queue) + HLEN(held): every accepted request of that tier not
yet handed to a device. The edge admits against exactly that, atomically, so a queue
cap is a hard bound. A collector that dies leaves its held requests in Redis; the next
one adopts them (`held`), so nothing waits for a visibility timeout and nothing is
lost between popping a message and recording it, as it can be with kombu's BRPOP.

The repairs off the hot path, `release` (a collector shutting down) and `republish`
(the ledger sweep), take two round trips each.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis
from redis.commands.core import Script

from ..core.quota import Quota
from ..protocol import events as flower_events
from ..protocol import lua, wire
from ..protocol.events import Events
from ..protocol.names import (
    COLLECTOR_LEASE_KEY,
    DEADLINES_KEY,
    EVENTS_QUEUE,
    LEDGER_KEY,
    LEDGER_PAYLOADS_KEY,
    OWNERS_INDEX_KEY,
    PRIORITIES,
    WAKE_KEY,
    held_key,
    in_flight_key,
    owner_key,
    queued_key,
    rate_key,
    request_queue_name,
)
from . import clock, ledger
from .lease import LeaseLost

# Built once: a Script keeps its SHA and runs on whichever client each call names.
_ADMIT_SCRIPT = Script(None, lua.source("admit"))
_TAKE_SCRIPT = Script(None, lua.source("take"))
_DISPATCH_SCRIPT = Script(None, lua.source("dispatch"))
_CHARGE_SCRIPT = Script(None, lua.source("charge"))
#: A tier's position among the held hashes that the dispatch script is given (1-based).
_TIER_INDEX = {p: i + 1 for i, p in enumerate(PRIORITIES)}
#: Unused placeholders for requests with no owner (a trusted in-process caller).
_NO_QUOTA = Quota()


class Admission(NamedTuple):
    accepted: bool
    #: The tier's depth before, or, when the owner's quota refused, the owner's count.
    depth: int
    #: What refused: "tier" (the cap), or the quota's "share", "in_flight" or "rate";
    #: "" when accepted.
    refused_by: str = ""
    #: When a retry can succeed, in seconds (the rate bucket's refill; else a guess).
    retry_after: float = 0.0


def admit(
    r: redis.Redis,
    priority: str,
    cap: int,
    entries: Sequence[tuple[str, str]],
    events: Events | None = None,
    *,
    owner: str = "",
    quota: Quota | None = None,
    keep_s: float = 3600.0,
    in_flight_s: float = 3600.0,
    deadline_at: float | None = None,
    now: float | None = None,
) -> Admission:
    """Enqueue `entries` (id, message) unless the tier would pass its cap or, for an
    `owner`, its `quota`; then publish their task-sent `events`. An owner's requests
    are recorded as theirs for `keep_s` (then as long as their answers), and count
    against its in-flight limit until answered or `in_flight_s` has passed. `now` is
    Redis's clock unless a test gives its own."""
    if owner and (quota is None or "|" in owner):
        raise ValueError(f"an owner needs a quota and no '|' in its name: {owner!r}")
    q = quota or _NO_QUOTA
    if now is None:
        now = clock.now()
    args: list[Any] = [
        cap,
        now,
        events.message() if events else "",
        owner,
        f"{priority}|{owner}",
        q.rate_per_s,
        q.burst,
        q.max_in_flight,
        q.share_of(cap),
        _TIER_INDEX[priority],
        max(1, math.ceil(keep_s)),
        now + in_flight_s,
        "" if deadline_at is None else repr(deadline_at),
    ]
    if events:
        channels = flower_events.topics(events.app)
        args += [len(channels), *channels]
    else:
        args.append(0)
    for task_id, raw in entries:
        args += [task_id, raw]
    keys = [
        request_queue_name(priority),
        held_key(priority),
        LEDGER_KEY,
        LEDGER_PAYLOADS_KEY,
        WAKE_KEY,
        rate_key(owner),
        *(in_flight_key(owner, p) for p in PRIORITIES),
        OWNERS_INDEX_KEY,
        DEADLINES_KEY,
        queued_key(priority),
    ]
    if owner:
        keys += [owner_key(task_id) for task_id, _ in entries]
    ok, depth, refused_by, retry_ms = _ADMIT_SCRIPT(keys=keys, args=args, client=r)
    if isinstance(refused_by, bytes):
        refused_by = refused_by.decode()
    return Admission(bool(ok), int(depth), refused_by, int(retry_ms) / 1000.0)


def charge(r: redis.Redis, bucket: str, quota: Quota, n: int, *, take: bool, now: float | None = None) -> float:
    """Charge `n` tokens to the token bucket `bucket` (an owner's `rate_key`, or another
    limit's) at `quota`'s rate and burst, outside admission. `take`: only if it holds
    them (a rate limit on a call); else spend them whatever it holds, down to minus the
    burst (work refused after it was done). Returns the seconds until it holds a token
    again (`take`: until it holds `n`, and nothing was taken); 0.0 when it does now."""
    args = [quota.rate_per_s, quota.burst, n, clock.now() if now is None else now, "take" if take else "spend"]
    return int(_CHARGE_SCRIPT(keys=[bucket], args=args, client=r)) / 1000.0


def take(
    r: redis.Redis, window: int, token: str, answered_prefix: bytes | str = b""
) -> tuple[dict[str, list[bytes]], list[bytes], list[str]]:
    """Up to `window` held per tier: the newly taken messages of each tier, oldest
    first, the waiting events, oldest first, and the ids of messages dropped because
    their request has an answer under `answered_prefix` + its id already (revoked while
    queued). Raises LeaseLost (moving nothing) unless `token` is the lease's fencing
    token."""
    keys = [
        *(request_queue_name(p) for p in PRIORITIES),
        *(held_key(p) for p in PRIORITIES),
        WAKE_KEY,
        EVENTS_QUEUE,
        COLLECTOR_LEASE_KEY,
        *(queued_key(p) for p in PRIORITIES),
    ]
    out = _TAKE_SCRIPT(keys=keys, args=[window, token, answered_prefix], client=r)
    if not out:
        raise LeaseLost("another collector holds the lease")
    *tiers, events, dropped = out
    return (
        dict(zip(PRIORITIES, tiers, strict=True)),
        list(reversed(events)),
        [d.decode() if isinstance(d, bytes) else d for d in dropped],
    )


def wait(r: redis.Redis, timeout_s: float, *, requests: bool) -> bytes | None:
    """Block until a request arrives (when `requests`), an event arrives, or the
    timeout passes. Returns an event's message if one was popped."""
    keys = [WAKE_KEY, EVENTS_QUEUE] if requests else [EVENTS_QUEUE]
    popped = r.brpop(keys, timeout=max(0.001, timeout_s))
    if popped and popped[0].decode() == EVENTS_QUEUE:
        return popped[1]
    return None


def held(r: redis.Redis) -> dict[str, list[bytes]]:
    """Every held message per tier: what a previous collector took and never sent."""
    pipe = r.pipeline(transaction=False)
    for p in PRIORITIES:
        pipe.hvals(held_key(p))
    return dict(zip(PRIORITIES, pipe.execute(), strict=True))


def held_items(r: redis.Redis) -> dict[str, list[tuple[str, bytes]]]:
    """Every held (request id, message) per tier, the id as the take script read it."""
    pipe = r.pipeline(transaction=False)
    for p in PRIORITIES:
        pipe.hgetall(held_key(p))
    return {
        p: [(k.decode() if isinstance(k, bytes) else k, v) for k, v in rows.items()]
        for p, rows in zip(PRIORITIES, pipe.execute(), strict=True)
    }


@dataclass(frozen=True)
class Chord:
    """A round's chord in the result backend: its size under its group's key."""

    size_key: str
    size: int
    expires_s: int = 0


def dispatch(
    r: redis.Redis,
    token: str,
    messages: Sequence[tuple[str, str]],
    items: Iterable[tuple[str, str]],
    events: Events | None = None,
    chord: Chord | None = None,
) -> None:
    """Push (queue, task message) batches, strike their (priority, id) requests off
    the held hashes and touch their ledger entries, set a round's chord size and
    publish the task-sent `events`: one script, all or nothing, and only under the
    lease's fencing `token` (else LeaseLost, and nothing moved). With no messages, it
    only strikes requests off: they have their outcome."""
    keys = [
        COLLECTOR_LEASE_KEY,
        LEDGER_KEY,
        *(held_key(p) for p in PRIORITIES),
        chord.size_key if chord else COLLECTOR_LEASE_KEY,
        *(queue for queue, _ in messages),
    ]
    args: list[Any] = [token, clock.now(), chord.size if chord else 0, chord.expires_s if chord else 0]
    if events:
        channels = flower_events.topics(events.app)
        args += [events.message(), len(channels), *channels]
    else:
        args += ["", 0]
    args += [raw for _, raw in messages]
    for priority, task_id in items:
        args += [_TIER_INDEX[priority], task_id]
    if not _DISPATCH_SCRIPT(keys=keys, args=args, client=r):
        raise LeaseLost("another collector holds the lease")


def ack(r: redis.Redis, token: str, items: Iterable[tuple[str, str]]) -> None:
    """Strike (priority, id) requests off the held hashes: they have their outcome."""
    dispatch(r, token, [], items)


def release(r: redis.Redis, items: Sequence[tuple[str, str]]) -> None:
    """Put held (priority, id) requests back at the head of their queues, the first of
    `items` last so it is taken first, for the next collector."""
    pipe = r.pipeline(transaction=False)
    for priority, task_id in items:
        pipe.hget(held_key(priority), task_id)
    raws = pipe.execute()
    pipe = r.pipeline(transaction=True)
    for (priority, task_id), raw in reversed(list(zip(items, raws, strict=True))):
        if raw is not None:
            pipe.rpush(request_queue_name(priority), raw)
            pipe.sadd(queued_key(priority), task_id)
            pipe.hdel(held_key(priority), task_id)
    pipe.lpush(WAKE_KEY, 1).ltrim(WAKE_KEY, 0, 0)
    pipe.execute()


def republish(r: redis.Redis, entries: Sequence[tuple[str, str, bytes]]) -> None:
    """Push (priority, id, message) requests again: the ledger sweep's repair."""
    if not entries:
        return
    pipe = r.pipeline(transaction=True)  # the push and the queued set together (sweep_purged)
    for priority, task_id, raw in entries:
        pipe.lpush(request_queue_name(priority), raw)
        pipe.sadd(queued_key(priority), task_id)
    ledger.touch(pipe, [task_id for _, task_id, _ in entries], clock.now())
    pipe.lpush(WAKE_KEY, 1).ltrim(WAKE_KEY, 0, 0)
    pipe.execute()


def purged(r: redis.Redis) -> list[tuple[str, str]]:
    """The (priority, id) of requests someone else removed from their queue (`celery
    purge` deletes the list), struck off the queued sets. Each push and take writes a
    tier's queued set in the same script, so a set larger than its queue is the sign;
    only then are the set, the queue and the held hash read, together. An id found held
    was taken by a take that did not strike it off (a collector from before the queued
    sets, during an upgrade: upgrade collectors before edges): it is struck off, never
    reported."""
    pipe = r.pipeline(transaction=True)
    for p in PRIORITIES:
        pipe.scard(queued_key(p)).llen(request_queue_name(p))
    counts = pipe.execute()
    tiers = [p for i, p in enumerate(PRIORITIES) if counts[2 * i] > counts[2 * i + 1]]
    if not tiers:
        return []
    pipe = r.pipeline(transaction=True)
    for p in tiers:
        pipe.smembers(queued_key(p)).lrange(request_queue_name(p), 0, -1).hkeys(held_key(p))
    rows = pipe.execute()
    out = []
    for i, p in enumerate(tiers):
        members, queued, held = rows[3 * i : 3 * i + 3]
        waiting = {wire.task_id_of(raw) for raw in queued}
        gone = sorted(m.decode() for m in members if m.decode() not in waiting)
        if gone:
            r.srem(queued_key(p), *gone)
            taken = {h.decode() for h in held}
            out += [(p, task_id) for task_id in gone if task_id not in taken]
    return out


def oldest_waiting(r: redis.Redis) -> dict[str, float]:
    """Each tier's oldest queued request's ledger time: +inf for an empty queue, -inf
    where it cannot be told (a request with no ledger entry)."""
    pipe = r.pipeline(transaction=False)
    for p in PRIORITIES:
        pipe.lindex(request_queue_name(p), -1)
    tails = pipe.execute()
    times = ledger.scores(r, [None if raw is None else wire.task_id_of(raw) for raw in tails])
    out = {}
    for p, raw, score in zip(PRIORITIES, tails, times, strict=True):
        out[p] = float("inf") if raw is None else (float("-inf") if score is None else score)
    return out


def depths(r: redis.Redis) -> dict[str, int]:
    """Each tier's depth: waiting in its queue plus held by the collector."""
    pipe = r.pipeline(transaction=False)
    for p in PRIORITIES:
        pipe.llen(request_queue_name(p))
        pipe.hlen(held_key(p))
    values = pipe.execute()
    return {p: int(values[2 * i]) + int(values[2 * i + 1]) for i, p in enumerate(PRIORITIES)}


def queue_of(raw: bytes | str) -> str | None:
    """The tier a stored request message was published for."""
    routing = wire.routing_key(raw)
    for p in PRIORITIES:
        if routing == request_queue_name(p):
            return p
    return None
