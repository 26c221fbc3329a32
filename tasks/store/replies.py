"""Waiting for answers on a reply group's list (tasks/protocol/names.py::reply_ids).

The outcome script pushes each grouped request's answer onto its group's list as it is
stored (set_once.lua), so a caller pops many answers per round trip, and nothing pushed
before it waited can be missed: a list keeps what a channel would drop. Every request a
script submits belongs to a group (tasks/edge/client.py): `.get()`, `gather` and
`run_many` all wait here. Written here rather than waiting through Celery's result
consumer because that one subscribes before the push, asks Redis for the answer before
it listens, and unsubscribes after, with a GIL hand-off per message: half the client's
CPU in a no-op run, and about 0.6 of its 1.5 CPU ms a MiniLM text at 16 callers
(docs/benchmarks.md). Celery's channel is still published to, for any other process
that waits on an id through Celery.

Should the list ever lose an answer (a Redis restart without its append-only file), a
quiet second reads the stored answers of what is still missing, so a wait ends with
every answer or with its timeout, never a hang. The same read looks each missing id up
in the ledger of accepted requests (tasks/store/ledger.py): admission writes an entry in
the script that queues the request and the outcome script strikes it as it stores the
answer, so an id with neither was lost by Redis itself (the last second of its
append-only file, after a host crash; issue 41, finding 13). Its waiter gets
`RequestLost` at once instead of waiting for an answer that cannot come.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
from celery import states
from celery.exceptions import TimeoutError as CeleryTimeoutError

from ..core.errors import RequestLost
from ..protocol.names import LEDGER_KEY

#: How long one blocking pop waits before the stored answers are read instead.
QUIET_S = 1.0


class Mailbox:
    """One reply group's answers, for however many callers wait on its members, from
    however many threads: whoever waits pops what has arrived and keeps it here for the
    others. Once every member's answer is in hand the list is gone: Redis drops a list
    when its last element is popped, and each answer is pushed once (set_once.lua), so
    only answers read from the store leave copies, and only then is it dropped (`close`
    drops it sooner). A member nobody waits for leaves it to expire with the answers."""

    def __init__(self, r: redis.Redis, key: str, task_ids: Sequence[str], backend: Any) -> None:
        self._r = r
        self.key = key
        self._backend = backend
        self._ids = frozenset(task_ids)
        self._got: dict[str, dict[str, Any]] = {}
        # How many of the members' own copies were popped: all of them leaves no list.
        self._popped = 0
        # One popper at a time; the others find their answers in _got when it lets go.
        self._lock = threading.Lock()

    def wait(self, task_ids: Sequence[str], *, timeout: float | None = None) -> dict[str, dict[str, Any]]:
        """The answer meta of every id in `task_ids` (decoded as Celery's result backend
        decodes its own). Raises Celery's TimeoutError if they are not all in within
        `timeout` seconds; answers that come later are still kept for a later wait."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if end is None else end - time.monotonic()
            if not self._lock.acquire(timeout=-1 if left is None else max(0.0, left)):
                self._raise_timeout(task_ids, timeout)
            try:
                absent = [t for t in task_ids if t not in self._got]
                if not absent:
                    return {t: self._got[t] for t in task_ids}
                left = QUIET_S if end is None else end - time.monotonic()
                if left <= 0:
                    self._raise_timeout(task_ids, timeout)
                self._collect(max(0.01, min(QUIET_S, left)), absent)
            finally:
                self._lock.release()

    def close(self) -> None:
        """Drop the list: nobody will wait on this group again."""
        self._r.delete(self.key)

    def _collect(self, block_s: float, absent: list[str]) -> None:
        popped = self._r.blmpop(block_s, 1, self.key, direction="LEFT", count=max(1, len(self._ids) - len(self._got)))
        from_list = bool(popped)
        if popped:
            raws = popped[1]
        else:
            ids = sorted(absent)
            pipe = self._r.pipeline(transaction=True)  # one moment: an answer strikes its entry
            pipe.mget([self._backend.get_key_for_task(t) for t in ids])
            pipe.zmscore(LEDGER_KEY, ids)
            stored, entries = pipe.execute()
            raws = [v for v in stored if v is not None]
            for t, v, entry in zip(ids, stored, entries, strict=True):
                if v is None and entry is None and t in self._ids:
                    self._got.setdefault(t, lost_meta(t))
        for raw in raws:
            meta = self._backend.decode_result(raw)
            task_id = meta.get("task_id")
            if task_id not in self._ids or meta.get("status") not in states.READY_STATES:
                continue  # not ours, or STARTED (task_track_started): not an answer yet
            self._popped += from_list
            self._got.setdefault(task_id, meta)
        if len(self._got) == len(self._ids) and self._popped < len(self._ids):
            # Every answer is in hand, some read from the store: their copies may still
            # be on the list. (With every copy popped, Redis has dropped it already.)
            self.close()

    def _raise_timeout(self, task_ids: Sequence[str], timeout: float | None) -> None:
        absent = sum(1 for t in task_ids if t not in self._got)
        raise CeleryTimeoutError(f"{absent} of {len(task_ids)} answers not in after {timeout} s")


def lost_meta(task_id: str) -> dict[str, Any]:
    """The answer meta a waiter gets for a request Redis has no trace of."""
    return {"task_id": task_id, "status": states.FAILURE, "result": RequestLost(task_id, 0), "traceback": None}


def wait(
    r: redis.Redis,
    key: str,
    task_ids: Sequence[str],
    backend: Any,
    *,
    timeout: float | None = None,
) -> dict[str, dict[str, Any]]:
    """Every answer of one group that a single caller waits for (run_many): the list is
    dropped either way (the mailbox drops it once all are in), and answers that come
    later stay stored under their ids."""
    box = Mailbox(r, key, task_ids, backend)
    try:
        return box.wait(task_ids, timeout=timeout)
    except BaseException:
        box.close()
        raise
