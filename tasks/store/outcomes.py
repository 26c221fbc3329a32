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

import os
from collections.abc import Callable, Sequence
from typing import Any

from celery import states
from celery.app.base import Celery
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from dynamic_batching.conf import conf

from ..protocol import canvas, lua
from ..protocol.names import (
    ANSWERS_KEY,
    DEADLINES_KEY,
    IN_FLIGHT_PREFIX,
    LEDGER_ATTEMPTS_KEY,
    LEDGER_KEY,
    LEDGER_PAYLOADS_KEY,
    REPLIES_PREFIX,
    owner_key,
)
from ..protocol.results import Outcome, result_meta

# Built once for its SHA. Run by EVALSHA straight into the pipeline: redis-py's Script on a
# pipeline first asks SCRIPT EXISTS, a round trip of its own on every write.
_SET_ONCE_SCRIPT = Script(None, lua.source("set_once"))


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
        # STARTED (task_track_started) is no outcome: a redelivered batch runs it again.
        return {
            t
            for t, v in zip(task_ids, values, strict=True)
            if v is None or backend.decode_result(v).get("status") not in states.READY_STATES
        }

    def started(self, task_ids: Sequence[str], hostname: str) -> None:
        """Store Celery's STARTED state for requests whose batch begins (with the app's
        `task_track_started`), in one round trip, as Celery's worker would for a task:
        never over an outcome already stored (a request revoked meanwhile stays
        REVOKED), and replaced by the final one (set_once.lua). A request STARTED is one
        Celery's revoke handler leaves alone: it finishes."""
        backend = self._backend
        pipe = backend.client.pipeline(transaction=False)
        result = {"pid": os.getpid(), "hostname": hostname}
        for task_id in task_ids:
            meta = {"status": states.STARTED, "result": result, "traceback": None, "children": [], "task_id": task_id}
            pipe.set(backend.get_key_for_task(task_id), backend.encode(meta), nx=True, ex=int(conf.RESULT_EXPIRES_S))
        pipe.execute()

    def write(self, outcomes: Sequence[Outcome], *, also: Callable[[Any], None] | None = None) -> int:
        """Store every outcome in one round trip. Returns how many were new.
        `also(pipeline)` adds the caller's own commands to the same round trip."""
        if not outcomes and also is None:
            return 0
        try:
            results = self._pipeline(outcomes, also).execute()
        except NoScriptError:
            # A Redis that restarted has forgotten the script: load it and send it all
            # again (the writes are set-once; events and the done message may go twice).
            self._backend.client.script_load(_SET_ONCE_SCRIPT.script)
            results = self._pipeline(outcomes, also).execute()
        firsts = [o for o, new in zip(outcomes, results, strict=False) if int(new)]
        if firsts:
            # Only a first outcome: a second write of one follows up nothing.
            canvas.follow_up(self._app, firsts)
        return len(firsts)

    def _pipeline(self, outcomes: Sequence[Outcome], also: Callable[[Any], None] | None) -> Any:
        backend = self._backend
        pipe = backend.client.pipeline(transaction=False)
        done = self._app.now().isoformat()
        for o in outcomes:
            if o.error is None:
                expires = backend.expires
            else:
                expires = getattr(backend, "failure_expires", None) or backend.expires
            pipe.evalsha(
                _SET_ONCE_SCRIPT.sha,
                7,
                backend.get_key_for_task(o.task_id),
                ANSWERS_KEY,
                LEDGER_KEY,
                LEDGER_PAYLOADS_KEY,
                LEDGER_ATTEMPTS_KEY,
                owner_key(o.task_id),
                DEADLINES_KEY,
                backend.encode(result_meta(o, backend, done)),
                int(expires or conf.RESULT_EXPIRES_S),
                o.task_id,
                IN_FLIGHT_PREFIX,
                REPLIES_PREFIX,
            )
        if also is not None:
            also(pipe)
        return pipe
