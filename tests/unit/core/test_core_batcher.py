"""DynamicBatcher on a FakeClock: flush triggers, routing, errors, deadlines, cancellation.

No test sleeps to wait. Time moves only through `FakeClock.advance`; a running batch is
held by a `threading.Event` gate; every wait is bounded (`result(timeout=...)`,
`event.wait(...)`, or `wait_until`, which polls a predicate against a deadline).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import pytest
from polling import poll_until

from dynamic_batching.core.batcher import DynamicBatcher
from dynamic_batching.core.clock import FakeClock
from dynamic_batching.core.errors import BatchOutputMismatch, DeadlineExceeded, Overloaded
from dynamic_batching.core.policy import BatchPolicy

WAIT = 5.0  # the most any single bounded wait in this file may take
QUIET = 0.05  # how long a negative check ("nothing ran") watches


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT, what: str = "condition") -> None:
    """Poll `predicate` until it holds; fail the test if `timeout` passes first."""
    poll_until(predicate, what, timeout=timeout, interval=0.001)


def assert_not_done(future: Future[Any]) -> None:
    """The future stays unresolved for a short bounded window."""
    with pytest.raises(FutureTimeout):
        future.result(timeout=QUIET)


# One list: a second assignment would silently drop the first one's timeout.
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("threads_not_lingering")]


class Recorder:
    """A batch function: records every call's inputs, optionally held by a gate."""

    def __init__(self, fn: Callable[[list[Any]], Sequence[Any]] | None = None) -> None:
        self.fn = fn or (lambda xs: [x * 10 for x in xs])
        self.calls: list[list[Any]] = []
        self.lock = threading.Lock()
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def hold(self) -> threading.Event:
        """From now on each batch blocks until the returned gate is set."""
        self.gate = threading.Event()
        return self.gate

    def __call__(self, inputs: list[Any]) -> Sequence[Any]:
        with self.lock:
            self.calls.append(list(inputs))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT), "gate never opened"
        return self.fn(inputs)

    def ncalls(self) -> int:
        with self.lock:
            return len(self.calls)


class Harness:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.batchers: list[DynamicBatcher[Any, Any]] = []
        self.recorders: list[Recorder] = []

    def make(
        self,
        policy: BatchPolicy,
        recorder: Recorder | None = None,
        **kwargs: Any,
    ) -> tuple[DynamicBatcher[Any, Any], Recorder]:
        rec = recorder or Recorder()
        self.recorders.append(rec)
        b: DynamicBatcher[Any, Any] = DynamicBatcher(rec, policy, clock=self.clock, **kwargs)
        self.batchers.append(b)
        return b, rec

    def close_all(self) -> None:
        for rec in self.recorders:
            if rec.gate is not None:
                rec.gate.set()
        for b in self.batchers:
            closer = threading.Thread(target=b.close, name="test-closer", daemon=True)
            closer.start()
            closer.join(WAIT)
            assert not closer.is_alive(), "DynamicBatcher.close() did not return"


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    try:
        yield harness
    finally:
        harness.close_all()


def results(futures: Sequence[Future[Any]]) -> list[Any]:
    return [f.result(timeout=WAIT) for f in futures]


LONG_WAIT = 10_000.0  # ms: the wait trigger never fires unless a test advances this far


# --- flush triggers -------------------------------------------------------------------


def test_request_cap_closes_a_batch_without_time_passing(h: Harness) -> None:
    b, rec = h.make(BatchPolicy(max_batch_size=4, max_wait_ms=LONG_WAIT))
    futures = [b.submit(i) for i in range(3)]
    assert_not_done(futures[0])
    futures.append(b.submit(3))
    assert results(futures) == [0, 10, 20, 30]
    assert rec.calls == [[0, 1, 2, 3]]
    assert b.pending() == 0


def test_token_budget_counts_padded_tokens(h: Harness) -> None:
    # 30 tokens each, budget 100: 4 x 30 = 120 real tokens waiting trips the trigger,
    # and 3 x 30 = 90 padded is the most that fits a batch.
    b, rec = h.make(
        BatchPolicy(max_batch_size=32, max_batch_tokens=100, max_wait_ms=LONG_WAIT),
        tokens=lambda _x: 30,
    )
    futures = [b.submit(i) for i in range(7)]
    wait_until(lambda: rec.ncalls() == 2 and b.pending() == 1, what="two batches of 3")
    assert [len(c) for c in rec.calls] == [3, 3]
    assert not futures[6].done()
    b.close()
    assert results(futures) == [i * 10 for i in range(7)]
    assert [len(c) for c in rec.calls] == [3, 3, 1]


