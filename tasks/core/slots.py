"""Batches sent to the devices and not yet reported done: how many more may be sent,
and which are presumed lost with their device.

A batch sent ahead (COLLECTOR_BATCHES_AHEAD) is sent when a device is about to be
free, not as soon as there is room for it: the collector predicts when each device
frees from the batches outstanding and their learned costs, and sends the next batch
`lead_s` before, the time a batch takes from here to running on a device, measured from
the devices' own reports of when they started a batch sent to them while free. Sent at once instead, it took whatever was waiting, one or two
requests, and everything arriving while it waited behind the device's batch waited for
the one after (measured: fewer texts a second with a batch ahead than without; issue 40).

A batch that *yields* (its device runs other batches between its layers while it is
long, gpu_workers/preempt.py) stops holding its device's slot: it moves to the
background until it is done. A slow-lane batch, and any batch in the background, holds
one of the devices' slow places (at most one per device) until it is done, so that a
slow input never waits in the broker, holding a slot, for a device that cannot take it.

Pure: the caller gives a clock and reports sends and completions.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .slowness import CostModel, slow_after


@dataclass
class Slots:
    clock: Callable[[], float]
    #: A batch not reported done after this many times its expected time (and at least
    #: `stale_min_s`) is presumed lost with its device: its slot is freed. The batch
    #: itself comes back from the device started in its place, or, if it was lost on
    #: the way, from the ledger (tasks/collector/housekeeping.py::recover_vanished).
    stale_factor: float = 4.0
    stale_min_s: float = 3.0
    #: What a batch of each model costs, learned from the devices' done reports: the
    #: stale limit here, and the scheduler's one-batch-or-two choice (tasks/core/scheduler.py).
    costs: dict[str, CostModel] = field(default_factory=dict)
    #: batch id -> (when sent, padded tokens, model).
    outstanding: dict[str, tuple[float, int, str]] = field(default_factory=dict)
    #: Batches that yielded: batch id -> (when sent, padded tokens, model).
    background: dict[str, tuple[float, int, str]] = field(default_factory=dict)
    #: Slow-lane batches not done: batch id -> when sent.
    slow: dict[str, float] = field(default_factory=dict)
    #: Each batch's request ids, from sent until it is done or forgotten; a stale one's
    #: until the collector has looked for it (housekeeping.recover_vanished).
    requests: dict[str, list[str]] = field(default_factory=dict)
    #: A background or slow-lane batch never reported done is forgotten after this long
    #: (its device died; the broker redelivers it, and it is counted again if it yields).
    forget_after_s: float = 120.0
    #: Send a batch ahead only when a device is predicted free within `lead_s`; off,
    #: as soon as there is room (a benchmark's baseline).
    timed: bool = True
    #: From sending a batch to its device starting it, learned (an exponentially
    #: weighted average, within `lead_bounds`) from the batches sent to a free device:
    #: their device reports when it started them (`done`), on the wall clock the batch
    #: was stamped with when it was sent.
    lead_s: float = 0.005
    lead_bounds: tuple[float, float] = (0.0005, 0.05)
    leads_observed: int = 0
    #: batch id -> when it was sent (wall clock), for batches sent to a free device.
    hop_from: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.outstanding)

    def free(self, devices: int, batches_ahead: int) -> int:
        """How many batches may be sent now: each device runs one and queues
        `batches_ahead` more; a batch queued ahead only once its device is predicted
        free within `lead_s`."""
        room = max(0, devices * (1 + batches_ahead) - len(self.outstanding))
        if not self.timed or not batches_ahead or not room:
            return room
        soon = self.clock() + self.lead_s
        return min(room, sum(1 for at in self._free_at(devices) if at <= soon))

    def next_free_at(self, devices: int, batches_ahead: int) -> float | None:
        """When `free` next grows by time alone (a device predicted free within
        `lead_s`), for the collector to wake then; None if only a report can."""
        if not self.timed or not batches_ahead or len(self.outstanding) >= devices * (1 + batches_ahead):
            return None
        soon = self.clock() + self.lead_s
        later = [at - self.lead_s for at in self._free_at(devices) if at > soon]
        return min(later, default=None)

    def _free_at(self, devices: int) -> list[float]:
        """When each device is predicted free: the batches outstanding, oldest first,
        each on the device free soonest, for its learned cost (none yet: free at once)."""
        free = [-math.inf] * max(devices, 0)
        if not free:
            return free
        for sent, padded, model in sorted(self.outstanding.values(), key=lambda o: o[0]):
            start = max(sent, free[0])
            heapq.heapreplace(free, start + (self.costs_of(model).expected_s(padded) or 0.0))
        return free

    def slow_free(self, devices: int) -> int:
        """How many slow-lane batches may be sent now: one per device at a time, and
        none to a device inside a batch that yields (it takes only normal batches
        between that one's layers, so a slow-lane batch would wait, holding a slot)."""
        return max(0, devices - len(self.slow.keys() | self.background.keys()))

    def costs_of(self, model: str) -> CostModel:
        """The cost model of `model`'s batches (one is made at its first batch)."""
        costs = self.costs.get(model)
        if costs is None:
            costs = self.costs[model] = CostModel()
        return costs

    def sent(
        self,
        batch_id: str,
        padded_tokens: int,
        *,
        lane: str = "normal",
        model: str = "",
        requests: Sequence[str] = (),
        devices: int = 0,
        dispatched_at: float | None = None,
    ) -> None:
        now = self.clock()
        # Sent to a device already free: its start measures the hop alone.
        if self.timed and dispatched_at is not None and min(self._free_at(devices), default=now) <= now:
            self.hop_from[batch_id] = dispatched_at
        self.outstanding[batch_id] = (now, padded_tokens, model)
        self.requests[batch_id] = list(requests)
        if lane == "slow":
            self.slow[batch_id] = now

    def yielded(self, batch_id: object) -> bool:
        """A device lets other batches run inside `batch_id`: its slot is free."""
        if not isinstance(batch_id, str) or batch_id not in self.outstanding:
            return False
        self.background[batch_id] = self.outstanding.pop(batch_id)
        self.hop_from.pop(batch_id, None)
        return True

    def done(self, batch_id: object, padded_tokens: int, run_s: float, *, started_at: float | None = None) -> bool:
        """A device reported `batch_id` done, started at `started_at` (wall clock);
        learns its cost, and the lead. False if it was not ours (sent by an earlier
        collector, or already reclaimed)."""
        if not isinstance(batch_id, str):
            return False
        self.slow.pop(batch_id, None)
        self.requests.pop(batch_id, None)
        hop_from = self.hop_from.pop(batch_id, None)
        sent = self.outstanding.pop(batch_id, None) or self.background.pop(batch_id, None)
        if sent is None:
            return False
        self.costs_of(sent[2]).observe(padded_tokens, run_s)
        if hop_from is not None and started_at is not None:
            self._learn_lead(started_at - hop_from)
        return True

    def _learn_lead(self, seconds: float) -> None:
        """From send to start, for a batch sent to a free device: the hop to it and the
        device worker's work before the run. The first is taken as it is; later ones
        move the average a fifth of the way."""
        low, high = self.lead_bounds
        seconds = min(max(seconds, low), high)
        self.leads_observed += 1
        self.lead_s = seconds if self.leads_observed == 1 else 0.8 * self.lead_s + 0.2 * seconds

    def reclaim_stale(self) -> list[tuple[str, float]]:
        """Free the slots of batches presumed lost: (batch id, seconds since sent)."""
        now = self.clock()
        stale = []
        for batch_id, (sent, padded, model) in list(self.outstanding.items()):
            expected = self.costs_of(model).expected_s(padded)
            limit = slow_after(expected, factor=self.stale_factor, floor_s=self.stale_min_s)
            if now - sent > limit:
                stale.append((batch_id, now - sent))
                del self.outstanding[batch_id]
                self.hop_from.pop(batch_id, None)
        sent_at = {batch_id: sent for batch_id, (sent, _, _) in self.background.items()} | self.slow
        for batch_id, sent in sent_at.items():
            if now - sent > self.forget_after_s:
                self.background.pop(batch_id, None)
                self.slow.pop(batch_id, None)
                self.requests.pop(batch_id, None)
        return stale
