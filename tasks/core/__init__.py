"""The batching core: plain Python, no Celery, Django or Redis, and an injectable clock.

- `policy.BatchPolicy`: every knob, validated in one place.
- `scheduler.Scheduler`: which waiting requests form the next batch, and when.
- `batcher.DynamicBatcher`: the scheduler made thread-safe, for in-process use.
"""

from .batcher import DynamicBatcher
from .clock import FakeClock, MonotonicClock
from .policy import PRIORITIES, BatchPolicy
from .scheduler import Batch, Item, Scheduler

__all__ = ["PRIORITIES", "Batch", "BatchPolicy", "DynamicBatcher", "FakeClock", "Item", "MonotonicClock", "Scheduler"]
