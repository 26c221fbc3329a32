"""Pure pieces of reliability: the cost model, the circuit breaker, the watchdog."""

from __future__ import annotations

import ctypes
import threading
import time

import pytest

from dynamic_batching.core.circuit import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from dynamic_batching.core.clock import FakeClock
from dynamic_batching.core.slowness import CostModel, confirms_slow, fingerprint
from dynamic_batching.gpu_workers.watchdog import BatchTooSlow, Watchdog


def test_cost_model_uses_the_hard_limit_until_warmed_up() -> None:
    m = CostModel(factor=4, floor_s=0.05, hard_limit_s=20, warmup=3)
    assert m.limit_s(1000) == 20
    for _ in range(3):
        m.observe(1000, 0.5)
    assert m.expected_s(1000) == pytest.approx(0.5)
    assert m.limit_s(1000) == pytest.approx(2.0)
    assert m.limit_s(10) == pytest.approx(0.05), "tiny batches get the floor"
    assert m.limit_s(10**9) == 20, "never past the hard limit"


def test_cost_model_learns_a_fixed_overhead_and_a_rate() -> None:
    m = CostModel(alpha=0.1, warmup=0)
    for p in (10, 200, 50, 400, 20, 100) * 5:
        m.observe(p, 0.004 + p * 0.0002)
    overhead, rate = m.line()  # type: ignore[misc]
    assert overhead == pytest.approx(0.004, rel=0.01) and rate == pytest.approx(0.0002, rel=0.01)
    # So a short control's time is not mistaken for a slow rate per token.
    slow, ratio = confirms_slow(
        (100, 20 * (0.004 + 100 * 0.0002)), (10, 0.006), factor=4, floor_s=0.05, expected=m.expected_s
    )
    assert slow and ratio == pytest.approx(20.0, rel=0.01)


def test_cost_model_follows_a_changing_device() -> None:
    m = CostModel(alpha=0.5, warmup=0)
    m.observe(100, 1.0)
    for _ in range(20):
        m.observe(100, 0.1)
    assert m.expected_s(100) == pytest.approx(0.1, rel=0.01)


def test_fingerprint_is_stable_and_model_specific() -> None:
    assert fingerprint("minilm", "x") == fingerprint("minilm", "x")
    assert fingerprint("minilm", "x") != fingerprint("synthetic", "x")


def test_fingerprint_survives_trivial_changes_but_not_real_ones() -> None:
    same = ["a slow  input", " a slow input\n", "a\u00a0slow input", "a slow input\t"]
    assert len({fingerprint("m", t) for t in same}) == 1
    assert fingerprint("m", "cafe\u0301") == fingerprint("m", "caf\u00e9"), "composed and decomposed accents"
    assert fingerprint("m", "a slow input") != fingerprint("m", "a slower input")
    assert fingerprint("m", ["q", "a  passage"]) == fingerprint("m", ["q", "a passage"]), "texts inside JSON too"


def test_an_input_is_slow_only_against_the_device_now() -> None:
    # A busy machine: the suspect and its batch-mate, both alone, both slow alike.
    assert confirms_slow((10, 0.40), (10, 0.35), factor=4, floor_s=0.05) == (False, pytest.approx(0.40 / 0.35))
    # A slow input: 20 times its batch-mate's rate per padded token, on the same device.
    slow, ratio = confirms_slow((10, 0.40), (20, 0.04), factor=4, floor_s=0.05)
    assert slow and ratio == pytest.approx(20.0)
    # Under the floor nothing is slow: tiny runs jitter by milliseconds.
    assert confirms_slow((10, 0.01), (10, 0.001), factor=4, floor_s=0.05)[0] is False
    assert confirms_slow((10, 1.0), (0, 0.0), factor=4, floor_s=0.05) == (False, 0.0)


def test_circuit_opens_after_threshold_and_half_opens_after_cooldown() -> None:
    clock = FakeClock()
    c = CircuitBreaker(clock, threshold=3, cooldown_s=30)
    assert not c.record_failure() and not c.record_failure()
    assert c.state == CLOSED and c.allow()
    assert c.record_failure()
    assert c.state == OPEN and not c.allow()
    clock.advance(29.9)
    assert c.state == OPEN
    clock.advance(0.1)
    assert c.state == HALF_OPEN and c.allow()
    # One failure while half-open opens it again at once.
    assert c.record_failure() and c.state == OPEN and c.trips == 2
    clock.advance(30)
    c.record_success()
    assert c.state == CLOSED and c.failures == 0


