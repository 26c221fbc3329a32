"""Revoked requests: Celery's `revoke` (`AsyncResult(id).revoke()`, Flower's revoke
button, `app.control.revoke`, the API's DELETE) drops a request that is still queued or
held by the collector. Its state becomes REVOKED once, `.get()` raises
TaskRevokedError, its owner's in-flight slots and quota are freed as the outcome is
stored, and it never runs. A request already in a batch a device is running finishes,
as Celery lets a started task finish when revoked without `terminate`.

A revoke is a broadcast to every worker; each keeps the ids in memory (Celery's
`worker_state.revoked`) and drops a message with one of them when it comes to run it.
A request is never a message a worker runs, so the collector listens here instead: the
active collector, whose loop applies each revocation on its next turn (within
HOUSEKEEPING_S, 0.25 s): out of its scheduler and held hash if it holds the request,
and an answer (REVOKED) stored if the request is still waiting in its queue, where the
take script then drops it (tasks/protocol/lua/take.lua). Like Celery's own, a
revocation sent while no collector runs is not kept.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from celery.worker.control import Panel

log = logging.getLogger(__name__)

#: Revocations a standby collector hears and never applies are forgotten past this many.
KEEP = 100_000


class Revocations:
    """Ids revoked since the collector's loop last looked, from the control thread."""

    def __init__(self) -> None:
        self._ids: deque[str] = deque(maxlen=KEEP)

    def heard(self, task_ids: Iterable[str]) -> None:
        self._ids.extend(str(t) for t in task_ids)

    def take(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self._ids.popleft())  # deque pops are atomic: no lock with the control thread
            except IndexError:
                return out


def listen(heard: Callable[[list[str]], None]) -> None:
    """Call `heard(ids)` whenever this worker process gets a `revoke` command, after
    Celery's own handler has run. Celery has no hook for a revocation, so its registered
    handler is wrapped where its consumer looks handlers up (Panel.data)."""
    original = Panel.data["revoke"]
    if getattr(original, "batching_wrapped", False):
        return

    def revoke(state: Any, task_id: Any, terminate: bool = False, signal: Any = None, **kwargs: Any) -> Any:
        reply = original(state, task_id, terminate=terminate, signal=signal, **kwargs)
        ids = [task_id] if isinstance(task_id, str) else list(task_id or ())
        try:
            heard(ids)
        except Exception:  # noqa: BLE001 - the worker's control thread must go on
            log.exception("could not pass on the revocation of %s", ids)
        return reply

    revoke.batching_wrapped = True  # type: ignore[attr-defined]
    Panel.data["revoke"] = revoke
