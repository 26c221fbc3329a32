"""The slow lane, on a fake clock: bounded, FIFO, and held back by its policy."""

from __future__ import annotations

from dynamic_batching.core.clock import FakeClock
from dynamic_batching.core.policy import BatchPolicy
from dynamic_batching.core.scheduler import Item
from dynamic_batching.core.slowlane import SlowLane


def item(i: int, *, at: float = 0.0, deadline: float | None = None) -> Item[None]:
    return Item(id=f"s{i}", tokens=40, enqueued_at=at, deadline=deadline)


def test_idle_runs_a_slow_input_only_while_nobody_else_waits() -> None:
    clock = FakeClock()
    lane: SlowLane[None] = SlowLane(clock, capacity=2)
    assert lane.add("m", item(1)) and lane.add("m", item(2)) and not lane.add("m", item(3)), "bounded"
    idle = BatchPolicy(slow_lane="idle")
    assert lane.next_batch(idle, others_waiting=True) is None
    model, batch = lane.next_batch(idle, others_waiting=False)  # type: ignore[misc]
    assert model == "m" and [i.id for i in batch.items] == ["s1"] and batch.reason == "slow lane"
    assert len(lane) == 1


def test_share_lets_the_lane_take_its_share_of_device_time_and_no_more() -> None:
    clock = FakeClock()
    lane: SlowLane[None] = SlowLane(clock, window_s=60)
    for i in range(3):
        lane.add("m", item(i))
    share = BatchPolicy(slow_lane="share", slow_lane_share=0.2)
    assert lane.next_batch(share, others_waiting=True) is not None, "no device time spent yet"
    lane.ran("slow", 1.0)
    lane.ran("normal", 3.0)
    assert lane.share() == 0.25
    assert lane.next_batch(share, others_waiting=True) is None, "over its share while others wait"
    assert lane.next_batch(share, others_waiting=False) is not None, "nobody waits: it runs"
    lane.ran("normal", 2.0)  # 1 of 6 s
    assert lane.next_batch(share, others_waiting=True) is not None
    clock.advance(61)
    assert lane.share() == 0.0, "the window forgets"


def test_inputs_past_their_deadline_leave_the_lane() -> None:
    clock = FakeClock()
    lane: SlowLane[None] = SlowLane(clock)
    lane.add("m", item(1, at=1000.0, deadline=1005.0))
    lane.add("m", item(2, at=1000.0, deadline=1050.0))
    clock.advance(10)
    assert [i.id for i in lane.expire()] == ["s1"] and len(lane) == 1
    assert lane.oldest_wait_s() == 10.0


def test_the_admin_offers_exactly_the_lane_policies_the_core_knows() -> None:
    from dynamic_batching.core.policy import SLOW_LANE_POLICIES
    from dynamic_batching.models import BatchingPolicy

    assert [c for c, _ in BatchingPolicy._meta.get_field("slow_lane").choices] == list(SLOW_LANE_POLICIES)


def test_a_cancelled_input_leaves_the_lane() -> None:
    clock = FakeClock()
    lane: SlowLane[None] = SlowLane(clock)
    a, b = item(1), item(2)
    lane.add("m", a)
    lane.add("m", b)
    assert lane.cancel(a) is True and lane.cancel(a) is False
    assert len(lane) == 1
