"""Which waiting requests go into the next batch, and when.

A pure state machine in the manner of vLLM's scheduler: it is told what arrived
(`add`), asked for a plan (`next_batch`) whenever a device slot is free, and never
touches a thread, a socket or the wall clock. The collector drives it from one thread;
`DynamicBatcher` drives it under a lock. Both give it a clock, so tests run on a fake one.

How a batch is built (docs/scheduling.md says it for operators, with measurements):

1. *Who goes next.* Tiers are ranked: first those *owed* tokens (served less than their
   share, weight / sum of weights, while backlogged), furthest behind first; then tiers
   whose oldest request has waited `aging_ms` (*aged*), oldest first; then the rest by
   priority. So "high" gets strict priority while it stays within its share, yet "low"
   can never be starved below its: strict priority alone (kombu on Redis, Triton, vLLM)
   starves it, and plain weighted fair queuing makes "high" wait behind everybody's turn.
   A request whose deadline is near goes before all of them.
2. *The seed.* The batch starts with the top tier's oldest request, and belongs to that
   tier: its requests come first, up to `own_spread` times longer or shorter than each
   other, so a tier's waiting requests of one size class leave together.
3. *Riders.* The other tiers, in rank order, fill the places left with requests that pad
   by at most `rider_spread`. Aging does not let a tier jump the line once it is a batch
   budget over its share (under overload every request of a backlogged tier is "aged",
   and age alone would override the shares); such a tier only joins batches it seeds.
4. *No starvation inside a tier.* Packing picks by length, so within a tier it only picks
   among requests at most `aging_ms` younger than the tier's oldest: no request is ever
   overtaken by one more than `aging_ms` fresher, and every batch a tier seeds starts
   with its oldest.
5. *Padding against a batch's fixed cost.* Given what a batch of this model costs on the
   devices (a `CostModel` learned from batches that ran: a fixed cost per batch and a
   cost per padded token), the spreads widen to any request whose padding costs less
   than a batch of its own and makes the batch's device time more useful
   (`_cheap_window`). On a GPU, where a batch's fixed cost dwarfs its padding, short and
   medium texts then share a batch; on a CPU, where padding costs what it computes,
   they stay about as the spreads keep them.

6. *A fuller batch, when the device's fixed cost pays for the wait.* With that cost
   model, a batch about to leave with fewer requests than arrive during one fixed cost
   waits up to one fixed cost more for them (`_wait_s`): on a device where a batch of 3
   costs nearly what a batch of 32 does, taking whatever is waiting wastes it. A lone
   caller, or a request near its deadline, never waits for it.

A batch never exceeds `max_batch_size` requests or `max_batch_tokens` *padded* tokens
(count x longest), except a lone oversized request that the edge accepted to run alone.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from .budget import fits
from .policy import PRIORITIES, BatchPolicy
from .slowness import CostModel

P = TypeVar("P")

_PENDING, _TAKEN, _EXPIRED = 0, 1, 2


class ArrivalRate:
    """Requests a second over the last `window_s` of a clock."""

    def __init__(self, clock: Callable[[], float], window_s: float = 0.5) -> None:
        self._clock = clock
        self.window_s = window_s
        self._times: deque[float] = deque()

    def add(self) -> None:
        now = self._clock()
        self._times.append(now)
        self._forget(now)

    def per_s(self) -> float:
        self._forget(self._clock())
        return len(self._times) / self.window_s

    def _forget(self, now: float) -> None:
        while self._times and self._times[0] <= now - self.window_s:
            self._times.popleft()


@dataclass(eq=False, slots=True)
class Item(Generic[P]):
    """One waiting request. Times are readings of the scheduler's clock."""

    id: str
    tokens: int
    priority: str = "normal"
    enqueued_at: float = 0.0
    deadline: float | None = None
    payload: P | None = None
    #: Runs in a batch of its own (an oversized request under the run_alone policy).
    alone: bool = False
    state: int = field(default=_PENDING, repr=False)


@dataclass(frozen=True, slots=True)
class Batch(Generic[P]):
    items: tuple[Item[P], ...]
    padded_tokens: int
    real_tokens: int
    reason: str
    formed_at: float

    def __len__(self) -> int:
        return len(self.items)

    @property
    def fill_ratio(self) -> float:
        """Real tokens over padded tokens: 1.0 means no padding was computed."""
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0


