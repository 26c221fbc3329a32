"""Writing each request's final outcome under its own task id, exactly once.

The collector (deadline errors) and device workers (results, per-request errors) both
write here. Outcomes are stored in Celery's own result format, so a caller's plain
`AsyncResult(id).get()` returns the value or raises the request's own exception.

Writes are idempotent: a Lua script sets the key only if it is absent and publishes
only then. A batch redelivered after a crash, or run twice, can never answer a caller
twice or overwrite the first answer; `missing()` lets a redelivered batch skip requests
that already have one.
"""

from __future__ import annotations

import traceback as tb
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery import states
from celery.app.base import Celery
from redis.commands.core import Script

from . import ledger

#: Counters of first answers and of refused second answers: a test of "nobody is
#: answered twice" reads them, and so can an operator after a crash.
ANSWERS_KEY = "batching:answers"

# The ledger entry goes in either case: the request has its one answer.
_SET_ONCE = """
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('HDEL', KEYS[4], ARGV[3])
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
    redis.call('PUBLISH', KEYS[1], ARGV[1])
    redis.call('HINCRBY', KEYS[2], 'first', 1)
    return 1
end
redis.call('HINCRBY', KEYS[2], 'refused', 1)
return 0
"""
# Built once: a Script keeps its SHA and runs on whichever client (or pipeline) each
# call names, so no write rebuilds it.
_SET_ONCE_SCRIPT = Script(None, _SET_ONCE.encode())


@dataclass(slots=True)
class Outcome:
    task_id: str
    result: Any = None
    error: BaseException | None = None
    #: What the system knows about how this request ran: batch, device, timings.
    details: dict[str, Any] = field(default_factory=dict)


class OutcomeWriter:
    def __init__(self, app: Celery) -> None:
        self._app = app

    @property
    def _backend(self) -> Any:
        # app.backend is per thread in Celery, and so is its Redis connection.
        return self._app.backend

    def missing(self, task_ids: Sequence[str]) -> set[str]:
        """The ids among these that have no final outcome yet."""
        if not task_ids:
            return set()
        backend = self._backend
        values = backend.client.mget([backend.get_key_for_task(t) for t in task_ids])
        return {t for t, v in zip(task_ids, values, strict=True) if v is None}

    def write(self, outcomes: Sequence[Outcome], *, also: Callable[[Any], None] | None = None) -> int:
        """Store every outcome in one round trip. Returns how many were new.
        `also(pipeline)` adds the caller's own commands to the same round trip."""
        if not outcomes and also is None:
            return 0
        backend = self._backend
        pipe = backend.client.pipeline(transaction=False)
        done = self._app.now().isoformat()
        for o in outcomes:
            if o.error is None:
                status, result, trace = states.SUCCESS, o.result, None
                expires = backend.expires
            else:
                status = states.FAILURE
                result = backend.prepare_exception(o.error)
                trace = "".join(tb.format_exception(o.error)) if o.error.__traceback__ else None
                expires = getattr(backend, "failure_expires", None) or backend.expires
            meta = {
                "status": status,
                "result": result,
                "traceback": trace,
                "children": [],
                "date_done": done,
                "task_id": o.task_id,
                "batching": o.details,
            }
            _SET_ONCE_SCRIPT(
                keys=[backend.get_key_for_task(o.task_id), ANSWERS_KEY, ledger.LEDGER_KEY, ledger.PAYLOADS_KEY],
                args=[backend.encode(meta), int(expires or 86400), o.task_id],
                client=pipe,
            )
        if also is not None:
            also(pipe)
        results = pipe.execute()
        return sum(int(x) for x in results[: len(outcomes)])
