"""Interrupt a model call that runs past its time limit.

`with watchdog.limit(seconds): runner.run_batch(texts)` raises `BatchTooSlow` in the
calling thread once the limit passes. It works the way KeyboardInterrupt does: the
exception is delivered between Python bytecodes, so a model gets control back between
layers (and the synthetic model between sleep slices), never in the middle of a kernel.

Why it cannot leak: the watchdog fires only while a limit is armed, under the same lock
that disarms it, and disarming clears an exception that fired but was not yet raised.
So BatchTooSlow is raised inside the `with` block (or at its exit) or not at all.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class BatchTooSlow(Exception):
    """The batch ran past its time limit and was cut off."""


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    obj = ctypes.py_object(exc) if exc is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), obj)


class Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._target: int | None = None
        self._deadline: float | None = None
        self._fired = False
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="batch-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def limit(self, seconds: float) -> Iterator[None]:
        with self._cond:
            self._target = threading.get_ident()
            self._deadline = time.monotonic() + seconds
            self._fired = False
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                if self._fired and self._target is not None:
                    _set_async_exc(self._target, None)
                self._target = self._deadline = None
                self._fired = False

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        with self._cond:
            while not self._closed:
                if self._deadline is None or self._target is None:
                    self._cond.wait()
                    continue
                remaining = self._deadline - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                _set_async_exc(self._target, BatchTooSlow)
                self._fired = True
                self._deadline = None
