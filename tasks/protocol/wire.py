"""Celery task messages exactly as kombu's Redis transport stores them, built and read
here so that many can go to Redis in one round trip.

A kombu Producer publishes one message per call: one LPUSH (and one task-sent event)
per request. The edge instead builds every message of a `submit_many` here and pushes
them all, with the queue-cap check and the ledger record, in one Lua script; the
collector takes many at once the same way. The messages are the ones `send_task` would
write (Celery protocol 2 headers from `app.amqp.as_task_v2`, kombu's JSON envelope with
a base64 body), so a Celery worker consumes them as usual: batch tasks built here are
run by ordinary device workers.

    envelope = {"body": base64(json([args, kwargs, embed])), "content-type": ...,
                "headers": {"task": ..., "id": ..., ...}, "properties": {"delivery_tag": ...}}
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from celery import Celery
from kombu import Exchange, Queue

CONTENT_TYPE = "application/json"


# Every message crosses here twice (built, then read), and json's own dumps and loads
# were the collector's largest cost per request (docs/benchmarks.md). orjson writes and
# reads the same JSON several times faster; whatever it refuses (an int past 64 bits, a
# lone surrogate, a NaN literal to read) goes through json as before. It writes a NaN as
# null where json writes NaN, which is not JSON: the edge refuses non-finite numbers in
# inputs (tasks/edge/intake.py), and no other field of a message can hold one.
def dumps(obj: Any) -> str:
    """`obj` as JSON text, as json.dumps reads it back."""
    try:
        return orjson.dumps(obj).decode()
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(obj)


def loads(raw: bytes | str) -> Any:
    """What json.loads makes of `raw`."""
    try:
        return orjson.loads(raw)
    except ValueError:  # orjson.JSONDecodeError
        return json.loads(raw)


@dataclass(frozen=True, slots=True)
class Decoded:
    task: str | None
    task_id: str | None
    args: Sequence[Any]
    kwargs: dict[str, Any]


def task_message(
    app: Celery,
    name: str,
    task_id: str,
    args: Sequence[Any],
    queue: str,
    *,
    argsrepr: str | None = None,
    ignore_result: bool = False,
    **options: Any,
) -> str:
    """One task message for `queue`, serialized as the transport keeps it. `options`
    are Celery's own message fields (a chord member's group_id, group_index, chord)."""
    m = app.amqp.as_task_v2(
        task_id,
        name,
        args=args,
        argsrepr=argsrepr if argsrepr is not None else f"<{len(args)} args>",
        kwargsrepr="{}",
        ignore_result=ignore_result,
        **options,
    )
    return envelope(m.body, queue, queue, headers=m.headers, properties=m.properties)


def event_message(body: dict[str, Any], queue: str) -> str:
    """A plain JSON message (not a task), as `Producer.publish(body)` would store it."""
    return envelope(body, queue, queue)


def envelope(
    body: Any,
    exchange: str,
    routing_key: str,
    *,
    headers: dict[str, Any] | None = None,
    properties: dict[str, Any] | None = None,
) -> str:
    """`body` as JSON in kombu's message envelope, as its Redis transport stores it."""
    return dumps(
        {
            "body": base64.b64encode(dumps(body).encode()).decode(),
            "content-encoding": "utf-8",
            "content-type": CONTENT_TYPE,
            "headers": headers or {},
            "properties": {
                **(properties or {}),
                "delivery_mode": 2,
                "delivery_info": {"exchange": exchange, "routing_key": routing_key},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
    )


def kombu_queue(name: str) -> Queue:
    """A queue as kombu declares ours: a direct exchange of the same name."""
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def publish_event(producer: Any, event: dict[str, Any], queue: str) -> None:
    """Publish a plain JSON event on `queue` through a kombu producer: what
    `event_message` builds, sent the ordinary way."""
    q = kombu_queue(queue)
    producer.publish(event, exchange=q.exchange, routing_key=q.routing_key, serializer="json", declare=[q])


def body(raw: bytes | str) -> Any:
    """The decoded body of a stored message (a task's [args, kwargs, embed], or an
    event's dict). Raises ValueError for anything that is not a message."""
    return _body_of(loads(raw))


def decode(raw: bytes | str) -> Decoded:
    """Task name, id and arguments of a stored task message. Raises ValueError for
    anything that is not one."""
    try:
        envelope = loads(raw)
        headers = envelope.get("headers") or {}
        args, kwargs, _embed = _body_of(envelope)
        return Decoded(headers.get("task"), headers.get("id"), args, kwargs or {})
    except (AttributeError, TypeError, ValueError) as exc:
        raise ValueError(f"not a task message: {exc}") from exc


def _body_of(envelope: dict[str, Any]) -> Any:
    try:
        data = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            data = base64.b64decode(data)
        return loads(data)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"no message body: {exc!r}") from exc


def task_id_of(raw: bytes | str) -> str | None:
    """The task id of a stored message, if it has one that can name a Redis key."""
    try:
        task_id = (loads(raw).get("headers") or {}).get("id")
        if isinstance(task_id, str) and task_id:
            task_id.encode()  # a lone surrogate cannot be sent to Redis
            return task_id
    except (TypeError, ValueError, AttributeError):  # UnicodeEncodeError is a ValueError
        pass
    return None


def routing_key(raw: bytes | str) -> str | None:
    """The queue a stored message was published to."""
    try:
        return loads(raw)["properties"]["delivery_info"]["routing_key"]
    except (KeyError, TypeError, ValueError):
        return None
