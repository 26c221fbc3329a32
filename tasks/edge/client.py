"""The client API: submit inputs, get Celery AsyncResults back.

    from dynamic_batching.edge.client import submit
    vector = submit("a sentence").get(timeout=10)        # 384 floats for minilm
    score = submit(["a query", "a passage"], model="reranker").get(timeout=10)
    vectors = gather(submit_many(texts), timeout=30)     # many answers, one wait
    vectors = run_many(texts, timeout=30)                 # the same, cheaper

Each request is validated and tokenized here, at the edge, then queued as one Celery
task message on its priority's queue: all the messages of one call in one round trip,
together with the queue-cap check (tasks/store/request_queues.py). Its task id is its AsyncResult id: the
device worker that runs it stores the answer (or this request's own error) under it.
The requests of one call form a reply group: their answers are also pushed onto the
group's list, and `.get()` and `gather` pop them from there (tasks/store/replies.py);
`AsyncResult(id).get()` anywhere else waits through Celery as usual.
Safe to call from many threads and processes at once.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from celery.result import AsyncResult, ResultSet, assert_will_not_block

from dynamic_batching.conf import conf
from dynamic_batching.gpu_workers.models import get_spec

from .. import metrics
from ..core.errors import (
    BurstExceeded,
    DeadlineExceeded,
    Overloaded,
    PriorityNotAllowed,
    QuotaExceeded,
    RequestTooLarge,
)
from ..core.quota import Quota
from ..protocol import events as flower_events
from ..protocol import wire
from ..protocol.app import get_app
from ..protocol.names import REQUEST_TASK, reply_ids, request_queue_name
from ..protocol.request import Request
from ..store import replies, request_queues, shared_state
from .intake import accept

__all__ = [
    "DeadlineExceeded",
    "Overloaded",
    "Quota",
    "QuotaExceeded",
    "RequestTooLarge",
    "Reply",
    "details",
    "gather",
    "run_many",
    "submit",
    "submit_many",
]

_policy = shared_state.PolicyCache(max_age_s=0.5)


def submit(
    input: Any,
    *,
    priority: str = "normal",
    model: str | None = None,
    deadline_s: float | None = None,
    owner: str = "",
    quota: Quota | None = None,
) -> AsyncResult:
    """Queue one input for `model` (the default model if None): a text, or what that
    model takes (a [query, passage] pair for a reranker, ...). Raises ValueError /
    TypeError for bad input and Overloaded when the priority's queue is at its cap
    (QuotaExceeded when the owner's quota is); nothing is enqueued in either case."""
    return submit_many([input], priority=priority, model=model, deadline_s=deadline_s, owner=owner, quota=quota)[0]


def submit_many(
    inputs: Iterable[Any],
    *,
    priority: str = "normal",
    model: str | None = None,
    deadline_s: float | None = None,
    owner: str = "",
    quota: Quota | None = None,
    reply: bool = True,
) -> list[AsyncResult]:
    """Queue several inputs; results come back in input order. All are validated first,
    so one bad input enqueues none of them.

    `owner` names who submits ("user:42"): only they (and staff) may read the answers
    on the web, and `quota` bounds what they may spend. A script calling this in-process
    is trusted and passes neither. `reply=False` is for a caller that reads the answers
    later by id and never waits here (the web): no reply list is filled for it."""
    inputs = _listed(inputs, "submit_many")
    if not inputs:
        return []
    app = get_app()
    if not reply:
        ids = admit(inputs, priority, model=model, deadline_s=deadline_s, owner=owner, quota=quota)
        return [app.AsyncResult(task_id, task_name=REQUEST_TASK) for task_id in ids]
    key, ids = reply_ids(len(inputs))
    admit(inputs, priority, model=model, deadline_s=deadline_s, owner=owner, quota=quota, ids=ids)
    box = replies.Mailbox(shared_state.client(), key, ids, app.backend)
    return [Reply(task_id, box, app=app) for task_id in ids]


class Reply(AsyncResult):
    """A request's AsyncResult, as `submit` and `submit_many` return it: `.get()` pops
    its answer from its reply group's list (tasks/store/replies.py), where the outcome
    script pushed it, instead of subscribing to its channel and asking Redis first, as
    Celery's result consumer does. Everything else is Celery's: `.state`, `.ready()`,
    `.forget()`; and a copy pickled elsewhere is a plain AsyncResult."""

    def __init__(self, id: str, mailbox: replies.Mailbox, *, app: Any) -> None:
        super().__init__(id, app=app, task_name=REQUEST_TASK)
        self.mailbox = mailbox

    def get(self, timeout: float | None = None, propagate: bool = True, **options: Any) -> Any:  # type: ignore[override]
        """Celery's `get`, with its other options by keyword (`callback`,
        `disable_sync_subtasks`, ...); `interval` and `no_ack` mean nothing here."""
        if options.get("on_message") is not None or options.get("on_interval") is not None:
            # Progress callbacks need Celery's own consumer, which hears every state.
            return super().get(timeout=timeout, propagate=propagate, **options)
        if options.get("disable_sync_subtasks", True):
            assert_will_not_block()  # as Celery's get: waiting inside a task deadlocks
        if self._cache is None:
            self._maybe_set_cache(self.mailbox.wait([self.id], timeout=timeout)[self.id])
        return self.maybe_throw(propagate=propagate, callback=options.get("callback"))

    wait = get  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return AsyncResult, self.__reduce_args__()


def run_many(
    inputs: Iterable[Any],
    *,
    timeout: float | None = None,
    priority: str = "normal",
    model: str | None = None,
    deadline_s: float | None = None,
    owner: str = "",
    quota: Quota | None = None,
) -> list[Any]:
    """Queue several inputs and wait for all their answers: `gather(submit_many(...))`
    in fewer round trips and less CPU. Answers come back in input order, a request that
    failed has its own exception in its place, and celery.exceptions.TimeoutError is
    raised if they are not all in within `timeout` seconds. Raises as submit_many does
    when the inputs are refused.

    The requests form one reply group (tasks/protocol/names.py::reply_ids): each answer
    is pushed onto the group's list as it is stored, and popped from there many at a
    time, instead of each being listened for on its own channel."""
    inputs = _listed(inputs, "run_many")
    if not inputs:
        return []
    key, ids = reply_ids(len(inputs))
    admit(inputs, priority, model=model, deadline_s=deadline_s, owner=owner, quota=quota, ids=ids)
    metas = replies.wait(shared_state.client(), key, ids, get_app().backend, timeout=timeout)
    return [metas[t]["result"] for t in ids]


def admit(
    inputs: Iterable[Any],
    priority: str = "normal",
    *,
    model: str | None = None,
    deadline_s: float | None = None,
    owner: str = "",
    quota: Quota | None = None,
    ids: list[str] | None = None,
    celery: dict[str, Any] | None = None,
) -> list[str]:
    """Validate and queue `inputs` in one round trip; returns their task ids. With `ids`
    (a reply group, or the ids a Celery caller chose) each request takes its own; a
    reply group's answers are also pushed onto the group's list for a caller that
    waits. Without, each request gets a fresh id and its answer is only stored.
    `celery`: the follow-ups (callbacks, chain, chord) each request carries to its
    outcome (tasks/protocol/canvas.py)."""
    inputs = list(inputs)
    if quota is not None and len(inputs) > quota.burst:
        # The token bucket never holds more than the burst: refused at once, for good
        # (issue 42, finding 4), before any input is parsed.
        raise BurstExceeded(owner, len(inputs), quota.burst)
    if quota is not None and not quota.allows(priority):
        # Anyone could claim `high` and the tiers meant nothing (issue 42, finding 2).
        raise PriorityNotAllowed(owner, priority, quota.max_priority)
    policy = _policy.get()
    requests = [
        accept(
            t,
            priority=priority,
            model=model,
            deadline_s=deadline_s,
            policy=policy,
            default_model=conf.DEFAULT_MODEL,
        )
        for t in inputs
    ]
    if celery is not None:
        requests = [dataclasses.replace(r, celery=celery) for r in requests]
    if not requests:
        return []
    app = get_app()
    queue = request_queue_name(priority)
    entries, shown = [], []
    for i, req in enumerate(requests):
        task_id, argsrepr = (str(uuid.uuid4()) if ids is None else ids[i]), _argsrepr(req)
        entries.append(
            (task_id, wire.task_message(app, REQUEST_TASK, task_id, [req.to_message()], queue, argsrepr=argsrepr))
        )
        shown.append((task_id, argsrepr))
    sent = conf.TASK_SENT_EVENTS and conf.REQUEST_EVENTS
    events = flower_events.sent(app, REQUEST_TASK, shown, queue) if sent else None
    # The cap check, the ledger record, the push of every message and their task-sent
    # events: one round trip.
    deadline = max((r.deadline_at for r in requests if r.deadline_at is not None), default=None)
    in_flight_s = _in_flight_s(requests[0].submitted_at, deadline)
    # No subscription first, as Celery's send_task makes: a reply list keeps an answer
    # pushed before anyone waits.
    admitted = request_queues.admit(
        shared_state.client(),
        priority,
        policy.queue_caps[priority],
        entries,
        events,
        owner=owner,
        quota=quota,
        keep_s=in_flight_s + conf.RESULT_EXPIRES_S,
        in_flight_s=in_flight_s,
        deadline_at=deadline,
    )
    if not admitted.accepted:
        metrics.record_rejected(priority, len(entries), reason=admitted.refused_by, owner=owner)
        if admitted.refused_by != "tier":
            raise QuotaExceeded(owner, admitted.refused_by, priority, max(0.1, admitted.retry_after))
        # A rough guess: the queue drains at its share of a few hundred requests a second.
        raise Overloaded(queue, policy.queue_caps[priority], max(0.1, min(5.0, admitted.depth / 200.0)))
    return [task_id for task_id, _ in entries]


def _listed(inputs: Iterable[Any], name: str) -> list[Any]:
    if isinstance(inputs, str):
        raise TypeError(f"{name} takes a list of inputs; use submit() for one text")
    return list(inputs)


def gather(results: Sequence[AsyncResult], *, timeout: float | None = None) -> list[Any]:
    """Wait for many requests at once; their answers come back in the same order, and a
    request that failed has its own exception in its place (the others are unaffected).
    Raises celery.exceptions.TimeoutError if they are not all done within `timeout`.

    Cheaper than `.get()` on each: the answers of one `submit_many` are popped from its
    reply list many at a time. Other AsyncResults wait through Celery's
    `ResultSet.join_native` (one MGET, then one subscription)."""
    results = list(results)
    end = None if timeout is None else time.monotonic() + timeout
    boxes: dict[int, tuple[replies.Mailbox, list[Reply]]] = {}
    others: list[AsyncResult] = []
    answered: dict[str, Any] = {}
    for r in results:
        if isinstance(r, Reply):
            boxes.setdefault(id(r.mailbox), (r.mailbox, []))[1].append(r)
        else:
            others.append(r)
    for box, members in boxes.values():
        left = None if end is None else max(0.0, end - time.monotonic())
        box.wait([r.id for r in members], timeout=left)  # then each get() finds its own in the box
    if others:
        left = None if end is None else max(0.0, end - time.monotonic())
        # interval=0: after its one MGET, join_native would nap `interval` (0.5 s) whenever
        # an answer is still pending; the subscription does the waiting here.
        values = ResultSet(others, app=get_app()).join_native(timeout=left, propagate=False, interval=0)
        answered = dict(zip((r.id for r in others), values, strict=True))
    return [r.get(propagate=False) if isinstance(r, Reply) else answered[r.id] for r in results]


#: How long past its deadline a request still counts as in flight: the device's run and
#: the hand-back of a batch that outlived its visibility timeout.
IN_FLIGHT_GRACE_S = 120.0
#: A request with no deadline counts as in flight for at most this long.
NO_DEADLINE_IN_FLIGHT_S = 24 * 3600.0


def _in_flight_s(now: float, deadline_at: float | None) -> float:
    """How long requests count against their owner's quota if no answer ever comes."""
    if deadline_at is None:
        return NO_DEADLINE_IN_FLIGHT_S
    return min(NO_DEADLINE_IN_FLIGHT_S, max(0.0, deadline_at - now) + IN_FLIGHT_GRACE_S)


def _argsrepr(req: Request) -> str:
    """What Flower shows as a request's arguments."""
    return f"({get_spec(req.model).describe(req.input)!r}, {req.tokens} tokens)"


def details(result: AsyncResult | str) -> dict[str, Any]:
    """What the system recorded about a finished request: batch, device, timings,
    whether it was truncated. Empty while it is still pending."""
    task_id = result if isinstance(result, str) else result.id
    meta = get_app().backend.get_task_meta(task_id)
    return dict(meta.get("batching") or {})
