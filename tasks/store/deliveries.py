"""How often the broker has handed a batch task out again, and which batch messages a
device worker holds.

A batch message comes back (kombu marks it redelivered) when its device worker died
running it, or holding it while it ran another (DEVICE_OVERLAP), or when the worker
could not finish it and requeued it. A first delivery costs nothing here; each
redelivery is counted. A batch that came back is a suspect: each time it goes on a
device again, that try is counted *before* it runs and withdrawn when its run ends, so
a device worker knows how often it was on a device when its worker died, which a batch
that only waited beside the one that killed its worker, or wrote its answers after its
run, never was (gpu_workers/runner.py splits a batch that came back, and answers a
lone request that keeps killing workers with its own error).

A batch message is acked only once answered, so one held by a device worker that is
killed stays with the broker, unacked, until the visibility timeout hands it out again.
Each device worker notes the delivery tags it holds under its device id, and one
started under the same id (supervisord or docker restarts it in place) hands them back
at once (gpu_workers/taken.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

import redis

from ..protocol.names import UNACKED_INDEX_KEY, UNACKED_KEY, redeliveries_key, taken_key, tries_key

#: A counter outlives any redelivery by far; it only has to outlive the batch.
KEEP_S = 3600


def count(r: redis.Redis, task_id: str, *, nonce: str | None = None) -> int:
    """Count one more redelivery of `task_id`; returns how many there have been."""
    return _add(r, redeliveries_key(task_id), nonce)


def trying(r: redis.Redis, task_id: str, nonce: str) -> int:
    """`task_id`, having come back, goes on a device again (a try under `nonce`), before
    it runs; returns how many tries are counted now."""
    return _add(r, tries_key(task_id), nonce)


def tried(r: redis.Redis, task_id: str, nonce: str) -> None:
    """The try under `nonce` left the device: its run ended, and whatever ends its
    worker from now on is not this batch's doing."""
    r.srem(tries_key(task_id), nonce)


def tries(r: redis.Redis, task_id: str) -> int:
    """How many times `task_id`, having come back, was on a device when its worker died."""
    return int(r.scard(tries_key(task_id)))


def _add(r: redis.Redis, key: str, nonce: str | None) -> int:
    """Each call counts once even if the client runs it twice (a retried command whose
    reply was lost; issue 41, finding 3): it adds its own nonce to a set and counts the
    set, all in one transaction."""
    pipe = r.pipeline(transaction=True)
    pipe.sadd(key, nonce or uuid.uuid4().hex)
    pipe.expire(key, KEEP_S)
    pipe.scard(key)
    return int(pipe.execute()[2])


def hold(r: redis.Redis, holder: str, tag: str) -> None:
    """`holder` has taken the batch message with delivery tag `tag`: noted with the time
    the broker recorded that delivery (its unacked index score), which tells this
    delivery from a later one of the same message under the same tag."""
    score = r.zscore(UNACKED_INDEX_KEY, tag)
    pipe = r.pipeline(transaction=False)
    pipe.hset(taken_key(holder), tag, "" if score is None else repr(score))
    pipe.expire(taken_key(holder), KEEP_S)
    pipe.execute()


def release(r: redis.Redis, holder: str, tag: str) -> None:
    """`holder` is done with `tag`: answered, or handed back to the broker."""
    r.hdel(taken_key(holder), tag)


def settle(r: redis.Redis, tag: str) -> None:
    """Take the unacked message under delivery tag `tag` out of the broker's keeping, as
    kombu's own ack does (its hash and its index, in one transaction), for a holder that
    cannot ack through its consumer: a hung worker's watchdog thread, which has already
    published the message's replacement and is about to kill its process. Left there,
    the visibility timeout would hand the original out again and its batch would run
    twice (issue 41, finding 5)."""
    pipe = r.pipeline(transaction=True)
    pipe.hdel(UNACKED_KEY, tag)
    pipe.zrem(UNACKED_INDEX_KEY, tag)
    pipe.execute()


def held(r: redis.Redis, holder: str) -> dict[str, float | None]:
    """The tags `holder` took and never released, with the delivery time noted for
    each (None where there was none); forgets them."""
    pipe = r.pipeline(transaction=True)
    pipe.hgetall(taken_key(holder))
    pipe.delete(taken_key(holder))
    rows = pipe.execute()[0]
    out: dict[str, float | None] = {}
    for tag, score in rows.items():
        tag = tag.decode() if isinstance(tag, bytes) else tag
        score = score.decode() if isinstance(score, bytes) else score
        out[tag] = float(score) if score else None
    return dict(sorted(out.items()))


def restore(r: redis.Redis, tag: str, delivered_at: float) -> bool:
    """Put the message unacked under `tag` back on its queue, marked redelivered, as
    kombu's `restore_by_tag` does, but only if it is still the delivery that was noted
    (the same score in the unacked index) and all in one transaction. kombu keeps a
    message's delivery tag for life: after the visibility timeout handed it to another,
    live device, the tag is the same and only the score tells the two deliveries apart
    (issue 41, finding 6). Returns whether it restored the message."""
    with r.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(UNACKED_INDEX_KEY, UNACKED_KEY)
                score, raw = pipe.zscore(UNACKED_INDEX_KEY, tag), pipe.hget(UNACKED_KEY, tag)
                if raw is None or score is None or score != delivered_at:
                    pipe.unwatch()
                    return False
                payload, exchange, routing_key = json.loads(raw)
                # A batch message goes to its queue by the default exchange ("") or by the
                # queue's own (named as it is), with priority 0: kombu keeps priorities 3
                # and up in lists of their own.
                if exchange not in ("", routing_key) or int(payload.get("properties", {}).get("priority") or 0) >= 3:
                    pipe.unwatch()
                    return False
                payload.setdefault("headers", {})["redelivered"] = True
                payload.setdefault("properties", {}).setdefault("delivery_info", {})["redelivered"] = True
                pipe.multi()
                # kombu's consumers pop from the right: a restored message goes next.
                pipe.rpush(routing_key, json.dumps(payload))
                pipe.hdel(UNACKED_KEY, tag)
                pipe.zrem(UNACKED_INDEX_KEY, tag)
                pipe.execute()
                return True
            except redis.WatchError:
                continue  # another device acked or took something meanwhile: look again


def nowhere(r: redis.Redis, batch_ids: Sequence[str], queues: Sequence[str]) -> list[str]:
    """The batch tasks among `batch_ids` that neither wait in any of `queues` nor are
    held unacked by a device: popped by a device that died before recording them (the
    gap between BRPOP and kombu's unacked write). Their requests are lost."""
    if not batch_ids:
        return []
    # One transaction: a batch moving from a queue to the unacked hash between the two
    # reads must not look lost (issue 41, finding 12).
    pipe = r.pipeline(transaction=True)
    pipe.hvals(UNACKED_KEY)
    for queue in queues:
        pipe.lrange(queue, 0, -1)
    found = b"\n".join(raw for rows in pipe.execute() for raw in rows)
    return [b for b in batch_ids if b.encode() not in found]
