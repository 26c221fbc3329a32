"""Task events for request tasks, so Flower shows each request's final state.

A request is a Celery task message (`tasks.request`) that no Celery worker executes:
the collector consumes it and a device worker answers it inside a batch task. Flower
would see only its task-sent event and show it as sent forever. So after a batch's
outcomes are written, the device worker sends for each request the events a worker
would have sent (task-received at dispatch, task-started, then task-succeeded or
task-failed) as one `task.multi` message, Celery's own format for batched events: one
publish per batch, not per request. Batch tasks are ordinary Celery tasks with
ordinary events.

Requests that expire in the collector, before any device sees them, get no events:
Flower shows them as sent; /requests/<id> and the API show their DeadlineExceeded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from celery import Celery, current_task
from celery.events import EventDispatcher
from celery.utils.nodenames import anon_nodename

from batching_site.celery import REQUEST_TASK

from .outcomes import Outcome

log = logging.getLogger(__name__)

_local = threading.local()


def _dispatcher(app: Celery, hostname: str) -> EventDispatcher:
    d = getattr(_local, "dispatcher", None)
    if d is None or d.hostname != hostname:
        # Buffer every task event until flush(), which sends them as one list.
        d = EventDispatcher(
            app.connection_for_write(),
            hostname=hostname,
            app=app,
            buffer_group=["task"],
            buffer_limit=1 << 30,
            buffer_while_offline=False,
        )
        _local.dispatcher = d
    return d


def _forget() -> None:
    d = getattr(_local, "dispatcher", None)
    _local.dispatcher = None
    if d is not None:
        try:
            d.close()
            d.connection.release()
        except Exception:  # noqa: BLE001 - it is already broken
            pass


def _summary(result: Any) -> str:
    if isinstance(result, (list, tuple)):
        return f"<{len(result)} values>"
    text = repr(result)
    return text if len(text) <= 80 else text[:77] + "..."


def emit(
    app: Celery,
    batch: Mapping[str, Any],
    outcomes: Sequence[Outcome],
    *,
    started_at: float,
    run_s: float,
    hostname: str | None = None,
) -> None:
    """Send received/started/succeeded-or-failed for each outcome, in one message.
    Never raises: Flower's view is not worth failing a batch for."""
    if not outcomes:
        return
    if hostname is None:
        request = getattr(current_task, "request", None)
        hostname = getattr(request, "hostname", None) or "device-worker"
    dispatched_at = float(batch.get("dispatched_at") or started_at)
    now = time.time()
    try:
        d = _dispatcher(app, hostname)
        for o in outcomes:
            d.send(
                "task-received",
                uuid=o.task_id,
                name=REQUEST_TASK,
                args="(…)",
                kwargs="{}",
                retries=0,
                eta=None,
                expires=None,
                root_id=o.task_id,
                parent_id=batch.get("batch_id"),
                timestamp=dispatched_at,
            )
            d.send("task-started", uuid=o.task_id, timestamp=started_at)
            if o.error is None:
                d.send("task-succeeded", uuid=o.task_id, result=_summary(o.result), runtime=run_s, timestamp=now)
            else:
                d.send("task-failed", uuid=o.task_id, exception=repr(o.error), traceback="", timestamp=now)
        d.flush(errors=False)
    except Exception:  # noqa: BLE001 - see the docstring
        log.warning("could not send request task events for Flower", exc_info=True)
        _forget()


def sent(app: Celery, events: Sequence[Mapping[str, Any]]) -> None:
    """The task-sent events of messages queued without `send_task` (tasks/wire.py), in
    one message. Never raises: a request is queued whether or not Flower hears of it."""
    if not events:
        return
    try:
        d = _dispatcher(app, anon_nodename())
        now = time.time()
        for fields in events:
            d.send("task-sent", timestamp=now, **fields)
        d.flush(errors=False)
    except Exception:  # noqa: BLE001 - see the docstring
        log.warning("could not send task-sent events", exc_info=True)
        _forget()
