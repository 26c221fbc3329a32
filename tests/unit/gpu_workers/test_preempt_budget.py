"""What a long batch lends to others stays inside its message's visibility timeout
(gpu_workers/preempt.py), on a fake clock: issue 41, finding 7."""

from __future__ import annotations

from typing import Any

from celery import Celery

from dynamic_batching.conf import conf
from dynamic_batching.gpu_workers import preempt
from dynamic_batching.gpu_workers.preempt import Preemption, lend_budget_s, margin_s
from dynamic_batching.gpu_workers.watchdog import Watchdog


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def preemption(clock: FakeClock) -> Preemption:
    p = Preemption(
        Celery("t", set_as_current=False),
        Watchdog(clock=clock),
        emit=lambda event: None,
        device_id="cpu-test",
        hostname="test",
        taken=None,  # type: ignore[arg-type]  # never used: nothing is taken here
        clock=clock,
    )
    p.enabled = True
    return p


def test_finding_7_every_look_at_the_queue_is_charged_to_what_a_batch_lends() -> None:
    # Each look at the shared queue ran with the watchdog paused and was charged to
    # nothing: empty looks every POLL_EVERY_S through a long batch added up to seconds
    # past the visibility timeout's margin.
    clock = FakeClock()
    p = preemption(clock)
    looks = 0

    def empty_look() -> Any:
        nonlocal looks
        looks += 1
        clock.t += 0.5  # a slow round trip to Redis
        return None

    p._take = empty_look  # type: ignore[method-assign]
    with p.armed("long", yield_after_s=0.0):
        for _ in range(1000):
            clock.t += preempt.POLL_EVERY_S
            p.between_steps()
    # Looks stop once what is left to lend is under MIN_NESTED_S.
    assert looks * 0.5 <= lend_budget_s() - preempt.MIN_NESTED_S + 0.5, looks


def test_finding_7_a_first_load_comes_out_of_what_the_batch_may_lend() -> None:
    clock = FakeClock()
    p = preemption(clock)
    with p.armed("first", yield_after_s=None):
        assert p.lend_to_self(1.5) == 1.5
        assert p._running[-1].budget_s == lend_budget_s() - 1.5
        assert p.lend_to_self(10 * conf.VISIBILITY_TIMEOUT_S) == lend_budget_s() - 1.5


def test_finding_7_the_worst_case_leaves_the_stated_margin() -> None:
    # The batch's own bound and hang grace, all it may lend, and the last lent batch's
    # own hang grace: the message is done with margin_s() before the timeout.
    worst = conf.BATCH_HARD_LIMIT_S + conf.HANG_GRACE_S + lend_budget_s() + conf.HANG_GRACE_S
    assert worst + margin_s() == conf.VISIBILITY_TIMEOUT_S
    assert margin_s() >= conf.HANG_GRACE_S, "with the defaults, at least one hang grace (3 s)"
