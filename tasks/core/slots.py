"""Batches sent to the devices and not yet reported done: how many more may be sent,
and which are presumed lost with their device.

Pure: the caller gives a clock and reports sends and completions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .slowness import CostModel, slow_after


@dataclass
class Slots:
    clock: Callable[[], float]
    #: A batch not reported done after this many times its expected time (and at least
    #: `stale_min_s`) is presumed lost with its device: its slot is freed. The batch
    #: itself is redelivered by the broker after the visibility timeout.
    stale_factor: float = 4.0
    stale_min_s: float = 3.0
    costs: CostModel = field(default_factory=CostModel)
    #: batch id -> (when sent, padded tokens).
    outstanding: dict[str, tuple[float, int]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.outstanding)

    def free(self, devices: int, batches_ahead: int) -> int:
        """How many batches may be sent now: each device runs one and queues
        `batches_ahead` more."""
        return max(0, devices * (1 + batches_ahead) - len(self.outstanding))

    def sent(self, batch_id: str, padded_tokens: int) -> None:
        self.outstanding[batch_id] = (self.clock(), padded_tokens)

    def done(self, batch_id: object, padded_tokens: int, run_s: float) -> bool:
        """A device reported `batch_id` done; learns its cost. False if it was not ours
        (sent by an earlier collector, or already reclaimed)."""
        if not isinstance(batch_id, str) or self.outstanding.pop(batch_id, None) is None:
            return False
        self.costs.observe(padded_tokens, run_s)
        return True

    def reclaim_stale(self) -> list[tuple[str, float]]:
        """Free the slots of batches presumed lost: (batch id, seconds since sent)."""
        now = self.clock()
        stale = []
        for batch_id, (sent, padded) in list(self.outstanding.items()):
            limit = slow_after(self.costs.expected_s(padded), factor=self.stale_factor, floor_s=self.stale_min_s)
            if now - sent > limit:
                stale.append((batch_id, now - sent))
                del self.outstanding[batch_id]
        return stale