def test_token_budget_is_batch_size_times_longest(h: Harness) -> None:
    # 50 + 10 + 10 = 70 real tokens would fit a budget of 100, but padded to the longest
    # that is 3 x 50 = 150: only [50, 10] (2 x 50 = 100) fits.
    lengths = {"a": 50, "b": 10, "c": 10}
    b, rec = h.make(
        BatchPolicy(max_batch_size=32, max_batch_tokens=100, max_wait_ms=LONG_WAIT),
        recorder=Recorder(lambda xs: [x.upper() for x in xs]),
        tokens=lengths.__getitem__,
    )
    futures = [b.submit(x) for x in "abc"]
    b.flush()
    assert results(futures[:2]) == ["A", "B"]
    wait_until(lambda: b.pending() == 1, what="c left waiting")
    assert rec.calls == [["a", "b"]]
    assert_not_done(futures[2])
    b.flush()
    assert futures[2].result(timeout=WAIT) == "C"
    assert rec.calls == [["a", "b"], ["c"]]


def test_max_wait_dispatches_only_when_the_clock_reaches_it(h: Harness) -> None:
    b, rec = h.make(BatchPolicy(max_batch_size=4, max_wait_ms=10))
    future = b.submit(7)
    assert_not_done(future)
    h.clock.advance(0.0099)
    assert_not_done(future)
    assert rec.calls == []
    h.clock.advance(0.0001)
    assert future.result(timeout=WAIT) == 70
    assert rec.calls == [[7]]


def test_max_wait_fires_at_exactly_max_wait(h: Harness) -> None:
    # Regression: FakeClock starts at 1000.0, where 1000.0 + 0.010 - 1000.0 < 0.010 in
    # floating point; the trigger must agree with the wake-up time it asked for.
    b, rec = h.make(BatchPolicy(max_batch_size=4, max_wait_ms=10))
    future = b.submit(1)
    assert_not_done(future)
    h.clock.advance(0.010)
    assert future.result(timeout=WAIT) == 10


def test_wait_is_measured_from_the_oldest_request(h: Harness) -> None:
    b, rec = h.make(BatchPolicy(max_batch_size=8, max_wait_ms=10))
    first = b.submit(1)
    h.clock.advance(0.006)
    second = b.submit(2)
    assert_not_done(first)
    h.clock.advance(0.005)  # the first has waited 11 ms, the second 5 ms
    assert results([first, second]) == [10, 20]
    assert rec.calls == [[1, 2]]


def test_explicit_flush(h: Harness) -> None:
    b, rec = h.make(BatchPolicy(max_batch_size=4, max_wait_ms=LONG_WAIT))
    futures = [b.submit(i) for i in range(2)]
    assert_not_done(futures[0])
    b.flush()
    assert results(futures) == [0, 10]
    assert rec.calls == [[0, 1]]


def test_close_drains_then_refuses(h: Harness) -> None:
    b, rec = h.make(BatchPolicy(max_batch_size=2, max_wait_ms=LONG_WAIT))
    futures = [b.submit(i) for i in range(5)]  # 2 + 2 by size, 1 left waiting
    wait_until(lambda: b.pending() == 1, what="one request left")
    b.close()
    assert results(futures) == [0, 10, 20, 30, 40]
    assert sorted(x for call in rec.calls for x in call) == [0, 1, 2, 3, 4]
    assert all(len(call) <= 2 for call in rec.calls)
    with pytest.raises(RuntimeError, match="closed"):
        b.submit(99)
    b.close()  # closing twice is harmless


def test_context_manager_closes() -> None:
    rec = Recorder()
    with DynamicBatcher(rec, BatchPolicy(max_wait_ms=LONG_WAIT), clock=FakeClock()) as b:
        future = b.submit(4)
    assert future.result(timeout=WAIT) == 40
    with pytest.raises(RuntimeError):
        b.submit(5)


def test_close_waits_for_a_running_batch(h: Harness) -> None:
    b, rec = h.make(BatchPolicy(max_batch_size=4, max_wait_ms=0))
    gate = rec.hold()
    running = b.submit(1)
    assert rec.entered.wait(WAIT)
    queued = b.submit(2)
    closer = threading.Thread(target=b.close, name="test-closer")
    closer.start()
    closer.join(QUIET)
    assert closer.is_alive(), "close() returned while a batch was still running"
    gate.set()
    closer.join(WAIT)
    assert not closer.is_alive()
    assert results([running, queued]) == [10, 20]


# --- routing and order ----------------------------------------------------------------


