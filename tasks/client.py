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

from . import shared_state
from .errors import DeadlineExceeded, Overloaded, RequestTooLarge
from .intake import Request, accept

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
    _admit(priority, len(requests), policy.queue_caps[priority])
    return _publish(requests)


def _admit(priority: str, count: int, cap: int) -> None:
    depth = shared_state.queue_depths()[priority]
    if depth + count > cap:
        # A rough guess: the queue drains at its share of a few hundred requests a second.
        raise Overloaded(request_queue_name(priority), cap, max(0.1, min(5.0, depth / 200.0)))


def _publish(requests: list[Request]) -> list[AsyncResult]:
    results = []
    with app.producer_or_acquire() as producer:
        for req in requests:
            task_id = str(uuid.uuid4())
            results.append(
                app.send_task(
                    REQUEST_TASK,
                    args=[req.to_message()],
                    task_id=task_id,
                    queue=request_queue_name(req.priority),
                    producer=producer,
                )
            )
    return results


def details(result: AsyncResult | str) -> dict[str, Any]:
    """What the system recorded about a finished request: batch, device, timings,
    whether it was truncated. Empty while it is still pending."""
    task_id = result if isinstance(result, str) else result.id
    meta = app.backend.get_task_meta(task_id)
    return dict(meta.get("batching") or {})
