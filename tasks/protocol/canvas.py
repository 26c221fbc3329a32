"""What a Celery worker does once a task has its outcome, done for a batched request once
its outcome is first written: its `link` and `link_error` callbacks, the next step of
its chain, its chord's counter, and Celery's task signals (task_prerun, task_postrun,
task_success, task_failure) that Sentry's and OpenTelemetry's Celery integrations
listen to.

A batched request never runs as a task of its own: a device runs it inside a batch, and
the outcome script stores its answer (tasks/store/outcomes.py). So the Celery options a
request was sent with (`carried`) travel in the request message, and once its outcome is
first stored, the writer hands it here. `follow_up` runs it through Celery's own tracer
as the `batching.infer` task whose body only gives back the outcome already known
(`replaying`), with `ignore_result` set so the tracer stores nothing: the outcome is
written once, by the script, and the tracer does the rest exactly as a worker would.
Written this way rather than by hand because chains, chords and errbacks have many
cases (a group as a link, a chord's ordered join, a failure failing the rest of a chain)
that Celery's tracer already gets right.

A follow-up runs once per request: the writer calls it only for the outcomes that its
write stored first (a redelivered batch's second answer is refused and follows up
nothing). It is at most once: a device killed between the write and the follow-up
loses that request's callbacks, as a worker killed between storing a result and
sending its callbacks would.
"""

from __future__ import annotations

import logging
import socket
import weakref
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Any

from celery import Celery, signals
from celery.app.task import Context
from celery.app.trace import build_tracer
from celery.exceptions import TaskRevokedError
from kombu.utils.json import dumps, loads

from ..core.errors import BatchingError
from .names import INFER_TASK
from .results import Outcome

log = logging.getLogger(__name__)

#: The fields of a Celery task request that a batched request carries from its
#: apply_async to its outcome.
CARRIED = ("callbacks", "errbacks", "chain", "chord", "group", "group_index", "root_id", "parent_id")

#: apply_async's option names for the same fields, where they differ.
_OPTION_NAMES = {"callbacks": "link", "errbacks": "link_error", "group": "group_id"}

_REPLAY: ContextVar[Outcome | None] = ContextVar("batching_replay", default=None)
_tracers: dict[int, Any] = {}
_HOSTNAME = f"batching@{socket.gethostname()}"


def carried(options: Mapping[str, Any]) -> dict[str, Any] | None:
    """The follow-up fields of apply_async's `options` (or of a worker's task request,
    which names them as CARRIED does), as plain JSON; None when there are none."""
    out: dict[str, Any] = {}
    for name in CARRIED:
        value = options.get(name)
        if value is None:
            value = options.get(_OPTION_NAMES.get(name, name))
        if value is None or value == []:
            continue
        if name in ("callbacks", "errbacks") and not isinstance(value, list | tuple):
            value = [value]
        out[name] = value
    # Signatures are dicts; their options may hold what JSON does not (a datetime):
    # kombu's JSON, as Celery's own messages use, makes them plain.
    return loads(dumps(out)) if out else None


def replaying() -> Outcome | None:
    """The outcome being followed up in this thread, while `batching.infer`'s body runs
    under the tracer; None when the task was consumed from a queue."""
    return _REPLAY.get()


#: The per-task signals an integration listens to.
TASK_SIGNALS = (
    signals.task_prerun,
    signals.task_postrun,
    signals.task_success,
    signals.task_failure,
    signals.task_revoked,
)


def signals_wanted() -> bool:
    """Whether anything in this process, besides Celery itself, listens to Celery's
    per-task signals. (Celery's Django fixup connects task_prerun and task_postrun in
    every Django worker, to close database connections: those are not listeners that
    want each request traced.)"""
    return any(_foreign(receiver) for s in TASK_SIGNALS for _, receiver in s.receivers)


def _foreign(receiver: Any) -> bool:
    fn = receiver() if isinstance(receiver, weakref.ReferenceType) else receiver
    return fn is not None and not str(getattr(fn, "__module__", "") or "").startswith("celery.")


def follow_up(app: Celery, outcomes: Iterable[Outcome]) -> None:
    """Follow up each first-written outcome with the Celery fields its request carried
    (`Outcome.celery`): only those with any, unless something listens to the task
    signals (then every one, so an integration reports each request)."""
    everyone = None
    for outcome in outcomes:
        fields = outcome.celery
        if fields is None:
            if everyone is None:
                everyone = signals_wanted()
            if not everyone:
                _log_own_failure(outcome)
                continue
        try:
            _trace(app, outcome, fields or {})
        except Exception:  # noqa: BLE001 - the answer is stored; a callback's failure is logged
            log.exception("could not send the Celery follow-ups of request %s", outcome.task_id)


def _log_own_failure(outcome: Outcome) -> None:
    """A request's own failure (the model's exception), logged once, with its id, where
    the tracer does not log it (it does when it follows the request up)."""
    error = outcome.error
    if error is None or isinstance(error, BatchingError | TaskRevokedError):
        return  # an answer, or the system's own error (logged where it was decided)
    log.error(
        "request %s failed: %s: %s",
        outcome.task_id,
        type(error).__name__,
        error,
        exc_info=(type(error), error, error.__traceback__) if error.__traceback__ else None,
    )


def _trace(app: Celery, outcome: Outcome, fields: Mapping[str, Any]) -> None:
    request = {
        **fields,
        "id": outcome.task_id,
        "task": INFER_TASK,
        # Stored once already, by the outcome script: the tracer only follows up.
        "ignore_result": True,
        "delivery_info": {"is_eager": False},
        "hostname": _HOSTNAME,
        "is_eager": False,
    }
    if isinstance(outcome.error, TaskRevokedError):
        # What a worker does for a revoked task: its chord counts it, task_revoked fires
        # (no errbacks, no chain).
        context = Context(request)
        app.backend.mark_as_revoked(outcome.task_id, str(outcome.error), request=context, store_result=False)
        signals.task_revoked.send(
            sender=app.tasks[INFER_TASK], request=context, terminated=False, signum=None, expired=False
        )
        return
    tracer = _tracers.get(id(app))  # built once, and only where a request is traced
    if tracer is None:
        task = app.tasks[INFER_TASK]
        tracer = _tracers[id(app)] = build_tracer(INFER_TASK, task, hostname=_HOSTNAME, app=app, eager=False)
    token = _REPLAY.set(outcome)
    try:
        tracer(outcome.task_id, (), {}, request)
    finally:
        _REPLAY.reset(token)
