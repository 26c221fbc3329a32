"""Slots: how many batches may be outstanding, and which are presumed lost after a while."""

from __future__ import annotations

import pytest

from dynamic_batching.core.clock import FakeClock
from dynamic_batching.core.slots import Slots


def test_free_allows_one_running_and_batches_ahead_queued_per_device() -> None:
    slots = Slots(clock=lambda: 0.0, timed=False)
    assert slots.free(devices=2, batches_ahead=0) == 2
    assert slots.free(devices=2, batches_ahead=1) == 4
    assert slots.free(devices=0, batches_ahead=3) == 0


def test_free_counts_outstanding_batches_and_never_goes_negative() -> None:
    slots = Slots(clock=lambda: 0.0, timed=False)
    for i in range(3):
        slots.sent(f"b{i}", 100)
    assert len(slots) == 3
    assert slots.free(devices=2, batches_ahead=1) == 1
    assert slots.free(devices=1, batches_ahead=0) == 0


def test_done_frees_a_slot_once_and_ignores_unknown_or_foreign_ids() -> None:
    slots = Slots(clock=lambda: 0.0)
    slots.sent("ours", 100)
    assert slots.done("unknown", 100, 0.1) is False
    assert slots.done(None, 100, 0.1) is False
    assert slots.done(42, 100, 0.1) is False
    assert len(slots) == 1
    assert slots.done("ours", 100, 0.1) is True
    assert len(slots) == 0
    assert slots.done("ours", 100, 0.1) is False, "a second report is not ours any more"


def test_reclaim_stale_with_no_cost_known_waits_the_minimum() -> None:
    clock = FakeClock(start=1000.0)
    slots = Slots(clock=clock, stale_factor=4.0, stale_min_s=3.0)
    slots.sent("lost", 500)
    clock.advance(3.0)
    assert slots.reclaim_stale() == []
    assert len(slots) == 1
    clock.advance(0.5)
    [(batch_id, age)] = slots.reclaim_stale()
    assert batch_id == "lost" and age == pytest.approx(3.5)
    assert len(slots) == 0
    assert slots.done("lost", 500, 3.5) is False, "a reclaimed batch's late report is ignored"


def test_reclaim_stale_waits_stale_factor_times_the_cost_learned_from_done() -> None:
    clock = FakeClock(start=1000.0)
    slots = Slots(clock=clock, stale_factor=4.0, stale_min_s=3.0)
    slots.sent("first", 1000)
    clock.advance(2.0)
    assert slots.done("first", 1000, 2.0)  # learns 2 s per 1000 padded tokens
    slots.sent("slow", 1000)  # expected 2 s: presumed lost after 4 x 2 = 8 s, not 3 s
    slots.sent("small", 10)  # expected 0.02 s: the 3 s minimum applies
    clock.advance(3.5)
    assert [b for b, _ in slots.reclaim_stale()] == ["small"]
    clock.advance(4.4)  # 7.9 s since sent
    assert slots.reclaim_stale() == []
    clock.advance(0.2)
    assert [b for b, _ in slots.reclaim_stale()] == ["slow"]
    assert slots.free(devices=1, batches_ahead=0) == 1


def test_a_batch_that_yields_frees_its_slot_and_is_still_done_once() -> None:
    slots = Slots(clock=lambda: 0.0)
    slots.sent("long", 100)
    assert slots.free(devices=1, batches_ahead=0) == 0
    assert slots.yielded("long") is True
    assert slots.free(devices=1, batches_ahead=0) == 1, "the device takes the next batch between its layers"
    assert slots.yielded("long") is False and slots.yielded("unknown") is False
    assert slots.done("long", 100, 0.5) is True
    assert slots.done("long", 100, 0.5) is False


def test_one_slow_lane_batch_per_device_until_done_or_forgotten() -> None:
    clock = FakeClock(start=0.0)
    slots = Slots(clock=clock.now, forget_after_s=60.0)
    assert slots.slow_free(devices=2) == 2
    slots.sent("s1", 300, lane="slow")
    slots.yielded("s1")
    assert slots.slow_free(devices=2) == 1 and slots.free(devices=2, batches_ahead=0) == 2
    slots.sent("s2", 300, lane="slow")
    assert slots.slow_free(devices=2) == 0
    slots.done("s2", 300, 0.2)
    assert slots.slow_free(devices=2) == 1
    clock.advance(61.0)
    slots.reclaim_stale()
    assert slots.slow_free(devices=2) == 2, "a device that died with s1 does not hold its place forever"
    assert not slots.background


def test_no_slow_lane_batch_for_a_device_inside_a_batch_that_yields() -> None:
    slots = Slots(clock=lambda: 0.0)
    slots.sent("first sighting", 400)
    slots.yielded("first sighting")
    assert slots.free(devices=1, batches_ahead=0) == 1, "normal batches go between its layers"
    assert slots.slow_free(devices=1) == 0, "a slow-lane batch would wait in the broker"
    slots.done("first sighting", 400, 2.0)
    assert slots.slow_free(devices=1) == 1