def test_each_caller_gets_its_own_output_in_submit_order(h: Harness) -> None:
    b, rec = h.make(BatchPolicy(max_batch_size=4, max_wait_ms=LONG_WAIT))
    inputs = [5, 3, 9, 1, 8, 2, 7, 4]
    futures = [b.submit(x) for x in inputs]
    assert results(futures) == [x * 10 for x in inputs]
    # One tier, equal lengths: each batch holds its requests in the order submitted.
    assert rec.calls == [[5, 3, 9, 1], [8, 2, 7, 4]]


def test_routing_with_mixed_lengths_and_tiers(h: Harness) -> None:
    lengths = {i: 1 + (i * 37) % 90 for i in range(24)}
    b, rec = h.make(
        BatchPolicy(max_batch_size=5, max_batch_tokens=200, max_wait_ms=LONG_WAIT),
        tokens=lengths.__getitem__,
    )
    prios = ["high", "normal", "low"]
    futures = {i: b.submit(i, priority=prios[i % 3]) for i in range(24)}
    b.flush()
    b.close()
    for i, f in futures.items():
        assert f.result(timeout=WAIT) == i * 10
    seen = [x for call in rec.calls for x in call]
    assert sorted(seen) == list(range(24))
    for call in rec.calls:
        assert len(call) <= 5
        assert len(call) == 1 or len(call) * max(lengths[x] for x in call) <= 200


# --- errors ---------------------------------------------------------------------------


def test_an_exception_output_fails_only_its_own_request(h: Harness) -> None:
    boom = ValueError("bad input 2")
    b, _ = h.make(
        BatchPolicy(max_batch_size=4, max_wait_ms=LONG_WAIT),
        recorder=Recorder(lambda xs: [boom if x == 2 else x * 10 for x in xs]),
    )
    futures = [b.submit(i) for i in range(4)]
    with pytest.raises(ValueError) as info:
        futures[2].result(timeout=WAIT)
    assert info.value is boom
    assert results([futures[0], futures[1], futures[3]]) == [0, 10, 30]


def test_a_raising_batch_function_fails_every_request_in_the_batch(h: Harness) -> None:
    boom = RuntimeError("model crashed")

    def crash(_xs: list[int]) -> list[int]:
        raise boom

    b, rec = h.make(BatchPolicy(max_batch_size=4, max_wait_ms=LONG_WAIT), recorder=Recorder(crash))
    futures = [b.submit(i) for i in range(4)]
    for f in futures:
        assert f.exception(timeout=WAIT) is boom
    # The batcher survives: the next batch runs normally.
    rec.fn = lambda xs: [x * 10 for x in xs]
    later = [b.submit(i) for i in range(4)]
    assert results(later) == [0, 10, 20, 30]


def test_output_count_mismatch_fails_every_request(h: Harness) -> None:
    b, _ = h.make(
        BatchPolicy(max_batch_size=4, max_wait_ms=LONG_WAIT),
        recorder=Recorder(lambda xs: [x * 10 for x in xs][:-1]),
    )
    futures = [b.submit(i) for i in range(4)]
    for f in futures:
        exc = f.exception(timeout=WAIT)
        assert isinstance(exc, BatchOutputMismatch)
        assert (exc.inputs, exc.outputs) == (4, 3)


# --- the lock is not held while a batch runs ------------------------------------------


