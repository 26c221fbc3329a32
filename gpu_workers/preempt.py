"""Preemption: a batch that runs long lets waiting batches run between its layers.

Without it, one device running a slow input (20x the cost of its neighbours) held every
request behind it for the whole of that input's run, however well the slow lane chose
when to start it; and a batch with a new slow input in it held the device through its
cut-off, bisection and isolation. Here such a batch *yields*: between two of its layers
(BatchRunner.step) the device takes the next batch waiting on the shared queue, runs it
to the end, and goes back to the long one. What may yield:

- a slow-lane batch, from its first layer;
- any other batch once it has run PREEMPT_AFTER times its expected time: from then on
  it is probably slow (a new slow input, or a busy device), and whatever it does next,
  the cut-off and the bisection included, lets others go first.

The first time a batch yields, the device tells the collector (a `yielding` event), which
stops counting that batch against the device's slot and sends the next batch at once
(tasks/core/slots.py). A batch already in the worker's other thread, waiting for the
device (DEVICE_OVERLAP), goes first: the long batch lends it the device lock
(gpu_workers/device_lock.py) and waits until it is done. Otherwise the device picks the
next one up with a non-blocking `basic_get` on the shared queue, unacked until it is answered, exactly as the worker's own consumer would
have (a crash mid-run leaves it to the broker's visibility timeout), and runs it through
Celery's own tracer, so its result, its chord and Flower's events are as if the worker
had run it.

Why the long batch is not hurt: the watchdog's limit on it is paused while another
batch runs (gpu_workers/watchdog.py), and every time the device runner measures it
(its cost, its run time, whether its input is slow) is read from `own_clock()`, which
leaves out the time spent on preempting batches. Why it cannot outlive its message's
visibility timeout: the long batch itself runs at most BATCH_HARD_LIMIT_S plus
HANG_GRACE_S of its own time; what it lends (the preempting batches, and every look at
the queue for one) is bounded by `lend_budget_s()`, and the last batch it lends to may
overrun what was left by one HANG_GRACE_S. So a batch message is finished, or handed
on, `margin_s()` before its visibility timeout at the latest (issue 41, finding 7):
hosts' clocks must agree to well within that (docs/reliability.md). A preempting batch
may yield in turn (a new slow input can be in it too), down to MAX_DEPTH batches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from celery import Celery, states
from celery.app.trace import trace_task
from kombu import Queue

from dynamic_batching.conf import conf
from dynamic_batching.protocol import events as flower_events
from dynamic_batching.protocol.names import BATCH_QUEUE, BATCH_TASK

from .device_lock import DeviceLock
from .taken import Taken
from .watchdog import Watchdog

log = logging.getLogger(__name__)

#: At most one look at the shared queue per this many seconds of a yielding batch (a
#: GPU runs a layer in well under a millisecond; the look is a Redis round trip).
POLL_EVERY_S = 0.002
#: Preempting batches start only while at least this much of their budget is left.
MIN_NESTED_S = 1.0
#: At most this many batches run one inside another (each holds its activations).
MAX_DEPTH = 6


def lend_budget_s() -> float:
    """What one long batch may lend in all: half of what its message's visibility
    timeout leaves past its own bound, its own hang grace and the last lent batch's."""
    return max(0.0, (conf.VISIBILITY_TIMEOUT_S - conf.BATCH_HARD_LIMIT_S - 2 * conf.HANG_GRACE_S) / 2)


def margin_s() -> float:
    """How long before its visibility timeout a batch message is done with, at the
    latest: the other half (with the defaults, 3 s)."""
    return conf.VISIBILITY_TIMEOUT_S - conf.BATCH_HARD_LIMIT_S - 2 * conf.HANG_GRACE_S - lend_budget_s()


@dataclass
class _Armed:
    batch_id: str
    #: time.monotonic() after which this batch yields.
    yield_at: float
    #: Preempting batches may still take this many seconds inside this batch.
    budget_s: float
    announced: bool = False
    next_poll: float = 0.0


