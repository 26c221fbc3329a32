"""Which waiting requests go into the next batch, and when.

A pure state machine in the manner of vLLM's scheduler: it is told what arrived
(`add`), asked for a plan (`next_batch`) whenever a device slot is free, and never
touches a thread, a socket or the wall clock. The collector drives it from one thread;
`DynamicBatcher` drives it under a lock. Both give it a clock, so tests run on a fake one.

How a batch is built, one request at a time:

1. *Urgent first.* A request that has waited `aging_ms`, or whose deadline is near,
   goes before fresher requests of any tier.
2. *Priority with guaranteed shares.* Otherwise the highest tier wins, except that a
   tier which has received less than its share of tokens (weight / sum of weights)
   while it was backlogged is owed, and owed tiers go first. So "high" gets
   low latency, yet "low" can never be starved below its share: strict priority
   alone (kombu on Redis, Triton, vLLM) starves it, and plain weighted fair queuing
   makes "high" wait behind everybody's turn.
3. *Length-aware packing.* The first request sets the batch's padded length; from the
   chosen tier we take the request whose length wastes the least padding. Within a
   tier that reorders by length, never across tiers, and the seed of every batch is
   its tier's oldest request, so nothing is overtaken forever.

A batch never exceeds `max_batch_size` requests or `max_batch_tokens` *padded* tokens
(count x longest), except a lone oversized request that the edge accepted to run alone.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from .policy import PRIORITIES, BatchPolicy

P = TypeVar("P")

_PENDING, _TAKEN, _EXPIRED = 0, 1, 2


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

    def best_fit(self, padded_len: int, size: int, budget: int) -> Item[P] | None:
        """The waiting request that adds the least padding to a batch of `size`
        requests padded to `padded_len`, among those that keep it within `budget`."""
        while True:
            i = bisect.bisect_right(self.lengths, padded_len)
            lower = self.lengths[i - 1] if i > 0 else None
            higher = self.lengths[i] if i < len(self.lengths) else None
            if higher is not None and (size + 1) * higher > budget:
                higher = None
            if lower is not None and (size + 1) * padded_len > budget:
                lower = None
            if lower is None and higher is None:
                return None
            if lower is not None and (higher is None or padded_len - lower <= size * (higher - padded_len)):
                length = lower
            else:
                assert higher is not None
                length = higher
            head = self.head_of_length(length)
            if head is not None:
                return head
            # That length held only deleted items; its key is gone now, so look again.


class Scheduler(Generic[P]):
    def __init__(
        self,
        policy: BatchPolicy,
        clock: Callable[[], float],
        *,
        urgent_margin_s: float = 0.05,
    ) -> None:
        self._policy = policy
        self._clock = clock
        #: A request this close to its deadline is urgent: served first, like an aged one.
        self.urgent_margin_s = urgent_margin_s
        self._tiers: dict[str, _Tier[P]] = {p: _Tier() for p in PRIORITIES}
        self._credit: dict[str, float] = dict.fromkeys(PRIORITIES, 0.0)
        self._deadlines: list[tuple[float, int, Item[P]]] = []
        self._seq = itertools.count()
        self._flush_requested = False
        #: Tokens served per tier since start: the fairness the metrics report.
        self.served_tokens: dict[str, int] = dict.fromkeys(PRIORITIES, 0)

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
        if self._clock() >= oldest.enqueued_at + p.max_wait_s:
            return "wait"
        return None

    def next_wakeup(self) -> float | None:
        """The clock reading at which `trigger` or `expire` next has news, if any."""
        times: list[float] = []
        oldest = self.oldest()
        if oldest is not None:
            times.append(oldest.enqueued_at + self._policy.max_wait_s)
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

        seed = self._urgent(now) or self._tiers[self._choose_tier()].oldest()
        assert seed is not None
        chosen = [seed]
        self._take(seed)
        padded_len = seed.tokens
        if not seed.alone and seed.tokens <= p.max_batch_tokens:
            while len(chosen) < p.max_batch_size:
                item = self._urgent(now, padded_len, len(chosen))
                if item is None:
                    item = self._pick(padded_len, len(chosen))
                if item is None:
                    break
                chosen.append(item)
                self._take(item)
                padded_len = max(padded_len, item.tokens)
        real = sum(i.tokens for i in chosen)
        return Batch(tuple(chosen), len(chosen) * padded_len, real, reason, now)

    # --- internals ----------------------------------------------------------------

    def _urgent(self, now: float, padded_len: int = 0, size: int = 0) -> Item[P] | None:
        """An aged or nearly-due request that fits, or None.

        A tier that has already been served a batch budget more than its share cannot
        jump the line on age: otherwise, under overload, every request of a backlogged
        tier is "aged" and age alone would override the shares.
        """
        p = self._policy
        limit = p.max_batch_tokens
        best: Item[P] | None = None
        for prio, tier in self._tiers.items():
            head = tier.oldest()
            if head is None or self._credit[prio] <= -limit:
                continue
            if now - head.enqueued_at >= p.aging_s and (best is None or head.enqueued_at < best.enqueued_at):
                best = head
        if best is None:
            due = self._earliest_deadline()
            if due is not None and due.deadline is not None and due.deadline - now <= self.urgent_margin_s:
                best = due
        if best is None:
            return None
        if size and (best.alone or (size + 1) * max(padded_len, best.tokens) > limit):
            return None
        return best

    def _earliest_deadline(self) -> Item[P] | None:
        while self._deadlines and self._deadlines[0][2].state != _PENDING:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][2] if self._deadlines else None

    def _choose_tier(self, padded_len: int = 0, size: int = 0) -> str:
        """Owed tiers first, highest priority first; then the highest priority."""
        candidates = [prio for prio, tier in self._tiers.items() if tier.count and self._fits(tier, padded_len, size)]
        owed = [prio for prio in candidates if self._credit[prio] > 0]
        return (owed or candidates or [""])[0]

    def _fits(self, tier: _Tier[P], padded_len: int, size: int) -> bool:
        if size == 0:
            return True
        while tier.lengths and tier.head_of_length(tier.lengths[0]) is None:
            pass
        if not tier.lengths:
            return False
        return (size + 1) * max(padded_len, tier.lengths[0]) <= self._policy.max_batch_tokens

    def _pick(self, padded_len: int, size: int) -> Item[P] | None:
        prio = self._choose_tier(padded_len, size)
        if not prio:
            return None
        return self._tiers[prio].best_fit(padded_len, size, self._policy.max_batch_tokens)

    def _take(self, item: Item[P]) -> None:
        # Every backlogged tier earns its share of these tokens; the served tier pays
        # for them. Credit is clamped to one batch budget either way, so a tier can
        # neither bank an idle period nor be punished forever for an aged burst.
        limit = float(self._policy.max_batch_tokens)
        for prio, tier in self._tiers.items():
            if tier.count:
                self._credit[prio] += item.tokens * self._policy.share(prio)
        self._credit[item.priority] -= item.tokens
        for prio in PRIORITIES:
            self._credit[prio] = max(-limit, min(limit, self._credit[prio]))
        self._tiers[item.priority].discard(item, _TAKEN)
        self.served_tokens[item.priority] += item.tokens
        self._on_maybe_empty(item.priority)

    def _on_maybe_empty(self, prio: str) -> None:
        if self._tiers[prio].count == 0:
            # An idle tier banks no credit for later bursts.
            self._credit[prio] = min(self._credit[prio], 0.0)
