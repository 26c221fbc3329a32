"""A request's final outcome, and the Celery result format it is stored in, so that a
caller's plain `AsyncResult(id).get()` returns the value or raises the request's own
exception."""

from __future__ import annotations

import traceback as tb
from dataclasses import dataclass, field
from typing import Any

from celery import states
from celery.exceptions import TaskRevokedError


@dataclass(slots=True)
class Outcome:
    task_id: str
    result: Any = None
    error: BaseException | None = None
    #: What the system knows about how this request ran: batch, device, timings.
    details: dict[str, Any] = field(default_factory=dict)
    #: The Celery follow-ups its request was sent with (tasks/protocol/canvas.py).
    celery: dict[str, Any] | None = None


def result_meta(o: Outcome, backend: Any, date_done: str) -> dict[str, Any]:
    """The meta Celery's own backend would store for this outcome, with our details."""
    if o.error is None:
        status, result, trace = states.SUCCESS, o.result, None
    else:
        # Revoked before it ran: Celery's REVOKED, which `.get()` raises as the error.
        status = states.REVOKED if isinstance(o.error, TaskRevokedError) else states.FAILURE
        result = backend.prepare_exception(o.error)
        trace = "".join(tb.format_exception(o.error)) if o.error.__traceback__ else None
    return {
        "status": status,
        "result": result,
        "traceback": trace,
        "children": [],
        "date_done": date_done,
        "task_id": o.task_id,
        "batching": o.details,
    }