class _Tier(Generic[P]):
    """One priority's waiting requests, indexed by arrival and by length."""

    __slots__ = ("arrivals", "by_length", "count", "lengths", "tokens")

    def __init__(self) -> None:
        self.arrivals: deque[Item[P]] = deque()
        self.by_length: dict[int, deque[Item[P]]] = {}
        self.lengths: list[int] = []  # sorted keys of by_length
        self.count = 0
        self.tokens = 0

    def add(self, item: Item[P]) -> None:
        self.arrivals.append(item)
        if item.alone:
            # Never a batch-mate: reachable only as the seed of its own batch.
            self.count += 1
            self.tokens += item.tokens
            return
        bucket = self.by_length.get(item.tokens)
        if bucket is None:
            bucket = self.by_length[item.tokens] = deque()
            bisect.insort(self.lengths, item.tokens)
        bucket.append(item)
        self.count += 1
        self.tokens += item.tokens

    def discard(self, item: Item[P], state: int) -> None:
        # Lazy deletion: the item stays in its deques until it reaches a head.
        item.state = state
        self.count -= 1
        self.tokens -= item.tokens

    def oldest(self) -> Item[P] | None:
        while self.arrivals and self.arrivals[0].state != _PENDING:
            self.arrivals.popleft()
        return self.arrivals[0] if self.arrivals else None

    def head_of_length(self, length: int) -> Item[P] | None:
        bucket = self.by_length[length]
        while bucket and bucket[0].state != _PENDING:
            bucket.popleft()
        if bucket:
            return bucket[0]
        del self.by_length[length]
        self.lengths.pop(bisect.bisect_left(self.lengths, length))
        return None

    def best_fit(self, padded_len: int, size: int, budget: int, *, lo: int, hi: int, newest: float) -> Item[P] | None:
        """The request that adds the least padding to a batch of `size` requests padded
        to `padded_len` without taking it past `budget`, among those of length `lo` to
        `hi` enqueued no later than `newest`; the oldest among equals."""
        if not fits(size=size, padded_len=padded_len, tokens=0, budget=budget):
            return None
        best: Item[P] | None = None
        best_cost = 0
        start = bisect.bisect_left(self.lengths, lo)
        stop = bisect.bisect_right(self.lengths, hi)
        # A slice is a copy: head_of_length may delete keys from self.lengths.
        for length in self.lengths[start:stop]:
            if not fits(size=size, padded_len=padded_len, tokens=length, budget=budget):
                break  # lengths ascend, so no longer one fits either
            head = self.head_of_length(length)
            if head is None or head.enqueued_at > newest:
                continue  # a bucket's head is its oldest, so nothing in it qualifies
            # A shorter request pads itself; a longer one pads everybody already in.
            cost = padded_len - length if length <= padded_len else size * (length - padded_len)
            if best is None or cost < best_cost or (cost == best_cost and head.enqueued_at < best.enqueued_at):
                best, best_cost = head, cost
        return best


