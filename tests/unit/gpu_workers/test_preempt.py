"""How much of its device a long batch lends to the batches waiting behind it
(gpu_workers/preempt.py), on a fake clock: the queue and the batches run inside are
stand-ins, the rule is the real one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from gpu_workers.preempt import Preemption
from tasks.core.clock import FakeClock

#: One layer of the long batch, and one waiting batch run to its end.
LAYER_S = 0.005
WAITING_BATCH_S = 0.030


class _Watchdog:
    @contextmanager
    def paused(self) -> Iterator[bool]:
        yield True


def _preemption(clock: FakeClock) -> Preemption:
    p = Preemption(None, _Watchdog(), emit=lambda event: None, device_id="cpu:0", hostname="w", clock=clock)  # type: ignore[arg-type]
    p._take = lambda: object()  # type: ignore[method-assign] # the queue is never empty
    p._run = lambda message: clock.advance(WAITING_BATCH_S)  # type: ignore[method-assign]
    return p


def _run_layers(p: Preemption, clock: FakeClock, layers: int) -> None:
    for _ in range(layers):
        clock.advance(LAYER_S)
        p.between_steps()


@pytest.fixture(autouse=True)
def _settings(settings: Any) -> None:
    settings.PREEMPTION = True
    settings.LONG_BATCH_SHARE = 0.5


def test_a_long_ordinary_batch_keeps_its_share_of_the_device_with_the_queue_always_fed() -> None:
    clock = FakeClock()
    p = _preemption(clock)
    with p.armed("long", yield_after_s=0.0):
        start, own0 = clock(), p.own_clock()
        _run_layers(p, clock, 40)
        own = p.own_clock() - own0
        lent = clock() - start - own
    assert own == pytest.approx(40 * LAYER_S)
    # Half of the device, give or take the one batch that starts the turn.
    assert lent > 0 and lent <= own + WAITING_BATCH_S
    assert p.preempted >= 5


def test_a_slow_lane_batch_lends_the_device_to_every_waiting_batch() -> None:
    clock = FakeClock()
    p = _preemption(clock)
    with p.armed("slow", yield_after_s=0.0, slow_lane=True):
        _run_layers(p, clock, 40)
    assert p.preempted == 40  # one waiting batch between every two layers


def test_a_suspect_run_alone_lends_without_bound() -> None:
    clock = FakeClock()
    p = _preemption(clock)
    with p.armed("cut off", yield_after_s=0.0):
        _run_layers(p, clock, 10)
        bounded = p.preempted
        p.yield_freely()
        _run_layers(p, clock, 10)
    assert bounded < 10
    assert p.preempted - bounded == 10


def test_a_batch_lends_nothing_before_its_time_or_with_preemption_off(settings: Any) -> None:
    clock = FakeClock()
    p = _preemption(clock)
    with p.armed("in time", yield_after_s=1.0):
        _run_layers(p, clock, 10)
    assert p.preempted == 0
    settings.PREEMPTION = False
    p = _preemption(clock)
    with p.armed("cut off", yield_after_s=0.0, slow_lane=True):
        p.yield_freely()
        _run_layers(p, clock, 10)
    assert p.preempted == 0


def test_a_milestone_of_own_time_is_called_once_between_layers_lent_time_left_out() -> None:
    clock = FakeClock()
    p = _preemption(clock)
    calls: list[float] = []
    with p.armed("suspect", yield_after_s=0.0):
        own0 = p.own_clock()
        with p.at_own_time(0.050, lambda: calls.append(p.own_clock() - own0)):
            _run_layers(p, clock, 30)
        with p.at_own_time(1.0, lambda: calls.append(-1.0)):
            _run_layers(p, clock, 2)  # ends long before its milestone
    assert len(calls) == 1
    # Reached after 50 ms of its own layers, whatever it lent meanwhile.
    assert calls[0] == pytest.approx(0.050)
