"""Scheduler: unit tests on a hand-driven clock, then hypothesis properties of a simulated
system (random arrivals, one simulated device whose batch time is proportional to padded
tokens).

The wait bound below capacity (aging_ms + one batch time) is tested where aging_ms is
at least max_wait_ms plus five batch times, as with the defaults. With aging_ms about
one batch long it does not hold: `test_one_batch_bound_with_short_aging` pins the
smallest counterexamples found, as strict xfails.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynamic_batching.core.policy import PRIORITIES, BatchPolicy
from dynamic_batching.core.scheduler import Batch, Item, Scheduler
from dynamic_batching.core.slowness import CostModel


class ManualClock:
    """A plain fake clock: a float the test sets, read by calling it."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(policy: BatchPolicy | None = None, t: float = 0.0) -> tuple[Scheduler[None], ManualClock]:
    clock = ManualClock(t)
    return Scheduler(policy or BatchPolicy(), clock), clock


_ids = itertools.count()


def item(tokens: int = 10, priority: str = "normal", at: float = 0.0, deadline: float | None = None) -> Item[None]:
    return Item(id=f"r{next(_ids)}", tokens=tokens, priority=priority, enqueued_at=at, deadline=deadline)


def drain(s: Scheduler[None]) -> list[Batch[None]]:
    out = []
    while len(s):
        b = s.next_batch(force=True)
        assert b is not None
        out.append(b)
    return out


# --- unit tests -----------------------------------------------------------------------


def test_high_goes_before_low_when_nobody_is_owed() -> None:
    s, _ = make(BatchPolicy(max_batch_size=1))
    low = item(priority="low", at=0.0)
    normal = item(priority="normal", at=0.0)
    high = item(priority="high", at=0.0)
    s.add_many([low, normal, high])  # low arrived first
    order = [b.items[0] for b in drain(s)]
    assert order == [high, normal, low]


def test_a_batch_is_seeded_by_the_highest_tier_then_filled_by_priority() -> None:
    s, _ = make(BatchPolicy(max_batch_size=2))
    low1, low2, high = item(priority="low"), item(priority="low"), item(priority="high")
    s.add_many([low1, low2, high])
    first = s.next_batch(force=True)
    assert first is not None and first.items == (high, low1)


def test_expire_returns_each_late_item_exactly_once() -> None:
    s, clock = make()
    a = item(deadline=1.0)
    b = item(deadline=2.0)
    c = item()
    s.add_many([a, b, c])
    assert s.expire() == []
    assert s.next_deadline() == 1.0
    clock.t = 1.5
    assert s.expire() == [a]
    assert s.expire() == []
    assert len(s) == 2
    clock.t = 2.0  # a deadline equal to now has passed
    assert s.expire() == [b]
    assert s.next_deadline() is None
    assert s.expire() == []
    batch = s.next_batch(force=True)
    assert batch is not None and batch.items == (c,)


def test_a_cancelled_item_never_runs_never_expires_and_cancels_once() -> None:
    s, clock = make()
    a, b = item(deadline=1.0, priority="high"), item()
    s.add_many([a, b])
    assert s.cancel(a) is True
    assert s.cancel(a) is False
    assert len(s) == 1 and s.depth("high") == 0
    clock.t = 5.0
    assert s.expire() == []
    assert [bt.items for bt in drain(s)] == [(b,)]
    assert s.cancel(b) is False, "already taken"


def test_a_dispatched_item_never_expires_later() -> None:
    s, clock = make()
    a = item(deadline=1.0)
    s.add(a)
    assert s.next_batch(force=True) is not None
    clock.t = 5.0
    assert s.expire() == []
    assert s.next_deadline() is None


def test_an_oversized_item_runs_alone() -> None:
    s, _ = make(BatchPolicy(max_batch_tokens=100, max_batch_size=8))
    big, small1, small2 = item(tokens=150), item(tokens=10), item(tokens=10)
    s.add_many([big, small1, small2])
    first, second = drain(s)
    assert first.items == (big,) and first.padded_tokens == 150
    assert second.items == (small1, small2) and second.padded_tokens == 20


def test_oversized_items_are_never_picked_as_batch_mates() -> None:
    s, _ = make(BatchPolicy(max_batch_tokens=100, max_batch_size=8))
    small, big = item(tokens=10), item(tokens=150)
    s.add_many([small, big])
    first, second = drain(s)
    assert first.items == (small,)
    assert second.items == (big,)