class Preemption:
    def __init__(
        self,
        app: Celery,
        watchdog: Watchdog,
        *,
        emit: Callable[[dict[str, Any]], None],
        device_id: str,
        hostname: str,
        taken: Taken,
        device_lock: DeviceLock | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        #: A batch waiting for the device in this worker's other thread (DEVICE_OVERLAP)
        #: runs first, before one fetched from the queue: it is already here.
        self.device_lock = device_lock
        self._clock = clock
        self.taken = taken
        self.watchdog = watchdog
        self._emit = emit
        self.device_id = device_id
        self.hostname = hostname
        self.enabled = conf.PREEMPTION
        #: The batches running now, outermost first: each one after the first runs
        #: between two layers of the one before it.
        self._running: list[_Armed] = []
        #: The time bounds of the preempting batches running now, for their runner.
        self._untils: list[float] = []
        #: Wall seconds spent on preempting batches, ever, each second counted once
        #: however deep (own_clock subtracts it).
        self.nested_s = 0.0
        #: How many batches ran inside another.
        self.preempted = 0
        self._conn: Any = None
        self._queue: Any = None

    # --- for the device runner ---------------------------------------------------------

    def own_clock(self) -> float:
        """perf_counter() less the time spent on preempting batches: what the batch
        being run has itself taken, read at its start and its end."""
        return time.perf_counter() - self.nested_s

    @property
    def nested_until(self) -> float | None:
        """time.monotonic() by which the batch starting now must end: set when it runs
        inside another, from what that one may still give away."""
        return self._untils[-1] if self._untils else None

    @contextmanager
    def armed(self, batch_id: str, *, yield_after_s: float | None) -> Iterator[None]:
        """While this batch runs, it may yield after `yield_after_s` (None: never). A
        batch that preempts another may yield in turn (a new slow input can be in it),
        down to MAX_DEPTH batches deep."""
        if not self.enabled or yield_after_s is None or len(self._running) >= MAX_DEPTH:
            yield_at = float("inf")
        else:
            yield_at = self._clock() + yield_after_s
        self._running.append(_Armed(batch_id, yield_at, lend_budget_s()))
        try:
            yield
        finally:
            self._running.pop()

    def lend_to_self(self, seconds: float) -> float:
        """The batch running now (the innermost) spent `seconds` on something that is
        not its inputs' fault (loading its model): take up to that much out of what it
        may lend, and return how much it got."""
        if not self._running:
            return 0.0
        armed = self._running[-1]
        got = max(0.0, min(seconds, armed.budget_s))
        armed.budget_s -= got
        return got

    def between_steps(self) -> None:
        """BatchRunner.between_steps: run the next waiting batch, if the batch running
        now (the innermost) yields."""
        if not self._running:
            return
        armed = self._running[-1]
        now = self._clock()
        # What a batch started now may take: what this one may still lend, and never
        # past this one's own bound when it runs inside another (a deeper batch lends
        # only what the one it runs inside lent it).
        room = armed.budget_s if not self._untils else min(armed.budget_s, self._untils[-1] - now)
        if now < armed.yield_at or now < armed.next_poll or room < MIN_NESTED_S:
            return
        armed.next_poll = now + POLL_EVERY_S
        # Paused for the look at the queue too: the watchdog's interruption must never
        # land inside a Redis call (it would be caught there, or leave a reply half read).
        with self.watchdog.paused() as ok:
            if not ok:
                return  # this batch is being cut off right now
            if not armed.announced:
                armed.announced = True
                log.info("batch %s is long: running waiting batches between its layers", armed.batch_id)
                self._emit({"kind": "yielding", "batch_id": armed.batch_id, "device": self.device_id})
            lock = self.device_lock
            if lock is not None and lock.wanted:
                self._nested(armed, lock.lend)
                return
            message = self._take()
            # The look is lent time too: the watchdog was paused for it. Empty looks
            # every POLL_EVERY_S through a long batch add up to seconds.
            armed.budget_s -= self._clock() - now
            if message is not None:
                self._nested(armed, lambda: self._run(message))

    def _nested(self, armed: _Armed, run: Callable[[], object]) -> None:
        """Run another batch inside `armed`: `run` it with what `armed` may lend as its
        time bound, and count what it took as lent."""
        now = self._clock()
        room = armed.budget_s if not self._untils else min(armed.budget_s, self._untils[-1] - now)
        self._untils.append(now + min(conf.BATCH_HARD_LIMIT_S, max(0.0, room)))
        t0, inside = time.perf_counter(), self.nested_s
        try:
            run()
        except Exception:
            # Left unacked: the broker hands it out again after the visibility timeout.
            log.exception("a batch run inside batch %s failed", armed.batch_id)
        finally:
            took = time.perf_counter() - t0
            # What deeper batches took inside this one is already counted.
            self.nested_s += took - (self.nested_s - inside)
            armed.budget_s -= took
            self._untils.pop()
            self.preempted += 1

    def close(self) -> None:
        if self._conn is not None:
            self._conn.release()
            self._conn = self._queue = None

    # --- the batch that preempts -------------------------------------------------------

    def _take(self) -> Any:
        """The next batch task on the shared queue, unacked, or None."""
        try:
            if self._queue is None:
                self._conn = self.app.connection_for_read()
                self._queue = Queue(BATCH_QUEUE).bind(self._conn.default_channel)
            return self._queue.get(no_ack=False, accept=["json"])
        except Exception:
            log.warning("could not look at %s for a batch to run first", BATCH_QUEUE, exc_info=True)
            self.close()
            return None

    def _run(self, message: Any) -> None:
        """Run a batch task message as the worker would: Celery's tracer stores its
        result and counts its chord; it is acked once answered, requeued if it could
        not finish (the task raised Reject)."""
        headers = message.headers or {}
        task_id = headers.get("id")
        try:
            args, kwargs, embed = message.decode()
        except Exception:
            log.exception("batch task %s has a body that is not a task's; dropping it", task_id)
            message.ack()
            return
        task = self.app.tasks[headers.get("task") or BATCH_TASK]
        if task_id:
            self.taken.took(task_id, message.delivery_tag)
        request = {
            **headers,
            **(embed or {}),
            "delivery_info": dict(message.delivery_info or {}),
            "args": args,
            "kwargs": kwargs,
            "hostname": self.hostname,
            "is_eager": False,
        }
        shown = flower_events.Events(self.app, self.hostname)
        started = time.time()
        shown.add("task-received", uuid=task_id, name=task.name, args=headers.get("argsrepr") or "", kwargs="{}")
        shown.add("task-started", uuid=task_id, timestamp=started)
        t0 = time.perf_counter()
        retval, info = trace_task(task, task_id, args, kwargs, request, app=self.app, hostname=self.hostname)[:2]
        state = getattr(info, "state", None)
        if state == states.REJECTED:
            message.requeue()
            shown.add("task-rejected", uuid=task_id, requeue=True)
        else:
            message.ack()
            if state == states.FAILURE:
                shown.add("task-failed", uuid=task_id, exception=repr(retval), traceback="")
            else:
                shown.add("task-succeeded", uuid=task_id, result=repr(retval), runtime=time.perf_counter() - t0)
        try:
            pipe = self.app.backend.client.pipeline(transaction=False)
            shown.publish_on(pipe)
            pipe.execute()
        except Exception:
            log.warning("could not send Flower the events of batch %s", task_id, exc_info=True)
