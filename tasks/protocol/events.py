"""Task events for request tasks, so Flower shows each request's whole life.

A request is a Celery task message (`batching.request`) that no Celery worker executes:
the collector takes it and a device worker answers it inside a batch task. So the
events a worker would have sent are sent by the processes that do the work, each as
one `task.multi` message (Celery's own format for batched events), PUBLISHed in the
same Redis round trip that does the work, never in one of its own:

- the edge: task-sent for every request of a `submit_many`, in the script that queues
  them (`tasks/store/request_queues.py::admit`), and only if they were accepted;
- the collector: task-sent for a batch task, in the transaction that pushes it;
- the device worker: one task-succeeded or task-failed for each request, in the pipeline
  that writes their outcomes, carrying what task-received and task-started would have:
  its name and arguments, `received` (when its batch was dispatched) and `started`.
  Celery's event state (which Flower's extends) copies an event's fields onto the task,
  so Flower shows the same times and runtime. Sent at the end anyway, separate
  received and started events said nothing more, and Flower spends a cross-thread
  wake-up on every event (dropping them: 0.87–0.95 to 0.77–0.79 Flower CPU ms a
  request at 16 callers, docs/observability.md).

Batch tasks are ordinary Celery tasks: the device worker's Celery sends their other
events. Requests that expire in the collector, before any device sees them, get no
further events: Flower shows them as sent; /requests/<id> and the API show their
DeadlineExceeded.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from celery import Celery
from celery.events import Event
from celery.utils.nodenames import anon_nodename
from celery.utils.time import utcoffset

from . import wire
from .names import EVENTS_EXCHANGE, EVENTS_ROUTING_KEY, REQUEST_TASK
from .results import Outcome

log = logging.getLogger(__name__)

_topics: list[str] | None = None
_topics_lock = threading.Lock()


def topics(app: Celery) -> list[str]:
    """The PUB/SUB channels kombu's Redis transport publishes `celeryev` / `task.multi`
    to (a prefix with the database number), asked of kombu itself once per process."""
    global _topics
    with _topics_lock:
        if _topics is None:
            with app.connection_for_write() as conn:
                _topics = list(conn.default_channel._get_publish_topics(EVENTS_EXCHANGE, EVENTS_ROUTING_KEY))
        return _topics


class Events:
    """Task events from one sender, built into one `task.multi` message."""

    def __init__(self, app: Celery, hostname: str | None = None) -> None:
        self.app = app
        self.hostname = hostname or anon_nodename()
        self.events: list[dict[str, Any]] = []

    def add(self, type: str, **fields: Any) -> None:
        self.events.append(
            Event(
                type,
                hostname=self.hostname,
                utcoffset=utcoffset(),
                pid=os.getpid(),
                clock=self.app.clock.forward(),
                **fields,
            )
        )

    def __bool__(self) -> bool:
        return bool(self.events)

    def message(self) -> str:
        return wire.envelope(self.events, EVENTS_EXCHANGE, EVENTS_ROUTING_KEY, headers={"hostname": self.hostname})

    def publish_on(self, pipe: Any) -> None:
        """Add the PUBLISH of these events to a pipeline the caller executes anyway."""
        if self.events:
            message = self.message()
            for topic in topics(self.app):
                pipe.publish(topic, message)


def sent(app: Celery, name: str, entries: Sequence[tuple[str, str]], queue: str | Sequence[str]) -> Events:
    """task-sent for each (task id, argsrepr) queued on `queue` (one for all, or one
    each) without `send_task`."""
    events = Events(app)
    now = time.time()
    queues = [queue] * len(entries) if isinstance(queue, str) else list(queue)
    for (task_id, argsrepr), queue in zip(entries, queues, strict=True):
        events.add(
            "task-sent",
            uuid=task_id,
            root_id=task_id,
            parent_id=None,
            name=name,
            args=argsrepr,
            kwargs="{}",
            retries=0,
            eta=None,
            expires=None,
            queue=queue,
            exchange=queue,
            routing_key=queue,
            timestamp=now,
        )
    return events


def _summary(result: Any) -> str:
    if isinstance(result, (list, tuple)):
        return f"<{len(result)} values>"
    text = repr(result)
    return text if len(text) <= 80 else text[:77] + "..."


def ran(
    app: Celery,
    batch: Mapping[str, Any],
    outcomes: Sequence[Outcome],
    *,
    started_at: float,
    run_s: float,
    hostname: str,
) -> Events:
    """One succeeded-or-failed event for each request a batch answered, with the fields
    of the received and started events it stands for (see the module's docstring)."""
    events = Events(app, hostname)
    dispatched_at = float(batch.get("dispatched_at") or started_at)
    now = time.time()
    for o in outcomes:
        life = {
            "uuid": o.task_id,
            "name": REQUEST_TASK,
            "args": "(…)",
            "kwargs": "{}",
            "retries": 0,
            "eta": None,
            "expires": None,
            "root_id": o.task_id,
            "parent_id": batch.get("batch_id"),
            "received": dispatched_at,
            "started": started_at,
            "timestamp": now,
        }
        if o.error is None:
            events.add("task-succeeded", result=_summary(o.result), runtime=run_s, **life)
        else:
            events.add("task-failed", exception=repr(o.error), traceback="", **life)
    return events
