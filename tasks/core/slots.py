"""Batches sent to the devices and not yet reported done: how many more may be sent,
and which are presumed lost with their device.

A batch that *yields* (its device runs other batches between its layers while it is
long, gpu_workers/preempt.py) stops holding its device's slot: it moves to the
background until it is done. A slow-lane batch, and any batch in the background, holds
one of the devices' slow places (at most one per device) until it is done, so that a
slow input never waits in the broker, holding a slot, for a device that cannot take it.

Pure: the caller gives a clock and reports sends and completions.
"""

from __future__ import annotations

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

    def __len__(self) -> int:
        return len(self.outstanding)

    def free(self, devices: int, batches_ahead: int) -> int:
        """How many batches may be sent now: each device runs one and queues
        `batches_ahead` more."""
        return max(0, devices * (1 + batches_ahead) - len(self.outstanding))

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
        self, batch_id: str, padded_tokens: int, *, lane: str = "normal", model: str = "", requests: Sequence[str] = ()
    ) -> None:
        now = self.clock()
        self.outstanding[batch_id] = (now, padded_tokens, model)
        self.requests[batch_id] = list(requests)
        if lane == "slow":
            self.slow[batch_id] = now

    def yielded(self, batch_id: object) -> bool:
        """A device lets other batches run inside `batch_id`: its slot is free."""
        if not isinstance(batch_id, str) or batch_id not in self.outstanding:
            return False
        self.background[batch_id] = self.outstanding.pop(batch_id)
        return True

    def done(self, batch_id: object, padded_tokens: int, run_s: float) -> bool:
        """A device reported `batch_id` done; learns its cost. False if it was not ours
        (sent by an earlier collector, or already reclaimed)."""
        if not isinstance(batch_id, str):
            return False
        self.slow.pop(batch_id, None)
        self.requests.pop(batch_id, None)
        sent = self.outstanding.pop(batch_id, None) or self.background.pop(batch_id, None)
        if sent is None:
            return False
        self.costs_of(sent[2]).observe(padded_tokens, run_s)
        return True

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
        sent_at = {batch_id: sent for batch_id, (sent, _, _) in self.background.items()} | self.slow
        for batch_id, sent in sent_at.items():
            if now - sent > self.forget_after_s:
                self.background.pop(batch_id, None)
                self.slow.pop(batch_id, None)
                self.requests.pop(batch_id, None)
        return stale
