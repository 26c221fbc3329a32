"""`batching.infer`: the batched model as a Celery task.

    from celery import chain, chord, group
    from dynamic_batching.edge.task import infer

    vector = infer.delay("a sentence").get(timeout=10)
    chain(infer.s("a sentence"), store_vector.s(doc_id)).delay()
    vectors = group(infer.s(t) for t in texts).delay().get(timeout=30)
    chord((infer.s(t) for t in texts), summarize.s()).delay()
    infer.apply_async(("a query",), priority=0, expires=5)            # high tier, 5 s deadline
    app.send_task("batching.infer", args=["a sentence"])               # by name, no import

Its keyword arguments are `input` (also the first positional one), `model`,
`priority` (a tier name: "high", "normal", "low") and `deadline_s`.

**Where it is admitted.** `apply_async` (so `.delay()`, a signature's `.apply_async()`,
a chain's first step, a group's and a chord's members) never publishes a task message:
it runs the edge in the calling process, the same validation, token count, queue cap
and ledger record as `submit()` (tasks/edge/client.py), in one round trip, and returns
the AsyncResult whose id is the request's. A message sent by name from a process that
does not import this package (`send_task`) lands on that app's queue for it; the worker
that consumes it (any worker whose project has `dynamic_batching` in INSTALLED_APPS)
runs the body below, which admits it the same way under the message's own task id and
stores nothing itself. A request the edge refuses (bad input, a full queue, a quota)
raises in `apply_async`; sent by name, the same error is stored as its result and its
`link_error` callbacks run.

**Celery's numeric priority** (0 to 9; on Redis 0 is the most urgent) maps onto the
tiers: 0-2 high, 3-6 normal, 7-9 low. A `priority` keyword argument (a tier name) wins.
**`expires`** (seconds, or a datetime) is a deadline: the request is answered
DeadlineExceeded past it, never run. With `deadline_s` too, the sooner one holds.

**Callbacks.** `link`, `link_error`, the rest of a chain and a chord's body travel with
the request, and run once its outcome is stored, through Celery's own tracer
(tasks/protocol/canvas.py).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Ignore
from celery.result import AsyncResult

from ..protocol import canvas
from ..protocol.names import INFER_TASK, PRIORITIES, reply_ids
from ..store import replies, shared_state
from . import aio, client

#: Celery's numeric priority (Redis transport: 0 is the most urgent) -> tier, by the
#: highest number each tier takes.
CELERY_PRIORITY_TIERS = ((2, "high"), (6, "normal"), (9, "low"))


def tier_of(priority: Any) -> str:
    """The tier for Celery's numeric `priority` (None: normal)."""
    if priority is None:
        return "normal"
    if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 9:
        raise ValueError(f"priority {priority!r}: Celery's priority is a whole number from 0 (most urgent) to 9")
    return next(tier for top, tier in CELERY_PRIORITY_TIERS if priority <= top)


def _seconds_until(expires: Any, now: dt.datetime | None = None) -> float | None:
    """Celery's `expires` (seconds, a datetime, or the ISO string a message carries) as
    seconds from now."""
    if expires is None:
        return None
    if isinstance(expires, str):
        expires = dt.datetime.fromisoformat(expires)
    if isinstance(expires, dt.datetime):
        now = now or (dt.datetime.now(dt.UTC) if expires.tzinfo else dt.datetime.now())
        return max(0.001, (expires - now).total_seconds())
    if isinstance(expires, int | float) and not isinstance(expires, bool):
        return max(0.001, float(expires))
    raise TypeError(f"expires {expires!r}: give seconds or a datetime")


class BatchedTask(Task):
    """A task whose `apply_async` admits a request through the edge (see above)."""

    def apply_async(  # type: ignore[override]
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: Any = None,
        **options: Any,
    ) -> AsyncResult:
        if self.app.conf.task_always_eager:
            raise RuntimeError(
                f"{INFER_TASK} cannot run eagerly (task_always_eager): its requests are batched by the "
                "collector and run by device workers; turn eager mode off, or call submit() in tests"
            )
        call = _arguments(args, kwargs)
        fields = canvas.carried({**options, "link": link, "link_error": link_error})
        tier = call.pop("priority", None) or tier_of(options.get("priority"))
        deadline_s = _sooner(call.pop("deadline_s", None), _seconds_until(options.get("expires")))
        if task_id is None:
            key, ids = reply_ids(1)
            client.admit([call.pop("input")], tier, deadline_s=deadline_s, ids=ids, celery=fields, **call)
            box = replies.Mailbox(shared_state.client(), key, ids, self.app.backend)
            return client.Reply(ids[0], box, app=self.app)
        client.admit([call.pop("input")], tier, deadline_s=deadline_s, ids=[task_id], celery=fields, **call)
        return self.AsyncResult(task_id)

    async def asubmit(self, *args: Any, **kwargs: Any) -> aio.AwaitableResult:
        """For asyncio code: admit as `delay` does (infer's own arguments), and return
        a result to await: `vector = await (await infer.asubmit(text))`, or
        `await result.aget(timeout=10)` (tasks/edge/aio.py)."""
        call = _arguments(args, kwargs)
        tier = call.pop("priority", None) or "normal"
        return await aio.asubmit(call.pop("input"), priority=tier, **call)


def _arguments(args: Any, kwargs: Any) -> dict[str, Any]:
    """infer's arguments, by keyword; TypeError as a call with the wrong ones would."""
    args, kwargs = list(args or ()), dict(kwargs or {})
    names = ["input", "model", "priority", "deadline_s"]
    if len(args) > len(names):
        raise TypeError(f"{INFER_TASK} takes at most {len(names)} arguments ({len(args)} given)")
    for name, value in zip(names, args, strict=False):
        if name in kwargs:
            raise TypeError(f"{INFER_TASK} got two values for {name!r}")
        kwargs[name] = value
    unknown = set(kwargs) - set(names)
    if unknown:
        raise TypeError(f"{INFER_TASK} got unexpected argument(s) {', '.join(sorted(unknown))}")
    if "input" not in kwargs:
        raise TypeError(f"{INFER_TASK} needs its input")
    if kwargs.get("priority") is not None and kwargs["priority"] not in PRIORITIES:
        raise ValueError(f"priority {kwargs['priority']!r}: one of {', '.join(PRIORITIES)}")
    return {k: v for k, v in kwargs.items() if v is not None or k == "input"}


def _sooner(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


@shared_task(base=BatchedTask, bind=True, name=INFER_TASK)
def infer(
    self: BatchedTask,
    input: Any = None,
    model: str | None = None,
    priority: str | None = None,
    deadline_s: float | None = None,
) -> Any:
    """Run by Celery's tracer in two cases: a device worker following up a request's
    outcome (canvas.replaying: give back that outcome, so the tracer runs its callbacks
    and signals; it is called with no arguments), or a worker that consumed a message
    sent by name (admit it under the message's own task id; its answer is stored later,
    by a device)."""
    outcome = canvas.replaying()
    if outcome is not None:
        if outcome.error is not None:
            raise outcome.error
        return outcome.result
    request = self.request
    fields = canvas.carried({name: getattr(request, name, None) for name in canvas.CARRIED})
    tier = priority or tier_of((request.delivery_info or {}).get("priority"))
    deadline_s = _sooner(deadline_s, _seconds_until(getattr(request, "expires", None)))
    client.admit([input], tier, model=model, deadline_s=deadline_s, ids=[request.id], celery=fields)
    raise Ignore()