def fifo_fill(lengths: list[int], size: int) -> float:
    real = padded = 0
    for i in range(0, len(lengths), size):
        chunk = lengths[i : i + size]
        real += sum(chunk)
        padded += len(chunk) * max(chunk)
    return real / padded


LENGTH_MIX = [10, 200, 30, 180, 12, 250, 25, 190, 11, 210, 28, 170]


def packed(batches: list[Batch[None]]) -> float:
    return sum(b.real_tokens for b in batches) / sum(b.padded_tokens for b in batches)


def test_length_aware_packing_beats_fifo() -> None:
    s, _ = make(BatchPolicy(max_batch_size=4, max_batch_tokens=10_000, max_wait_ms=1000))
    s.add_many(item(tokens=n) for n in LENGTH_MIX)
    batches = []
    while (b := s.next_batch()) is not None:  # closed by the size trigger, as in service
        batches.append(b)
    batches += drain(s)  # what the size trigger left
    assert sorted(i.tokens for b in batches for i in b.items) == sorted(LENGTH_MIX)
    assert packed(batches) > fifo_fill(LENGTH_MIX, 4) + 0.1
    for b in batches:
        assert len(b) <= 4
        assert b.padded_tokens == len(b) * max(i.tokens for i in b.items)
        assert b.real_tokens == sum(i.tokens for i in b.items)


def test_a_flush_also_packs_by_length() -> None:
    s, _ = make(BatchPolicy(max_batch_size=4, max_batch_tokens=10_000, max_wait_ms=1000))
    s.add_many(item(tokens=n) for n in LENGTH_MIX)
    batches = drain(s)
    assert len(batches) == 3  # as few as the cap allows
    assert packed(batches) > fifo_fill(LENGTH_MIX, 4) + 0.1


def learned(overhead_s: float, per_token_s: float) -> CostModel:
    """A cost model that has seen batches of `overhead + padded x per_token` seconds."""
    costs = CostModel()
    for padded in (100, 400, 900, 1600, 2500, 3600):
        costs.observe(padded, overhead_s + padded * per_token_s)
    return costs


def one_batch_or_two(costs: CostModel | None) -> list[Batch[None]]:
    """Four short requests and two medium ones wait when the device frees (max_wait 0)."""
    s = Scheduler(BatchPolicy(max_batch_size=32, max_batch_tokens=8192), ManualClock(), costs=costs)
    s.add_many([item(tokens=12) for _ in range(4)] + [item(tokens=70) for _ in range(2)])
    batches = []
    while (b := s.next_batch()) is not None:
        batches.append(b)
    return batches


def test_where_a_batch_costs_more_than_its_padding_short_and_medium_texts_share_one() -> None:
    # A GPU: 5 ms a batch, 5 us a padded token. Together: 5 + 6 x 70 x 0.005 = 7.1 ms;
    # apart: 5 + 0.24 and 5 + 0.7 = 10.94 ms.
    [batch] = one_batch_or_two(learned(0.005, 0.000005))
    assert sorted(i.tokens for i in batch.items) == [12, 12, 12, 12, 70, 70]
    assert batch.padded_tokens == 6 * 70


def test_where_padding_costs_more_than_a_batch_they_stay_apart() -> None:
    # A CPU: 5 ms a batch, 0.1 ms a padded token: 4 x 58 padded tokens cost 23 ms > 5.
    batches = one_batch_or_two(learned(0.005, 0.0001))
    assert [sorted(i.tokens for i in b.items) for b in batches] == [[12] * 4, [70, 70]]


def test_packing_is_by_length_alone_until_the_cost_is_known() -> None:
    assert len(one_batch_or_two(None)) == 2
    unwarmed = CostModel()
    unwarmed.observe(100, 0.0055)
    assert len(one_batch_or_two(unwarmed)) == 2


def test_a_lone_request_takes_a_longer_one_along_when_that_costs_less_than_two_batches() -> None:
    # The CPU above: 12 and 40 tokens apart cost 5 + 1.2 and 5 + 4 ms; together 5 + 8 ms.
    # The length spread alone (2x) would send them apart.
    s = Scheduler(BatchPolicy(), ManualClock(), costs=learned(0.005, 0.0001))
    s.add_many([item(tokens=12), item(tokens=40)])
    batch = s.next_batch()
    assert batch is not None and [i.tokens for i in batch.items] == [12, 40]
    s, _ = make()
    s.add_many([item(tokens=12), item(tokens=40)])
    batch = s.next_batch()
    assert batch is not None and [i.tokens for i in batch.items] == [12]


