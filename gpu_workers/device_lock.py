"""The lock a device worker's batches hold while they use the device.

With DEVICE_OVERLAP a device worker runs two batch tasks in two threads
(gpu_workers/worker.py): while one holds the device, the other decodes, prepares, or
writes its answers. This lock keeps the device to one batch at a time, and adds one
thing to a re-entrant lock: the batch holding it may *lend* it between two of its
layers to a batch waiting for it in the other thread (preemption, gpu_workers/preempt.py,
which before overlap only ran batches it fetched itself, in its own thread). The lender
waits until the borrower releases it, and gets it back before any other waiter.

Why not threading.RLock: a lender holds the lock inside its model call (the runners
take it around their forward pass) while the borrower runs the same model; an RLock
would make the borrower wait for the lender, which waits for the borrower.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType


def let_go_of_the_gil() -> None:
    """Release the GIL for a moment: a thread waiting for it runs now."""
    time.sleep(0)


class DeviceLock:
    def __init__(self, *, yield_gil: Callable[[], object] = let_go_of_the_gil) -> None:
        self._yield_gil = yield_gil
        #: Set by the batch holding the device: whether, when it lets go with a batch
        #: waiting, it also lets go of the GIL for that batch (`release`). Not on a CPU
        #: device, where the next batch's model and the writing of these answers share
        #: the same cores and the gap was 0.2 ms already: MiniLM on 2 CPUs gave 4-14%
        #: fewer texts a second with it in four pairs, within this machine's noise
        #: (bench/device_gaps.py --callers 16 --make-run; docs/benchmarks.md).
        self.hand_on_gil = True
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._waiting = 0
        #: Holders that lent the lock, innermost last: (thread, depth) to give it back to.
        self._lenders: list[tuple[int, int]] = []

    def acquire(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return
            self._waiting += 1
            try:
                while self._owner is not None:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._owner, self._depth = me, 1

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("release of a device lock this thread does not hold")
            self._depth -= 1
            if self._depth:
                return
            # Straight back to the batch that lent it, before any other waiter.
            self._owner, self._depth = self._lenders.pop() if self._lenders else (None, 0)
            self._cond.notify_all()
            handing = self._owner is None and self._waiting > 0 and self.hand_on_gil
        # A batch waits for the device: let it have the GIL before this thread goes on
        # to write its answers. Without this, the waiting thread woke only at the next
        # GIL switch, or once the writer let go of it, and the device sat idle 2-4 ms
        # (median) between two batches, the next one ready (bench/accelerator.py,
        # docs/benchmarks.md). Waiting until it has taken the device was worse: the
        # answers and the ack came later, and so did the batch after.
        if handing:
            self._yield_gil()

    def __enter__(self) -> DeviceLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    @property
    def waiting(self) -> int:
        """How many threads are waiting for the device."""
        return self._waiting

    @property
    def wanted(self) -> bool:
        """Another thread is waiting for the device."""
        return self._waiting > 0

    def lend(self) -> bool:
        """From the holder: let a thread waiting for the device have it now, and return
        once that thread has released it (True), or at once if none waits (False)."""
        me = threading.get_ident()
        with self._cond:
            if self._owner != me or not self._waiting:
                return False
            self._lenders.append((me, self._depth))
            self._owner, self._depth = None, 0
            self._cond.notify_all()
            while self._owner != me:
                self._cond.wait()
            return True
