"""`DynamicBatcher`: the scheduler wrapped for many threads in one process.

This is the embedded mode, for people without a broker:

    batcher = DynamicBatcher(model.run_batch, BatchPolicy(max_batch_size=32), tokens=count)
    vector = batcher.infer("some text")        # blocks; called from any number of threads

One dispatcher thread closes batches; a pool of `max_concurrent_batches` threads runs
them. The lock is held only to enqueue a request or to close a batch, never while a
batch runs, so callers keep submitting while the model works.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from .clock import Clock, MonotonicClock
from .errors import BatchOutputMismatch, DeadlineExceeded, Overloaded
from .policy import BatchPolicy
from .scheduler import Batch, Item, Scheduler

X = TypeVar("X")
Y = TypeVar("Y")

#: A batch function gets the inputs in batch order and returns one output per input.
#: An output that is an exception instance fails only its own request.
RunBatch = Callable[[list[X]], Sequence[Y | BaseException]]


class DynamicBatcher(Generic[X, Y]):
    def __init__(
        self,
        run_batch: RunBatch[X, Y],
        policy: BatchPolicy | None = None,
        *,
        tokens: Callable[[X], int] = lambda _x: 1,
        clock: Clock | None = None,
        max_concurrent_batches: int = 1,
        on_batch: Callable[[Batch[tuple[X, Future[Y]]]], None] | None = None,
    ) -> None:
        if max_concurrent_batches < 1:
            raise ValueError(f"max_concurrent_batches must be an integer >= 1, got {max_concurrent_batches}")
        self._run_batch = run_batch
        self._tokens = tokens
        self._clock = clock or MonotonicClock()
        self._sched: Scheduler[tuple[X, Future[Y]]] = Scheduler(policy or BatchPolicy(), self._clock.now)
        self._max_concurrent = max_concurrent_batches
        self._on_batch = on_batch
        self._cond = threading.Condition()
        self._inflight = 0
        self._closing = False
        self._ids = itertools.count()
        self._pool = ThreadPoolExecutor(max_concurrent_batches, thread_name_prefix="batch-runner")
        self._thread = threading.Thread(target=self._dispatch_loop, name="batch-dispatcher", daemon=True)
        self._thread.start()

    # --- callers ------------------------------------------------------------------

    @property
    def policy(self) -> BatchPolicy:
        return self._sched.policy

    def set_policy(self, policy: BatchPolicy) -> None:
        with self._cond:
            self._sched.set_policy(policy)
            self._cond.notify_all()

    def submit(
        self,
        x: X,
        *,
        tokens: int | None = None,
        priority: str = "normal",
        deadline_s: float | None = None,
    ) -> Future[Y]:
        """Queue one input and return its own future at once."""
        cost = self._tokens(x) if tokens is None else tokens
        future: Future[Y] = Future()
        with self._cond:
            if self._closing:
                raise RuntimeError("DynamicBatcher is closed; submit before close()")
            policy = self._sched.policy
            if priority in policy.queue_caps and self._sched.depth(priority) >= policy.queue_caps[priority]:
                raise Overloaded(priority, policy.queue_caps[priority], 0.1)
            now = self._clock.now()
            if deadline_s is None:
                deadline_s = policy.default_deadline_s
            item = Item(
                id=str(next(self._ids)),
                tokens=cost,
                priority=priority,
                enqueued_at=now,
                deadline=None if deadline_s is None else now + deadline_s,
                payload=(x, future),
            )
            self._sched.add(item)
            self._cond.notify_all()
        return future

    def infer(self, x: X, *, timeout: float | None = None, **kwargs: object) -> Y:
        """Submit and block until this input's own output (or its own error) is ready."""
        return self.submit(x, **kwargs).result(timeout)  # type: ignore[arg-type]

    def flush(self) -> None:
        """Close the waiting requests into a batch now, as soon as a slot is free."""
        with self._cond:
            self._sched.flush()
            self._cond.notify_all()

    def close(self, *, wait: bool = True) -> None:
        """Refuse new requests, run everything still waiting, then stop."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if wait:
            self._thread.join()
            self._pool.shutdown(wait=True)

    def __enter__(self) -> DynamicBatcher[X, Y]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pending(self) -> int:
        with self._cond:
            return len(self._sched)

    # --- the dispatcher thread ----------------------------------------------------

    def _dispatch_loop(self) -> None:
        while True:
            with self._cond:
                batch, expired, done = self._next_action()
            # Everything below runs without the lock: resolving futures runs callers'
            # callbacks, and they may call submit().
            for item in expired:
                _fail(item, DeadlineExceeded(item.id, "waited past its deadline before dispatch"))
            if batch is not None:
                self._pool.submit(self._run, batch)
            if done:
                return

    def _next_action(self) -> tuple[Batch[tuple[X, Future[Y]]] | None, list[Item[tuple[X, Future[Y]]]], bool]:
        """Under the lock: wait until there is something to do, then say what."""
        while True:
            expired = self._sched.expire()
            if expired:
                return None, expired, False
            slot_free = self._inflight < self._max_concurrent
            if slot_free:
                # While closing, drain: force batches out regardless of size or wait.
                batch = self._sched.next_batch(force=self._closing)
                if batch is not None:
                    # The slot is taken here, under the same lock that checked it, so two
                    # loop turns can never both claim the last free slot.
                    self._inflight += 1
                    return batch, [], False
            if self._closing and len(self._sched) == 0:
                return None, [], True
            # With no free slot only a deadline can change anything before a batch ends.
            wake = self._sched.next_wakeup() if slot_free else self._sched.next_deadline()
            timeout = None if wake is None else max(0.0, wake - self._clock.now())
            self._clock.wait(self._cond, timeout)

    def _run(self, batch: Batch[tuple[X, Future[Y]]]) -> None:
        try:
            live = [item for item in batch.items if item.payload and item.payload[1].set_running_or_notify_cancel()]
            if not live:
                return
            if self._on_batch is not None:
                self._on_batch(batch)
            inputs = [item.payload[0] for item in live if item.payload]
            try:
                outputs = list(self._run_batch(inputs))
                if len(outputs) != len(inputs):
                    raise BatchOutputMismatch(len(inputs), len(outputs))
            except BaseException as exc:  # noqa: BLE001 - every caller must hear of it
                for item in live:
                    _fail(item, exc)
                return
            for item, out in zip(live, outputs, strict=True):
                if isinstance(out, BaseException):
                    _fail(item, out)
                else:
                    _succeed(item, out)
        finally:
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()


def _succeed(item: Item[tuple[X, Future[Y]]], value: Y) -> None:
    assert item.payload is not None
    future = item.payload[1]
    if not future.done():
        future.set_result(value)


def _fail(item: Item[tuple[X, Future[Y]]], exc: BaseException) -> None:
    assert item.payload is not None
    future = item.payload[1]
    if future.done():
        return
    if future.running() or future.set_running_or_notify_cancel():
        future.set_exception(exc)
