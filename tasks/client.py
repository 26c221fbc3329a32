"""The client API: submit texts, get Celery AsyncResults back.

    from tasks.client import submit
    vector = submit("a sentence").get(timeout=10)        # 384 floats for minilm

Each request is validated and tokenized here, at the edge, then published as one
Celery task message on its priority's queue. Its task id is its AsyncResult id: the
device worker that runs it stores the answer (or this request's own error) under it.
Safe to call from many threads and processes at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from celery.result import AsyncResult
from django.conf import settings

from batching_site.celery import REQUEST_TASK, app, request_queue_name

from . import ledger, metrics, shared_state
from .errors import DeadlineExceeded, Overloaded, RequestTooLarge
from .intake import accept

__all__ = ["DeadlineExceeded", "Overloaded", "RequestTooLarge", "details", "submit", "submit_many"]

_policy = shared_state.PolicyCache(max_age_s=0.5)


def submit(
    text: str,
    *,
    priority: str = "normal",
    model: str | None = None,
    deadline_s: float | None = None,
) -> AsyncResult:
    """Queue one text. Raises ValueError/TypeError for bad input and Overloaded when the
    priority's queue is at its cap; nothing is enqueued in either case."""
    return submit_many([text], priority=priority, model=model, deadline_s=deadline_s)[0]


def submit_many(
    texts: Iterable[str],
    *,
    priority: str = "normal",
    model: str | None = None,
    deadline_s: float | None = None,
) -> list[AsyncResult]:
    """Queue several texts; results come back in input order. All are validated first,
    so one bad text enqueues none of them."""
    if isinstance(texts, str):
        raise TypeError("submit_many takes a list of texts; use submit() for one text")
    policy = _policy.get()
    requests = [
        accept(
            t,
            priority=priority,
            model=model,
            deadline_s=deadline_s,
            policy=policy,
            default_model=settings.DEFAULT_MODEL,
        )
        for t in texts
    ]
    if not requests:
        return []
    entries = [(str(uuid.uuid4()), req.to_message()) for req in requests]
    _admit(priority, entries, policy.queue_caps[priority])
    try:
        return _publish(priority, entries)
    except BaseException:
        # Not published: strike them off, so the ledger sweep does not publish them later.
        ledger.forget(shared_state.client(), [task_id for task_id, _ in entries])
        raise


def _admit(priority: str, entries: list[tuple[str, dict[str, Any]]], cap: int) -> None:
    """Check the queue cap and record the requests in the ledger, in one atomic step."""
    accepted, depth = ledger.admit(
        shared_state.client(),
        queue=request_queue_name(priority),
        priority=priority,
        cap=cap,
        collector_key=shared_state.COLLECTOR_KEY,
        entries=entries,
    )
    if not accepted:
        metrics.record_rejected(priority, len(entries))
        # A rough guess: the queue drains at its share of a few hundred requests a second.
        raise Overloaded(request_queue_name(priority), cap, max(0.1, min(5.0, depth / 200.0)))


def _publish(priority: str, entries: list[tuple[str, dict[str, Any]]]) -> list[AsyncResult]:
    with app.producer_or_acquire() as producer:
        return [
            app.send_task(
                REQUEST_TASK,
                args=[message],
                task_id=task_id,
                queue=request_queue_name(priority),
                producer=producer,
            )
            for task_id, message in entries
        ]


def details(result: AsyncResult | str) -> dict[str, Any]:
    """What the system recorded about a finished request: batch, device, timings,
    whether it was truncated. Empty while it is still pending."""
    task_id = result if isinstance(result, str) else result.id
    meta = app.backend.get_task_meta(task_id)
    return dict(meta.get("batching") or {})