def test_costs_are_learned_per_model_from_what_each_batch_ran() -> None:
    slots = Slots(clock=lambda: 0.0)
    slots.sent("a", 100, model="minilm")
    slots.sent("b", 100, model="reranker")
    slots.yielded("b")
    assert slots.done("a", 100, 0.01) and slots.done("b", 100, 0.5)
    assert slots.costs_of("minilm").expected_s(100) == pytest.approx(0.01)
    assert slots.costs_of("reranker").expected_s(100) == pytest.approx(0.5)
    assert slots.costs_of("classifier").observed == 0


# --- a batch ahead, sent as its device is about to free ---------------------------------


def _learned(clock: FakeClock, seconds: float = 0.1) -> Slots:
    """Slots whose model `m` costs `seconds` a batch of 100 padded tokens."""
    slots = Slots(clock)
    costs = slots.costs_of("m")
    for _ in range(5):
        costs.observe(100, seconds)
    return slots


def test_with_nothing_outstanding_one_batch_a_device_leaves_not_the_batches_ahead_too() -> None:
    slots = _learned(FakeClock(0.0))
    assert slots.free(devices=2, batches_ahead=1) == 2


def test_a_batch_ahead_waits_until_its_device_is_predicted_free_within_the_lead() -> None:
    clock = FakeClock(0.0)
    slots = _learned(clock)
    slots.sent("running", 100, model="m", devices=1)
    assert slots.free(devices=1, batches_ahead=1) == 0
    # Predicted free at 0.1 s; the batch ahead is due lead_s (5 ms) before.
    assert slots.next_free_at(devices=1, batches_ahead=1) == pytest.approx(0.095)
    clock.advance(0.094)
    assert slots.free(devices=1, batches_ahead=1) == 0
    clock.advance(0.002)
    assert slots.free(devices=1, batches_ahead=1) == 1
    assert slots.next_free_at(devices=1, batches_ahead=1) is None  # due now, not later
    # Sent, the room is used up.
    slots.sent("ahead", 100, model="m", devices=1)
    assert slots.free(devices=1, batches_ahead=1) == 0
    assert slots.next_free_at(devices=1, batches_ahead=1) is None


def test_untimed_or_unlearned_a_batch_ahead_leaves_as_soon_as_there_is_room() -> None:
    clock = FakeClock(0.0)
    untimed = _learned(clock)
    untimed.timed = False
    untimed.sent("running", 100, model="m", devices=1)
    assert untimed.free(devices=1, batches_ahead=1) == 1
    cold = Slots(clock)  # no batch of the model has finished yet: no prediction to wait for
    cold.sent("running", 100, model="m", devices=1)
    assert cold.free(devices=1, batches_ahead=1) == 1


def test_several_devices_are_predicted_from_the_batches_in_the_order_they_were_sent() -> None:
    clock = FakeClock(0.0)
    slots = _learned(clock)
    slots.sent("a", 100, model="m", devices=2)  # device 1: 0 to 0.1
    clock.advance(0.05)
    slots.sent("b", 100, model="m", devices=2)  # device 2: 0.05 to 0.15
    assert slots.free(devices=2, batches_ahead=1) == 0
    assert slots.next_free_at(devices=2, batches_ahead=1) == pytest.approx(0.095)
    clock.advance(0.1)  # 0.15: both about to free
    assert slots.free(devices=2, batches_ahead=1) == 2


def test_the_lead_is_learned_from_batches_sent_to_a_free_device_within_bounds() -> None:
    clock = FakeClock(0.0)
    slots = _learned(clock)
    slots.sent("a", 100, model="m", devices=1, dispatched_at=500.0)
    clock.advance(0.13)
    assert slots.done("a", 100, 0.1, started_at=500.003)
    assert slots.lead_s == pytest.approx(0.003)  # the first report, as it is
    slots.sent("b", 100, model="m", devices=1, dispatched_at=600.0)
    assert slots.done("b", 100, 0.1, started_at=605.0)  # held up for seconds: only to the bound
    assert slots.lead_s == pytest.approx(0.8 * 0.003 + 0.2 * slots.lead_bounds[1])
    lead = slots.lead_s
    # Sent ahead, behind another batch: its start says nothing of the hop.
    slots.sent("c", 100, model="m", devices=1, dispatched_at=700.0)
    slots.sent("d", 100, model="m", devices=1, dispatched_at=700.0)
    assert slots.done("d", 100, 0.1, started_at=700.1)
    # A batch that yields, or a report without a start: no measure either.
    assert slots.yielded("c")
    assert slots.done("c", 100, 0.1, started_at=700.5)
    slots.sent("e", 100, model="m", devices=1, dispatched_at=800.0)
    assert slots.done("e", 100, 0.1)
    assert slots.lead_s == lead
