"""What comes into the collector: request messages, and the devices' events."""

from __future__ import annotations

import math
from typing import Any

from ..core.scheduler import Item
from ..protocol import wire
from ..protocol.names import REQUEST_TASK
from ..protocol.request import Request


class Held:
    """A request the collector holds (in its tier's held hash until it is sent)."""

    __slots__ = ("request", "slow")

    def __init__(self, request: Request, slow: bool = False) -> None:
        self.request = request
        #: A device found this input too slow to share a batch: it runs alone.
        self.slow = slow


def parse_request(raw: bytes, priority: str) -> tuple[str, Request]:
    """The task id and request of a message taken from `priority`'s queue. Raises
    ValueError (or TypeError) naming what is wrong with a malformed one."""
    message = wire.decode(raw)
    task_id = message.task_id
    if not isinstance(task_id, str) or not task_id:
        raise ValueError("the message has no task id")
    if message.task != REQUEST_TASK:
        raise ValueError(f"not a request message: task {message.task!r}")
    if len(message.args) != 1 or not isinstance(message.args[0], dict):
        raise ValueError("a request message carries one argument, the request")
    request = Request.from_message(message.args[0])
    if request.priority != priority:
        raise ValueError(f"priority {request.priority!r} queued on the {priority!r} queue")
    return task_id, request


def celery_of(raw: bytes | None) -> dict[str, Any] | None:
    """The Celery follow-ups a request message carries (tasks/protocol/canvas.py), for
    an answer written without the request in hand (from the ledger); None if none, or
    if the message cannot be read."""
    if raw is None:
        return None
    try:
        fields = wire.decode(raw).args[0].get("celery")
    except (ValueError, TypeError, AttributeError, IndexError):
        return None
    return fields if isinstance(fields, dict) else None


def to_item(task_id: str, request: Request, *, now: float, wall: float, slow: bool) -> Item[Held]:
    """The scheduler's view of a request. Its age and deadline come in Redis's clock
    from the edge (tasks/store/clock.py) and are turned into the collector's own clock
    (`now`) here; `wall` is Redis's clock at the same moment."""
    age = max(0.0, wall - request.submitted_at)
    deadline = None if request.deadline_at is None else now + (request.deadline_at - wall)
    return Item(
        id=task_id,
        tokens=request.tokens,
        priority=request.priority,
        enqueued_at=now - age,
        deadline=deadline,
        payload=Held(request, slow),
        alone=request.alone or slow,
    )


def parse_event(raw: bytes) -> dict[str, Any] | None:
    """A device's event as a dict whose fields have the types the collector reads, or
    None for anything that is not one. Anyone who can write to the broker can put a
    message on the events queue: a field of the wrong type must cost that one event,
    never the collector (it once did: `float(run_ms)` raised in the loop)."""
    try:
        body = wire.body(raw)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    if body.get("kind") != "done":
        return body
    try:
        run_ms = float(body.get("run_ms") or 0)
        padded = int(body.get("padded_tokens") or 0)
        started_at = None if body.get("started_at") is None else float(body["started_at"])
    except (TypeError, ValueError, OverflowError):
        return None
    if not (math.isfinite(run_ms) and run_ms >= 0 and padded >= 0) or not isinstance(body.get("batch_id"), str):
        return None
    if started_at is not None and not math.isfinite(started_at):
        started_at = None
    lane = str(body.get("lane") or "normal")
    return {**body, "run_ms": run_ms, "padded_tokens": padded, "lane": lane, "started_at": started_at}