def test_submit_is_not_blocked_by_a_running_batch(h: Harness) -> None:
    b, rec = h.make(BatchPolicy(max_batch_size=64, max_wait_ms=0))
    gate = rec.hold()
    first = b.submit(-1)
    assert rec.entered.wait(WAIT), "first batch never started"

    per_thread, nthreads = 5, 8
    futures: dict[int, Future[int]] = {}
    lock = threading.Lock()

    def client(t: int) -> None:
        for i in range(per_thread):
            x = t * 100 + i
            f = b.submit(x)
            with lock:
                futures[x] = f

    threads = [threading.Thread(target=client, args=(t,), name=f"test-client-{t}") for t in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive(), "submit() blocked while a batch was running"

    assert len(futures) == per_thread * nthreads
    assert rec.ncalls() == 1 and not first.done()
    assert not any(f.done() for f in futures.values())
    gate.set()
    assert first.result(timeout=WAIT) == -10
    for x, f in futures.items():
        assert f.result(timeout=WAIT) == x * 10
    assert rec.calls[0] == [-1]
    assert sorted(x for call in rec.calls[1:] for x in call) == sorted(futures)


# --- deadlines and queue caps ---------------------------------------------------------


def test_deadline_expires_while_no_slot_is_free(h: Harness) -> None:
    b, rec = h.make(BatchPolicy(max_batch_size=4, max_wait_ms=0), max_concurrent_batches=1)
    gate = rec.hold()
    running = b.submit(1)
    assert rec.entered.wait(WAIT)
    doomed = b.submit(2, deadline_s=0.05)
    patient = b.submit(3)
    assert_not_done(doomed)
    h.clock.advance(0.06)
    exc = doomed.exception(timeout=WAIT)
    assert isinstance(exc, DeadlineExceeded)
    assert not running.done() and not patient.done()
    gate.set()
    assert results([running, patient]) == [10, 30]
    assert all(2 not in call for call in rec.calls)


def test_deadline_not_yet_reached_still_runs(h: Harness) -> None:
    b, rec = h.make(BatchPolicy(max_batch_size=4, max_wait_ms=0))
    gate = rec.hold()
    running = b.submit(1)
    assert rec.entered.wait(WAIT)
    ok = b.submit(2, deadline_s=0.05)
    h.clock.advance(0.04)
    assert_not_done(ok)
    gate.set()
    assert results([running, ok]) == [10, 20]


def test_default_deadline_from_policy(h: Harness) -> None:
    b, rec = h.make(BatchPolicy(max_batch_size=4, max_wait_ms=LONG_WAIT, default_deadline_s=1.0))
    doomed = b.submit(1)
    h.clock.advance(1.0)
    assert isinstance(doomed.exception(timeout=WAIT), DeadlineExceeded)
    assert rec.calls == []


def test_queue_cap_raises_overloaded(h: Harness) -> None:
    caps = {"high": 2000, "normal": 2, "low": 2000}
    b, _ = h.make(BatchPolicy(max_batch_size=32, max_wait_ms=LONG_WAIT, queue_caps=caps))
    futures = [b.submit(i) for i in range(2)]
    with pytest.raises(Overloaded) as info:
        b.submit(2)
    assert (info.value.queue, info.value.cap) == ("normal", 2)
    assert info.value.retry_after > 0
    futures.append(b.submit(3, priority="high"))  # other tiers have their own caps
    b.flush()
    assert results(futures) == [0, 10, 30]
    wait_until(lambda: b.pending() == 0, what="queue drained")
    again = b.submit(4)  # room again once the queue drained
    b.flush()
    assert again.result(timeout=WAIT) == 40


# --- cancellation ---------------------------------------------------------------------


def test_cancelled_future_is_skipped(h: Harness) -> None:
    b, rec = h.make(BatchPolicy(max_batch_size=8, max_wait_ms=0))
    gate = rec.hold()
    running = b.submit(0)
    assert rec.entered.wait(WAIT)
    a, c, d = b.submit(1), b.submit(2), b.submit(3)
    assert c.cancel()
    gate.set()
    assert results([running, a, d]) == [0, 10, 30]
    assert c.cancelled()
    assert rec.calls == [[0], [1, 3]]


def test_a_batch_of_only_cancelled_futures_never_calls_the_model(h: Harness) -> None:
    b, rec = h.make(BatchPolicy(max_batch_size=8, max_wait_ms=0))
    gate = rec.hold()
    running = b.submit(0)
    assert rec.entered.wait(WAIT)
    cancelled = [b.submit(i) for i in (1, 2)]
    assert all(f.cancel() for f in cancelled)
    gate.set()
    assert running.result(timeout=WAIT) == 0
    wait_until(lambda: b.pending() == 0, what="cancelled batch dispatched")
    after = b.submit(5)
    assert after.result(timeout=WAIT) == 50
    assert rec.calls == [[0], [5]]


# --- the fake clock itself ------------------------------------------------------------


class RacyClock(FakeClock):
    """Lands an `advance` in the window between the dispatcher reading the clock and its
    first registered wait, when `advance` cannot yet know the dispatcher's condition.

    Waits with nothing scheduled (timeout None) are left unregistered, so that the first
    registration happens with a request queued and a wake-up time computed.
    """

    def __init__(self, step: float) -> None:
        super().__init__()
        self.step: float | None = step

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        if timeout is None and self.step is not None:
            cond.wait()  # only the owner's notify (a submit) can end this one
            return
        if self.step is not None:
            step, self.step = self.step, None
            self.advance(step)
        super().wait(cond, timeout)


def test_an_advance_racing_the_first_wait_is_not_lost() -> None:
    b = DynamicBatcher(Recorder(), BatchPolicy(max_wait_ms=10), clock=RacyClock(0.010))
    try:
        future = b.submit(1)
        assert future.result(timeout=WAIT) == 10
    finally:
        b.close()