def test_each_batch_is_seeded_by_its_tiers_oldest() -> None:
    s, _ = make(BatchPolicy(max_batch_size=2, max_batch_tokens=10_000))
    items = [item(tokens=n) for n in (300, 5, 5, 5, 5)]
    s.add_many(items)
    first = s.next_batch(force=True)
    assert first is not None and first.items[0] is items[0]


def test_set_policy_takes_effect_at_the_next_batch() -> None:
    s, clock = make(BatchPolicy(max_batch_size=4, max_wait_ms=1000))
    s.add_many(item() for _ in range(10))
    b1 = s.next_batch()
    assert b1 is not None and len(b1) == 4 and b1.reason == "size"
    s.set_policy(BatchPolicy(max_batch_size=2, max_wait_ms=1000))
    b2 = s.next_batch()
    assert b2 is not None and len(b2) == 2
    assert len(s) == 4  # nothing waiting was dropped
    s.set_policy(BatchPolicy(max_batch_size=8, max_wait_ms=1000))
    assert s.next_batch() is None  # 4 < 8, and nobody has waited a second
    clock.t = 1.0
    b3 = s.next_batch()
    assert b3 is not None and len(b3) == 4 and b3.reason == "wait"


def test_triggers() -> None:
    s, clock = make(BatchPolicy(max_batch_size=3, max_batch_tokens=100, max_wait_ms=10))
    assert s.trigger() is None and s.next_batch() is None and s.next_wakeup() is None
    s.add(item(tokens=10, at=0.0))
    assert s.trigger() is None
    assert s.next_wakeup() == pytest.approx(0.010)
    clock.t = 0.010
    assert s.trigger() == "wait"
    clock.t = 0.0
    s.add(item(tokens=95, at=0.0))
    assert s.trigger() == "tokens"
    s.add(item(tokens=1, at=0.0))
    assert s.trigger() == "size"
    s.flush()
    assert s.trigger() == "flush"
    b = s.next_batch()
    assert b is not None and b.reason == "flush"
    assert s.trigger() != "flush"  # a flush closes one batch


def test_wait_trigger_agrees_with_next_wakeup_in_floating_point() -> None:
    for start in (0.0, 1000.0, 12345.678, 1e6 + 0.1):
        for wait_ms in (1, 3, 10, 33.3):
            s, clock = make(BatchPolicy(max_batch_size=8, max_wait_ms=wait_ms), t=start)
            s.add(item(at=start))
            wake = s.next_wakeup()
            assert wake is not None
            clock.t = wake
            assert s.trigger() == "wait", (start, wait_ms)


def test_add_rejects_bad_items() -> None:
    s, _ = make()
    with pytest.raises(ValueError, match="priority"):
        s.add(item(priority="urgent"))
    with pytest.raises(ValueError, match="token"):
        s.add(item(tokens=0))
    assert len(s) == 0


def test_an_aged_low_request_goes_first() -> None:
    s, clock = make(BatchPolicy(max_batch_size=1, aging_ms=100))
    old_low = item(priority="low", at=0.0)
    s.add(old_low)
    clock.t = 0.2
    s.add(item(priority="high", at=0.2))
    b = s.next_batch(force=True)
    assert b is not None and b.items == (old_low,)


def test_a_nearly_due_request_goes_first() -> None:
    s, clock = make(BatchPolicy(max_batch_size=1))
    high = item(priority="high", at=0.0)
    due_low = item(priority="low", at=0.0, deadline=0.04)
    s.add_many([high, due_low])
    b = s.next_batch(force=True)
    assert b is not None and b.items == (due_low,)


# --- the simulated system -------------------------------------------------------------

SECONDS_PER_TOKEN = 1e-5  # the simulated device computes 100k padded tokens a second


def batch_time(b: Batch[None]) -> float:
    return b.padded_tokens * SECONDS_PER_TOKEN


@dataclass
class Arrival:
    at: float
    tokens: int
    priority: str
    deadline_s: float | None


