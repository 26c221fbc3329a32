"""The slow lane: inputs known to be slow wait here, apart from everyone else, and run
alone when the lane's policy lets them take a device.

Without it a known-slow input only ran alone, still on the shared queue: on one device a
20 s input held everybody behind it for 20 s, every time it came. Here the collector
keeps such inputs in their own bounded queue and sends one only when a device is free
and the policy (BatchPolicy.slow_lane, chosen in the admin) allows:

- "idle": only while no other request waits. Normal traffic is never queued behind a
  slow input; it can still wait for one already running (at most BATCH_HARD_LIMIT_S).
  Slow inputs can starve under sustained load, and then end at their deadline.
- "share": also while others wait, as long as the slow lane has used less than
  `slow_lane_share` of the device time over the last minute. Slow inputs always move;
  normal traffic gives up at most that share.

Pure: no Redis, no Celery; the collector passes its clock's readings, and reports the
device time each lane's batches took as their done events come back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from .histogram import RollingSum
from .policy import BatchPolicy
from .scheduler import Batch, Item

P = TypeVar("P")

#: The lanes whose device time is compared.
LANES = ("normal", "slow")


class SlowLane(Generic[P]):
    def __init__(self, clock: Callable[[], float], *, capacity: int = 256, window_s: float = 60.0) -> None:
        self._clock = clock
        self.capacity = capacity
        self._waiting: deque[tuple[str, Item[P]]] = deque()
        self._device_s = RollingSum(LANES, window_s=window_s)

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, model: str, item: Item[P]) -> bool:
        """Queue a known-slow input; False when the lane is full (it then runs alone in
        the normal path, as before there was a lane)."""
        if len(self._waiting) >= self.capacity:
            return False
        self._waiting.append((model, item))
        return True

    def cancel(self, item: Item[P]) -> bool:
        """Take out a waiting input that must never run; False if it is not here."""
        kept = deque((m, i) for m, i in self._waiting if i is not item)
        found = len(kept) < len(self._waiting)
        self._waiting = kept
        return found

    def oldest_wait_s(self) -> float:
        return self._clock() - self._waiting[0][1].enqueued_at if self._waiting else 0.0

    def expire(self) -> list[Item[P]]:
        """Take out every input whose deadline has passed."""
        now = self._clock()
        gone = [item for _, item in self._waiting if item.deadline is not None and item.deadline <= now]
        if gone:
            ids = {item.id for item in gone}
            self._waiting = deque((m, i) for m, i in self._waiting if i.id not in ids)
        return gone

    def ran(self, lane: str, seconds: float) -> None:
        """A batch of `lane` used a device for `seconds`."""
        if lane in LANES and seconds > 0:
            self._device_s.add(self._clock(), **{lane: seconds})

    def share(self) -> float:
        """The slow lane's part of the device time over the window."""
        totals = self._device_s.totals(self._clock())
        spent = totals["normal"] + totals["slow"]
        return totals["slow"] / spent if spent else 0.0

    def next_batch(self, policy: BatchPolicy, *, others_waiting: bool) -> tuple[str, Batch[P]] | None:
        """The next slow input, as a batch of its own, if the policy lets it run now."""
        if not self._waiting:
            return None
        if others_waiting:
            if policy.slow_lane == "idle":
                return None
            if policy.slow_lane == "share" and self.share() >= policy.slow_lane_share:
                return None
        model, item = self._waiting.popleft()
        batch = Batch(
            items=(item,),
            padded_tokens=item.tokens,
            real_tokens=item.tokens,
            reason="slow lane",
            formed_at=self._clock(),
        )
        return model, batch