class Scheduler(Generic[P]):
    #: Requests of the batch's own tier (the seed's) may differ in length up to this
    #: factor. Wider lets more of the tier leave at once (lower latency for it), at the
    #: cost of padding: 2.0 keeps 10-20 or 50-90 token requests in one batch.
    own_spread: float = 2.0
    #: Requests of other tiers join only if padded to at most this factor of their
    #: length: they fill places cheaply, so the batch's fill ratio stays high.
    rider_spread: float = 1.25

    def __init__(
        self,
        policy: BatchPolicy,
        clock: Callable[[], float],
        *,
        urgent_margin_s: float = 0.05,
        costs: CostModel | None = None,
    ) -> None:
        self._policy = policy
        self._clock = clock
        #: What a batch costs, as learned from the device (the caller feeds it); None, or
        #: one not yet warmed up, packs by length alone.
        self.costs = costs
        #: A request this close to its deadline is urgent: it goes before every tier and
        #: joins whatever batch is leaving, whatever its length.
        self.urgent_margin_s = urgent_margin_s
        self._tiers: dict[str, _Tier[P]] = {p: _Tier() for p in PRIORITIES}
        self._credit: dict[str, float] = dict.fromkeys(PRIORITIES, 0.0)
        self._deadlines: list[tuple[float, int, Item[P]]] = []
        self._seq = itertools.count()
        self._flush_requested = False
        #: Tokens served per tier since start: the fairness the metrics report.
        self.served_tokens: dict[str, int] = dict.fromkeys(PRIORITIES, 0)
        #: How fast requests arrive now, for holding a batch to fill (`_wait_s`).
        self.arrivals = ArrivalRate(clock)

    # --- what arrives -------------------------------------------------------------

    @property
    def policy(self) -> BatchPolicy:
        return self._policy

    def set_policy(self, policy: BatchPolicy) -> None:
        """Takes effect from the next batch; nothing waiting is dropped."""
        self._policy = policy

    def add(self, item: Item[P]) -> None:
        if item.priority not in self._tiers:
            raise ValueError(f"unknown priority {item.priority!r}; choose one of {PRIORITIES}")
        if item.tokens < 1:
            raise ValueError(f"a request costs at least 1 token, got {item.tokens}")
        self._tiers[item.priority].add(item)
        self.arrivals.add()
        if item.deadline is not None:
            heapq.heappush(self._deadlines, (item.deadline, next(self._seq), item))

    def add_many(self, items: Iterable[Item[P]]) -> None:
        for item in items:
            self.add(item)

    def flush(self) -> None:
        """Close the next batch at once, whatever its size."""
        self._flush_requested = True

    def __len__(self) -> int:
        return sum(t.count for t in self._tiers.values())

    def depth(self, priority: str) -> int:
        return self._tiers[priority].count

    def waiting_tokens(self) -> int:
        return sum(t.tokens for t in self._tiers.values())

    def oldest(self) -> Item[P] | None:
        heads = [h for t in self._tiers.values() if (h := t.oldest()) is not None]
        return min(heads, key=lambda h: h.enqueued_at, default=None)

    # --- what leaves without running ----------------------------------------------

    def expire(self) -> list[Item[P]]:
        """Remove and return every request whose deadline has passed: they must fail
        with DeadlineExceeded, never run late."""
        now = self._clock()
        expired: list[Item[P]] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, item = heapq.heappop(self._deadlines)
            if item.state == _PENDING:
                self._tiers[item.priority].discard(item, _EXPIRED)
                self._on_maybe_empty(item.priority)
                expired.append(item)
        return expired

    def cancel(self, item: Item[P]) -> bool:
        """Take out a waiting request that must never run (its caller revoked it).
        False if it has left already (taken into a batch, or expired)."""
        if item.state != _PENDING:
            return False
        self._tiers[item.priority].discard(item, _EXPIRED)
        self._on_maybe_empty(item.priority)
        return True

    # --- when and what to dispatch ------------------------------------------------

    def trigger(self) -> str | None:
        """Why a batch should close now, or None to keep waiting."""
        count = len(self)
        if count == 0:
            return None
        p = self._policy
        if self._flush_requested:
            return "flush"
        if count >= p.max_batch_size:
            return "size"
        if self.waiting_tokens() >= p.max_batch_tokens:
            return "tokens"
        oldest = self.oldest()
        assert oldest is not None
        # Compared as `next_wakeup` computes it: `now - enqueued_at >= max_wait_s` can be
        # False at exactly that reading (float rounding), so a waiter would wake to nothing.
        if self._clock() >= oldest.enqueued_at + self._wait_s(count):
            return "wait"
        return None

    def _wait_s(self, count: int) -> float:
        """How long the oldest request waits for others: the policy's max_wait, or, on a
        device whose fixed cost per batch dominates, up to one fixed cost more while
        requests are arriving fast enough to fill the batch meanwhile.

        Why: sending n requests now runs at n / (F + n v) a second (F the batch's fixed
        cost, v each request's); waiting a little longer while requests arrive at rate r
        raises that as long as r F > n. So the batch waits while fewer than r F requests
        wait, and never longer than F past max_wait (the latency it may cost is one fixed
        cost): a lone caller (r F < 1) goes at once, and so does a near-deadline request."""
        p = self._policy
        costs = self.costs
        if costs is None or not costs.warm or count >= p.max_batch_size or self._due(self._clock()) is not None:
            return p.max_wait_s
        line = costs.line()
        fixed = line[0] if line is not None else 0.0
        if fixed <= 0 or count >= self.arrivals.per_s() * fixed:
            return p.max_wait_s
        return p.max_wait_s + fixed

    def next_wakeup(self) -> float | None:
        """The clock reading at which `trigger` or `expire` next has news, if any."""
        times: list[float] = []
        oldest = self.oldest()
        if oldest is not None:
            times.append(oldest.enqueued_at + self._wait_s(len(self)))
        deadline = self.next_deadline()
        if deadline is not None:
            times.append(deadline)
        return min(times, default=None)

    def next_deadline(self) -> float | None:
        """The earliest deadline among waiting requests, if any."""
        due = self._earliest_deadline()
        return None if due is None else due.deadline

    def next_batch(self, *, force: bool = False) -> Batch[P] | None:
        """Close and return a batch if one is due (or `force`), else None.

        Call it only when a device slot is free: a batch closed early just waits in a
        queue, and the requests it holds could have joined a fuller one.
        """
        reason = "flush" if force else self.trigger()
        if reason is None or len(self) == 0:
            return None
        self._flush_requested = False
        p = self._policy
        now = self._clock()

        seed = self._due(now) or self._tiers[self._rank(now)[0]].oldest()
        assert seed is not None
        chosen = [seed]
        self._take(seed)
        padded_len = shortest = real = seed.tokens
        if not seed.alone and seed.tokens <= p.max_batch_tokens:
            while len(chosen) < p.max_batch_size:
                item = self._due(now, padded_len, len(chosen))
                if item is None:
                    item = self._pick(now, seed.priority, padded_len, shortest, len(chosen), real, reason == "flush")
                if item is None:
                    break
                chosen.append(item)
                self._take(item)
                padded_len = max(padded_len, item.tokens)
                shortest = min(shortest, item.tokens)
                real += item.tokens
        return Batch(tuple(chosen), len(chosen) * padded_len, real, reason, now)

    # --- internals ----------------------------------------------------------------

    def _due(self, now: float, padded_len: int = 0, size: int = 0) -> Item[P] | None:
        """The request nearest its deadline, if that is within `urgent_margin_s` and it
        fits the batch so far (`size` requests padded to `padded_len`), else None."""
        due = self._earliest_deadline()
        if due is None or due.deadline is None or due.deadline - now > self.urgent_margin_s:
            return None
        if size and (
            due.alone
            or not fits(size=size, padded_len=padded_len, tokens=due.tokens, budget=self._policy.max_batch_tokens)
        ):
            return None
        return due

    def _earliest_deadline(self) -> Item[P] | None:
        while self._deadlines and self._deadlines[0][2].state != _PENDING:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][2] if self._deadlines else None

    def _rank(self, now: float) -> list[str]:
        """Tiers with waiting requests, in the order they are offered the next place:
        owed, furthest behind their share first; aged, oldest first; the rest by priority.

        Age counts only for a tier less than its share of one batch budget ahead of its
        share. Under overload every request of a backlogged tier is "aged", and a tier that
        got "high"'s unused tokens would otherwise jump ahead of "high" on age alone.
        """
        p = self._policy
        limit = p.max_batch_tokens
        owed: list[str] = []
        aged: list[tuple[float, str]] = []
        rest: list[str] = []
        for prio, tier in self._tiers.items():
            head = tier.oldest()
            if head is None:
                continue
            credit = self._credit[prio]
            if credit > 0:
                owed.append(prio)
            elif credit > -limit * p.share(prio) and now - head.enqueued_at >= p.aging_s:
                aged.append((head.enqueued_at, prio))
            else:
                rest.append(prio)
        # Sorts are stable, so equal claims fall back to priority order.
        owed.sort(key=lambda prio: -self._credit[prio] / p.weights[prio])
        aged.sort(key=lambda a: a[0])
        return owed + [prio for _, prio in aged] + rest

    def _pick(
        self, now: float, own: str, padded_len: int, shortest: int, size: int, real: int, flush: bool
    ) -> Item[P] | None:
        """The next request for a batch seeded by tier `own`, or None to close it. A flush
        sends what is waiting in as few batches as the cap and budget allow, so it packs
        by least padding but ignores the spreads."""
        p = self._policy
        limit = p.max_batch_tokens
        if flush:
            own_window = rider_window = (1, limit)
        else:
            own_window = (math.ceil(padded_len / self.own_spread), math.floor(shortest * self.own_spread))
            rider_window = (
                math.ceil(padded_len / self.rider_spread),
                max(padded_len, math.floor(shortest * self.rider_spread)),
            )
            cheap = self._cheap_window(padded_len, size, real)
            if cheap is not None:
                own_window = (min(own_window[0], cheap[0]), max(own_window[1], cheap[1]))
                rider_window = (min(rider_window[0], cheap[0]), max(rider_window[1], cheap[1]))
        for prio in self._rank(now):
            if prio != own and self._credit[prio] <= -limit:
                # A batch budget over its share already: it rides no more, or a tier whose
                # lengths happen to fit everybody's batches would take far more than its share.
                continue
            tier = self._tiers[prio]
            head = tier.oldest()
            assert head is not None
            lo, hi = own_window if prio == own else rider_window
            item = tier.best_fit(padded_len, size, limit, lo=lo, hi=hi, newest=head.enqueued_at + p.aging_s)
            if item is not None:
                return item
        return None

    def _cheap_window(self, padded_len: int, size: int, real: int) -> tuple[int, int] | None:
        """The lengths worth their padding in a batch of `size` requests of `real` tokens
        padded to `padded_len`, or None while the batch cost is unknown. With the
        learned cost `fixed + padded x per_token` (F = fixed / per_token, in tokens), a
        request of L tokens joins if both hold:

        - one batch takes the device less time than two: the padding it adds
          (padded_len - L if shorter, size x (L - padded_len) if longer) is under F;
        - it raises the batch's useful share, real / (F + padded): the device's time
          goes more to real tokens, so a request that would fill a tighter batch of its
          own kind is left to it.
        """
        costs = self.costs
        if costs is None or not costs.warm:
            return None
        line = costs.line()
        if line is None or line[0] <= 0 or line[1] <= 0:
            return None
        fixed = line[0] / line[1]
        # Shorter: adds L real and padded_len computed tokens.
        lo = max(math.ceil(padded_len - fixed), math.floor(real * padded_len / (fixed + size * padded_len)) + 1)
        # Longer: adds L real and (size + 1) x L - size x padded_len computed tokens.
        hi = math.floor(padded_len + fixed / max(1, size))
        over = (size + 1) * real - fixed - size * padded_len
        if over > 0:
            hi = min(hi, math.ceil(real * size * padded_len / over) - 1)
        return max(1, lo), max(hi, padded_len)

    def _take(self, item: Item[P]) -> None:
        # Every backlogged tier earns its guaranteed share (weight / sum of *all*
        # weights) of these tokens; the served tier pays only for the part the backlogged
        # tiers claim. So credits sum to zero among the waiting, a tier served while
        # nobody else waits neither gains nor loses credit, and tokens an idle tier leaves
        # unclaimed are free: they go by priority instead of being split by weight, and
        # "low" gets its share, not more. Credit is clamped to one batch budget, debt to
        # two: more than the lines `_rank` and `_pick` draw, so a tier pushed past them
        # keeps its whole debt and cannot jump on age or ride again until the others have
        # caught up. So a tier can neither bank an idle period nor be punished forever
        # for an aged burst.
        limit = float(self._policy.max_batch_tokens)
        weights = self._policy.weights
        total = sum(weights.values())
        backlogged = [prio for prio, tier in self._tiers.items() if tier.count]
        claimed = sum(weights[prio] for prio in backlogged) / total
        for prio in backlogged:
            self._credit[prio] += item.tokens * weights[prio] / total
        self._credit[item.priority] -= item.tokens * claimed
        for prio in PRIORITIES:
            self._credit[prio] = max(-2 * limit, min(limit, self._credit[prio]))
        self._tiers[item.priority].discard(item, _TAKEN)
        self.served_tokens[item.priority] += item.tokens
        self._on_maybe_empty(item.priority)

    def _on_maybe_empty(self, prio: str) -> None:
        if self._tiers[prio].count == 0:
            # An idle tier banks no credit for later bursts.
            self._credit[prio] = min(self._credit[prio], 0.0)
