"""Interrupt a model call that runs past its time limit.

`with watchdog.limit(seconds): runner.run_batch(texts)` raises `BatchTooSlow` in the
calling thread once the limit passes. It works the way KeyboardInterrupt does: the
exception is delivered between Python bytecodes, so a model gets control back between
layers (and the synthetic model between sleep slices), never in the middle of a kernel.

Why it cannot leak: the watchdog fires only while a limit is armed, under the same lock
that disarms it, and disarming clears an exception that fired but was not yet raised.
So BatchTooSlow is raised inside the `with` block (or at its exit) or not at all.

A call stuck in native code (a CUDA kernel that never returns, a blocking C call) never
reaches a bytecode boundary, so no exception can reach it. `limit(..., hung_after=s)`
covers that: if the call is still running `s` seconds after it started, the watchdog
calls `on_hung` from its own thread (the device runner then gives the batch back and
kills its process, and the supervisor starts a fresh one).

A call that reports its progress between layers (`watchdog.progress(done)`, through
BatchRunner.step) and runs under `limit(..., project=True)` is cut off as soon as it is
on course to take PROJECTED_MARGIN times its limit: a batch with a slow input in it is
caught after its first layers instead of at its limit, so its batch-mates are bisected
free sooner. The margin keeps one slow layer on a busy host from cutting a batch that
would have ended in time.

`with watchdog.paused() as ok:` suspends the armed limit while the same thread runs
something else in the middle of the call (another batch that preempts it between
layers, gpu_workers/preempt.py), which arms limits of its own. On exit the suspended
limit resumes with its deadlines moved on by the time spent, so the preempting work
never counts against the call it interrupted. `ok` is False, and nothing is paused,
when the limit has already fired: the call is about to be cut off.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: A call that reports progress is cut off once, at its pace so far, it would take this
#: many times its limit (which is itself SLOW_FACTOR times its expected time).
PROJECTED_MARGIN = 2.0


class BatchTooSlow(BaseException):
    """The batch ran past its time limit and was cut off.

    A BaseException, as KeyboardInterrupt is, because it can land anywhere in the model's
    code: libraries that turn any Exception into their own error would otherwise make a
    cut-off look like the input's fault (transformers' BatchEncoding raises "Unable to
    create tensor" for any Exception while it builds a tensor, and a lone input then got
    that as its error)."""


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    obj = ctypes.py_object(exc) if exc is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), obj)


class Watchdog:
    def __init__(
        self, on_hung: Callable[[], object] | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._cond = threading.Condition()
        self._on_hung = on_hung
        self._clock = clock
        self._target: int | None = None
        #: When the armed call started, moved on by the time it was paused; None unless
        #: it is to be cut off by its projected end (limit(..., project=True)).
        self._started: float | None = None
        self._deadline: float | None = None
        self._hung_at: float | None = None
        self._fired = False
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="batch-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def limit(self, seconds: float, *, hung_after: float | None = None, project: bool = False) -> Iterator[None]:
        with self._cond:
            now = self._clock()
            self._target = threading.get_ident()
            self._started = now if project else None
            self._deadline = now + seconds
            self._hung_at = None if hung_after is None else now + hung_after
            self._fired = False
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                if self._fired and self._target is not None:
                    _set_async_exc(self._target, None)
                self._target = self._started = self._deadline = self._hung_at = None
                self._fired = False

    def progress(self, done: float) -> None:
        """The armed call, in this thread, has done `done` (0 to 1) of its work. Raises
        BatchTooSlow now if it runs under `project=True` and, at its pace so far, would
        end PROJECTED_MARGIN times its limit after it started."""
        with self._cond:
            started, deadline = self._started, self._deadline
            if started is None or deadline is None or self._target != threading.get_ident() or not 0 < done < 1:
                return
            elapsed = self._clock() - started
            if elapsed / done < PROJECTED_MARGIN * (deadline - started):
                return
            # Raised here, in the call's own thread; the watchdog's thread must not fire too.
            self._deadline = self._started = None
        raise BatchTooSlow

    @contextmanager
    def paused(self) -> Iterator[bool]:
        with self._cond:
            if self._fired:
                ok, saved = False, None
            else:
                ok, saved = True, (self._target, self._started, self._deadline, self._hung_at)
                self._target = self._started = self._deadline = self._hung_at = None
                self._cond.notify_all()
        t0 = self._clock()
        try:
            yield ok
        finally:
            if saved is not None:
                with self._cond:
                    if self._fired and self._target is not None:
                        _set_async_exc(self._target, None)
                    moved = self._clock() - t0
                    target, started, deadline, hung_at = saved
                    self._target = target
                    self._started = None if started is None else started + moved
                    self._deadline = None if deadline is None else deadline + moved
                    self._hung_at = None if hung_at is None else hung_at + moved
                    self._fired = False
                    self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        with self._cond:
            while not self._closed:
                if self._target is None or (self._deadline is None and self._hung_at is None):
                    self._cond.wait()
                    continue
                now = self._clock()
                if self._hung_at is not None and now >= self._hung_at:
                    self._hung_at = None
                    if self._on_hung is not None:
                        self._on_hung()
                    continue
                if self._deadline is not None and now >= self._deadline:
                    _set_async_exc(self._target, BatchTooSlow)
                    self._fired = True
                    self._deadline = None
                    continue
                wake = min(t for t in (self._deadline, self._hung_at) if t is not None)
                self._cond.wait(wake - now)