@dataclass
class Outcome:
    batches: list[tuple[float, Batch[None]]] = field(default_factory=list)
    dispatched: dict[str, float] = field(default_factory=dict)  # id -> dispatch time
    expired: dict[str, float] = field(default_factory=dict)  # id -> expiry time
    items: dict[str, Item[None]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def simulate(
    policy: BatchPolicy,
    arrivals: Iterable[Arrival],
    *,
    policy_changes: Iterable[tuple[float, BatchPolicy]] = (),
    max_steps: int = 200_000,
) -> Outcome:
    """Run arrivals through a Scheduler and one device slot, in event order."""
    clock = ManualClock(0.0)
    s: Scheduler[None] = Scheduler(policy, clock)
    pending = sorted(arrivals, key=lambda a: a.at)
    changes = sorted(policy_changes, key=lambda c: c[0])
    out = Outcome()
    busy_until = 0.0
    ai = ci = 0
    for _ in range(max_steps):
        now = clock.t
        while ci < len(changes) and changes[ci][0] <= now:
            s.set_policy(changes[ci][1])
            ci += 1
        while ai < len(pending) and pending[ai].at <= now:
            a = pending[ai]
            it = Item(
                id=f"a{ai}",
                tokens=a.tokens,
                priority=a.priority,
                enqueued_at=now,
                deadline=None if a.deadline_s is None else now + a.deadline_s,
            )
            out.items[it.id] = it
            s.add(it)
            ai += 1
        for it in s.expire():
            if it.id in out.expired or it.id in out.dispatched:
                out.errors.append(f"{it.id} left twice")
            out.expired[it.id] = now
        if now >= busy_until:
            b = s.next_batch()
            if b is not None:
                out.batches.append((now, b))
                for it in b.items:
                    if it.id in out.expired or it.id in out.dispatched:
                        out.errors.append(f"{it.id} left twice")
                    out.dispatched[it.id] = now
                busy_until = now + batch_time(b)
                continue  # the slot is taken; look again at the same instant
        times = []
        if ai < len(pending):
            times.append(pending[ai].at)
        if ci < len(changes):
            times.append(changes[ci][0])
        if now < busy_until:
            times.append(busy_until)
        elif (wake := s.next_wakeup()) is not None:
            times.append(wake)
        if (due := s.next_deadline()) is not None:
            times.append(due)
        if not times:
            break
        nxt = min(times)
        if nxt <= now:
            out.errors.append(f"no progress at t={now}: next event {nxt}")
            break
        clock.t = nxt
    else:
        out.errors.append("simulation did not finish")
    return out


tiers = st.sampled_from(PRIORITIES)
#: Request lengths 1..300, with the short and long ends (the mixes that pad) drawn often.
token_counts = st.integers(1, 300) | st.integers(1, 10) | st.integers(290, 300)


@st.composite
def any_arrivals(draw: st.DrawFn) -> list[Arrival]:
    """Up to 100 requests over a horizon from 5 ms (heavy overload) to 0.5 s (light)."""
    horizon = draw(st.sampled_from([0.005, 0.05, 0.5]))
    request = st.tuples(st.floats(0.0, 1.0), token_counts, tiers, st.none() | st.floats(0.0005, 0.2))
    raw = draw(st.lists(request, max_size=100) | st.lists(request, min_size=40, max_size=100))
    return [Arrival(frac * horizon, tokens, prio, deadline) for frac, tokens, prio, deadline in raw]


@st.composite
def policies(draw: st.DrawFn, min_tokens: int = 1) -> BatchPolicy:
    aging = draw(st.sampled_from([1.0, 2.0, 5.0, 20.0]) | st.floats(1.0, 2000.0))
    return BatchPolicy(
        max_batch_size=draw(st.integers(1, 32)),
        max_batch_tokens=draw(st.integers(min_tokens, 4096)),
        max_wait_ms=draw(st.floats(0.0, min(aging, 50.0))),
        aging_ms=aging,
        weights=draw(st.fixed_dictionaries({p: st.integers(1, 10) for p in PRIORITIES})),
    )


def check_batch_limits(policy: BatchPolicy, b: Batch[None]) -> None:
    longest = max(i.tokens for i in b.items)
    assert b.padded_tokens == len(b) * longest
    assert b.real_tokens == sum(i.tokens for i in b.items)
    if len(b) == 1 and longest > policy.max_batch_tokens:
        return  # an oversized request alone
    assert len(b) <= policy.max_batch_size
    assert b.padded_tokens <= policy.max_batch_tokens
    assert all(i.tokens <= policy.max_batch_tokens for i in b.items)


@settings(deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=policies(),
    arrivals=any_arrivals(),
    change=st.none() | st.tuples(st.floats(0.0, 0.05), policies()),
)
def test_simulated_batches_respect_limits_and_lose_nothing(
    policy: BatchPolicy, arrivals: list[Arrival], change: tuple[float, BatchPolicy] | None
) -> None:
    out = simulate(policy, arrivals, policy_changes=[change] if change else [])
    assert out.errors == []
    # Every request left exactly once: dispatched or expired, never both, none lost.
    assert len(out.items) == len(arrivals)
    assert out.dispatched.keys().isdisjoint(out.expired.keys())
    assert out.dispatched.keys() | out.expired.keys() == out.items.keys()
    assert sum(len(b) for _, b in out.batches) == len(out.dispatched)
    for at, b in out.batches:
        active = policy if change is None or at < change[0] else change[1]
        check_batch_limits(active, b)
        for it in b.items:
            # Never run late: a request is dispatched strictly before its deadline.
            assert it.deadline is None or at < it.deadline
    for rid, at in out.expired.items():
        deadline = out.items[rid].deadline
        assert deadline is not None and deadline == at  # failed as soon as it was due


def overload_shares(
    policy: BatchPolicy, seed: int, backlog: int, *, min_batches: int, min_tokens: int
) -> dict[str, float]:
    """Serve batches back to back while every tier always has at least `backlog`
    requests waiting (topped up as they are served), until at least `min_batches`
    batches and `min_tokens` real tokens have been served; return each tier's share of
    the real tokens served."""
    rng = random.Random(seed)
    clock = ManualClock(0.0)
    s: Scheduler[None] = Scheduler(policy, clock)
    ids = itertools.count()
    served = dict.fromkeys(PRIORITIES, 0)
    batches = 0
    while batches < min_batches or sum(served.values()) < min_tokens:
        for p in PRIORITIES:
            while s.depth(p) < backlog:
                s.add(Item(id=str(next(ids)), tokens=rng.randint(1, 300), priority=p, enqueued_at=clock.t))
        b = s.next_batch()
        assert b is not None
        check_batch_limits(policy, b)
        for it in b.items:
            served[it.priority] += it.tokens
        batches += 1
        clock.t += batch_time(b)
    total = sum(served.values())
    return {p: served[p] / total for p in PRIORITIES}


@st.composite
def overload_cases(draw: st.DrawFn) -> tuple[BatchPolicy, int]:
    size = draw(st.integers(1, 32))
    policy = BatchPolicy(
        max_batch_size=size,
        max_batch_tokens=draw(st.integers(300, 4096)),
        max_wait_ms=0,
        # Short aging makes every backlogged request "aged": the shares must hold anyway.
        aging_ms=draw(st.sampled_from([1.0, 20.0, 2000.0])),
        weights={"high": 6, "normal": 3, "low": 1},
    )
    # Backlogged means more waiting than one batch can take, so that serving a tier
    # never empties it: a tier that empties forfeits what it was owed, by design.
    backlog = draw(st.integers(size + 1, size + 1) | st.integers(size + 1, 1000))
    return policy, backlog


@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(case=overload_cases(), seed=st.integers(0, 2**32 - 1))
def test_shares_under_sustained_overload(case: tuple[BatchPolicy, int], seed: int) -> None:
    policy, backlog = case
    # Credit is bounded by a few batch budgets, so the shares converge as O(budget /
    # tokens served): "enough batches" is at least 200 and 100 budgets' worth of tokens.
    shares = overload_shares(policy, seed, backlog, min_batches=200, min_tokens=100 * policy.max_batch_tokens)
    for p in PRIORITIES:
        assert shares[p] == pytest.approx(policy.share(p), abs=0.03), shares


def test_a_tier_served_alone_is_not_in_debt_when_overload_starts() -> None:
    """Regression: serving a tier while nobody else waited used to cost it credit, so
    when the other tiers arrived it got nothing for the first dozen batches."""
    policy = BatchPolicy(max_batch_size=16, max_batch_tokens=2048, max_wait_ms=0)
    rng = random.Random(0)
    clock = ManualClock(0.0)
    s: Scheduler[None] = Scheduler(policy, clock)
    ids = itertools.count()

    def add(prio: str) -> None:
        s.add(Item(id=str(next(ids)), tokens=rng.randint(1, 300), priority=prio, enqueued_at=clock.t))

    for _ in range(50):  # light load: "low" alone, one request at a time
        add("low")
        b = s.next_batch()
        assert b is not None
        clock.t += 2 * batch_time(b)
    served = dict.fromkeys(PRIORITIES, 0)
    for _ in range(10):  # then everybody, backlogged
        for prio in PRIORITIES:
            while s.depth(prio) < 32:
                add(prio)
        b = s.next_batch()
        assert b is not None
        for it in b.items:
            served[it.priority] += it.tokens
        clock.t += batch_time(b)
    share_low = served["low"] / sum(served.values())
    assert share_low == pytest.approx(policy.share("low"), abs=0.03)


LOAD = 0.7  # of the simulated device's throughput


@st.composite
def light_arrivals(draw: st.DrawFn) -> list[Arrival]:
    """Arrivals that never run ahead of LOAD x capacity: each request comes no sooner
    after the one before than the device needs, at LOAD, for that one's tokens."""
    # Spare gaps of up to `slack` seconds between requests; with none, exactly LOAD.
    slack = draw(st.sampled_from([0.0, 0.001, 0.01]))
    raw = draw(
        st.lists(
            st.tuples(
                st.just(0.0) | st.floats(0.0, slack),
                token_counts,
                tiers,
                st.none() | st.floats(0.001, 0.5),
            ),
            min_size=30,
            max_size=100,
        )
    )
    rate = LOAD / SECONDS_PER_TOKEN
    out: list[Arrival] = []
    t = 0.0
    prev = 0
    for gap, tokens, prio, deadline in raw:
        t += max(gap, prev / rate)
        out.append(Arrival(t, tokens, prio, deadline))
        prev = tokens
    return out


def max_batch_time(policy: BatchPolicy) -> float:
    return policy.max_batch_tokens * SECONDS_PER_TOKEN


def worst_wait(policy: BatchPolicy, arrivals: list[Arrival]) -> tuple[float, Item[None] | None]:
    out = simulate(policy, arrivals)
    assert out.errors == []
    worst, who = 0.0, None
    for rid, at in out.dispatched.items():
        it = out.items[rid]
        if at - it.enqueued_at > worst:
            worst, who = at - it.enqueued_at, it
    return worst, who


@st.composite
def long_aging_policies(draw: st.DrawFn) -> BatchPolicy:
    """Policies whose aging_ms is at least max_wait_ms plus five of the longest batches,
    the regime the defaults are in (2 s against batches of milliseconds)."""
    budget = draw(st.integers(300, 4096))
    max_wait = draw(st.sampled_from([0.0, 50.0]) | st.floats(0.0, 50.0))
    floor_ms = max_wait + 5 * budget * SECONDS_PER_TOKEN * 1000
    return BatchPolicy(
        max_batch_size=draw(st.integers(1, 32)),
        max_batch_tokens=budget,
        max_wait_ms=max_wait,
        aging_ms=draw(st.just(floor_ms) | st.floats(floor_ms, max(floor_ms, 2000.0))),
        weights=draw(st.fixed_dictionaries({p: st.integers(1, 10) for p in PRIORITIES})),
    )


@settings(deadline=None, max_examples=80, suppress_health_check=[HealthCheck.too_slow])
@given(policy=long_aging_policies(), arrivals=light_arrivals())
def test_waits_are_bounded_below_capacity(policy: BatchPolicy, arrivals: list[Arrival]) -> None:
    worst, who = worst_wait(policy, arrivals)
    assert worst <= policy.aging_s + max_batch_time(policy) + 1e-9, (who, worst)


# The same bound does NOT hold when aging_ms is as short as a batch or two. Each case
# below is the smallest the search found; both follow from rules the scheduler documents.
SHORT_AGING_COUNTEREXAMPLES = {
    # At 2.191 ms the 300-token high request trips the token trigger, 0.924 ms after
    # low's 2-token one came (not aged yet), and with nobody owed it seeds a 3 ms batch
    # nothing else fits. Then normal and low are owed alike, priority breaks the tie,
    # normal's 10-token request seeds, and low's may not ride (5x padding is past
    # rider_spread), so it leaves one 0.1 ms batch later: 4.024 ms > 1 ms + 3 ms.
    "an equally owed higher tier goes first": (
        BatchPolicy(max_batch_size=8, max_batch_tokens=300, max_wait_ms=1.0, aging_ms=1.0),
        [
            Arrival(0.001267, 2, "low", None),
            Arrival(0.002034, 10, "normal", None),
            Arrival(0.002176, 1, "normal", None),
            Arrival(0.002191, 300, "high", None),
            Arrival(0.006476, 10, "normal", None),
            Arrival(0.008384, 10, "normal", None),
            Arrival(0.008527, 10, "normal", None),
        ],
    ),
    # Requests due within urgent_margin_s (50 ms) go before everything, so two of them
    # (a 30 ms deadline is "near" from the moment it arrives) pass the aged 10-token
    # request one after the other: 5 ms > 1 ms + 3 ms.
    "near-deadline requests rank above an aged one": (
        BatchPolicy(max_batch_size=4, max_batch_tokens=300, max_wait_ms=1.0, aging_ms=1.0),
        [
            Arrival(0.0, 10, "high", None),
            Arrival(0.000143, 100, "high", 0.03),
            Arrival(0.001571, 300, "low", 0.03),
        ],
    ),
}


@pytest.mark.xfail(
    strict=True,
    reason="known limit: with aging_ms about one batch long, owed tiers and near-deadline "
    "requests outrank aged ones, so a wait can pass aging_ms + one batch time",
)
@pytest.mark.parametrize("case", sorted(SHORT_AGING_COUNTEREXAMPLES))
def test_one_batch_bound_with_short_aging(case: str) -> None:
    policy, arrivals = SHORT_AGING_COUNTEREXAMPLES[case]
    worst, who = worst_wait(policy, arrivals)
    assert worst <= policy.aging_s + max_batch_time(policy) + 1e-9, (who, worst)


# --- holding a free device for a fuller batch (issue 40, item 4) ------------------------


def _fixed_cost_device(fixed_s: float = 0.1) -> CostModel:
    """A device whose batch costs `fixed_s` plus 0.1 ms a padded token."""
    costs = CostModel()
    for padded in (10, 100, 400, 40, 200, 20):
        costs.observe(padded, fixed_s + padded * 1e-4)
    return costs


def _busy(s: Scheduler[None], clock: ManualClock, arrivals: int) -> None:
    """`arrivals` requests over the last 0.4 s, all gone into a batch already."""
    for i in range(arrivals):
        clock.t = i * 0.4 / arrivals
        s.add(item(at=clock.t))
    while len(s):
        assert s.next_batch(force=True) is not None


def test_a_lone_caller_goes_at_once_even_on_a_device_with_a_large_fixed_cost() -> None:
    s, clock = make()
    s.costs = _fixed_cost_device()
    s.add(item(at=clock.t))
    assert s.trigger() == "wait"


def test_while_requests_arrive_a_batch_waits_to_fill_as_long_as_the_wait_pays() -> None:
    s, clock = make()
    s.costs = _fixed_cost_device(0.1)
    _busy(s, clock, 20)  # 40 a second: 4 arrive during one fixed cost
    clock.t = 0.4
    s.add(item(at=clock.t))
    assert s.trigger() is None, "one request went alone while four more were due meanwhile"
    assert s.next_wakeup() == pytest.approx(0.5)  # held one fixed cost at most
    for k in range(4):
        clock.t = 0.41 + k * 0.01
        s.add(item(at=clock.t))
    # Five waiting, and the rate now says five more per fixed cost: the wait stops paying.
    assert s.trigger() == "wait"
    batch = s.next_batch()
    assert batch is not None and len(batch) == 5


def test_a_held_batch_leaves_after_one_fixed_cost_whatever_arrives() -> None:
    s, clock = make()
    s.costs = _fixed_cost_device(0.1)
    _busy(s, clock, 40)
    clock.t = 0.4
    s.add(item(at=clock.t))
    assert s.trigger() is None
    clock.t = 0.5
    assert s.trigger() == "wait"


def test_no_hold_for_a_request_near_its_deadline_nor_without_a_fixed_cost() -> None:
    s, clock = make()
    s.costs = _fixed_cost_device(0.1)
    _busy(s, clock, 40)
    clock.t = 0.4
    s.add(item(at=clock.t, deadline=0.42))  # within the urgent margin
    assert s.trigger() == "wait"
    t, clock2 = make()
    per_token_only = CostModel()
    for padded in (10, 100, 400, 40, 200, 20):
        per_token_only.observe(padded, padded * 1e-4)
    t.costs = per_token_only
    _busy(t, clock2, 40)
    clock2.t = 0.4
    t.add(item(at=clock2.t))
    assert t.trigger() == "wait"