def test_success_resets_the_failure_count() -> None:
    c = CircuitBreaker(FakeClock(), threshold=2)
    c.record_failure()
    c.record_success()
    assert not c.record_failure()


def test_watchdog_cuts_off_a_slow_call_and_leaks_nothing() -> None:
    w = Watchdog()
    try:
        release = threading.Event()
        with pytest.raises(BatchTooSlow), w.limit(0.02):
            # Wakes every millisecond, like a model between layers; never released.
            while not release.wait(0.001):
                pass
        with w.limit(5):
            pass
        # Nothing fires after the block: a pending interruption was cleared on exit.
        deadline = time.monotonic() + 0.1
        while time.monotonic() < deadline:
            release.wait(0.001)
    finally:
        w.close()


def test_a_cut_off_is_not_mistaken_for_the_models_own_error() -> None:
    # Libraries turn any Exception raised inside them into an error of their own
    # (transformers: "Unable to create tensor"); a cut-off must get through them.
    w = Watchdog()
    try:
        release = threading.Event()

        def library_call() -> None:
            try:
                while not release.wait(0.001):
                    pass
            except Exception as exc:
                raise ValueError("the library's own error") from exc

        with pytest.raises(BatchTooSlow), w.limit(0.02):
            library_call()
    finally:
        w.close()


def test_watchdog_reports_a_call_stuck_in_native_code_and_only_that() -> None:
    reports: list[str] = []
    w = Watchdog(on_hung=lambda: reports.append("hung"))
    try:
        # Inside a C call no exception can land: the cut-off at 20 ms waits for the call
        # to return, and at 100 ms the call is reported as hung.
        libc = ctypes.CDLL(None)
        with pytest.raises(BatchTooSlow), w.limit(0.02, hung_after=0.1):
            libc.usleep(300_000)
        assert reports == ["hung"]
        # A call that returns in time is never reported. Proven without a sleep: a later
        # stuck call, reported after the first one's hung_after has long passed, is the
        # only new report.
        with w.limit(1.0, hung_after=0.05):
            pass
        with pytest.raises(BatchTooSlow), w.limit(0.01, hung_after=0.06):
            libc.usleep(150_000)
        assert reports == ["hung", "hung"]
    finally:
        w.close()


def test_watchdog_pause_lets_preempting_work_run_under_its_own_limit() -> None:
    w = Watchdog()
    try:
        release = threading.Event()
        # The outer call's 150 ms limit is paused for 300 ms of preempting work, which is
        # cut off at its own 20 ms limit; the outer call then finishes within its 150 ms
        # of its own time, 300 ms of wall time later than it would have.
        with w.limit(0.15):
            with w.paused() as ok:
                assert ok
                with pytest.raises(BatchTooSlow), w.limit(0.02):
                    while not release.wait(0.001):
                        pass
                release.wait(0.3)
            release.wait(0.05)
        # Once fired, a limit is not paused: the cut-off is on its way.
        with pytest.raises(BatchTooSlow), w.limit(0.01):
            while True:
                with w.paused() as ok:
                    if not ok:
                        release.wait(0.01)
    finally:
        w.close()


def test_watchdog_cuts_off_a_call_on_course_to_run_far_past_its_limit() -> None:
    clock = FakeClock()
    w = Watchdog(clock=clock)
    try:
        with w.limit(1.0):
            clock.advance(0.5)
            w.progress(0.01)  # without project=True the limit alone decides
        with pytest.raises(BatchTooSlow), w.limit(1.0, project=True):
            clock.advance(0.3)
            w.progress(0.5)  # on course for 0.6 s: in time
            clock.advance(0.1)
            w.progress(0.3)  # 1.33 s: late, but within the margin of its limit
            w.progress(0.16)  # 2.5 s: past twice its limit, cut off now
            raise AssertionError("not cut off")
        # Time paused for preempting work is not the call's own: after 5 s away it has
        # spent 0.1 s, and a tenth done is on course for 1 s.
        with w.limit(1.0, project=True):
            clock.advance(0.05)
            with w.paused():
                clock.advance(5.0)
            clock.advance(0.05)
            w.progress(0.1)
    finally:
        w.close()
