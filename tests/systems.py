"""Running a whole system for one test module, this process pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from batching_site.harness import LocalSystem
from dynamic_batching.conf import conf
from dynamic_batching.store.connection import connect


@contextmanager
def running(system: LocalSystem, *, timeout: float = 120) -> Iterator[LocalSystem]:
    """Start `system`, point this process at its Redis, and undo both afterwards."""
    previous = conf.REDIS_URL
    try:
        system.start(timeout=timeout)
        connect(system.redis_url)
        yield system
    finally:
        system.close()
        connect(previous)
