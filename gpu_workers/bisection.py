"""Running a batch so that only the inputs at fault fail: a batch that raises or runs
past its time limit is split in halves and each half retried (at most log2(n) levels),
and an input too slow to share a batch is run alone afterwards.

A whole batch, bisection and isolation included, runs within one time bound
(BATCH_HARD_LIMIT_S, checked against the visibility timeout at start-up): each call's
limit is cut to what is left of it, and what the bound leaves unrun comes back as
UNRUN, for the runner to hand back to the queue."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from dynamic_batching.conf import conf
from dynamic_batching.core.errors import BatchOutputMismatch, InferenceError
from dynamic_batching.core.slowness import CostModel

from .models.base import BatchRunner
from .watchdog import BatchTooSlow, Watchdog

log = logging.getLogger(__name__)

#: Marks a request that was too slow to run with others; it runs alone afterwards.
SLOW = object()
#: Marks a request that its batch's time bound left unrun.
UNRUN = object()


class Bisector:
    def __init__(self, watchdog: Watchdog, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.watchdog = watchdog
        #: Times a batch's own run: the device runner's leaves out batches that preempted it.
        self.clock = clock
        self.costs: dict[str, CostModel] = {}

    def run(
        self,
        model: str,
        runner: BatchRunner,
        reqs: list[dict[str, Any]],
        *,
        slow_lane: bool = False,
        until: float | None = None,
        on_part: Callable[[list[dict[str, Any]], list[Any]], object] | None = None,
    ) -> list[Any]:
        """Each request's result, its own exception, or SLOW, in order.

        Runs the requests as one batch under a time limit learned from past batches.
        A batch that raises is bisected, so only inputs that fail on their own fail and
        their batch-mates still get answers. A batch cut off for running too long is
        bisected the same way, and a single request too slow on its own comes back as
        SLOW, to be run alone afterwards (`slow_lane=True`, under the hard limit only).
        `until` (time.monotonic()) is the batch's time bound: requests it leaves no time
        for come back as UNRUN. `on_part(requests, results)` hears of each part of a
        bisected batch that ran cleanly as soon as it has, so its callers need not wait
        for the rest of the search.
        """
        return self._run(model, runner, reqs, slow_lane=slow_lane, until=until, on_part=on_part, part=False)

    def _run(
        self,
        model: str,
        runner: BatchRunner,
        reqs: list[dict[str, Any]],
        *,
        slow_lane: bool,
        until: float | None,
        on_part: Callable[[list[dict[str, Any]], list[Any]], object] | None,
        part: bool,
    ) -> list[Any]:
        costs = self.costs.get(model)
        if costs is None:
            costs = self.costs[model] = CostModel(
                factor=conf.SLOW_FACTOR, floor_s=conf.SLOW_FLOOR_S, hard_limit_s=conf.BATCH_HARD_LIMIT_S
            )
        padded = len(reqs) * max(r["tokens"] for r in reqs)
        learned = conf.SLOW_ISOLATION and not slow_lane
        limit = costs.limit_s(padded) if learned else costs.hard_limit_s
        hard = costs.hard_limit_s
        if until is not None:
            left = until - time.monotonic()
            if left <= 0:
                return [UNRUN] * len(reqs)
            limit, hard = min(limit, left), min(hard, left)
        t0 = self.clock()
        try:
            # Past its limit the call is interrupted between bytecodes, or sooner, under a
            # learned limit, once its progress shows it far past it; still running past
            # the hard limit plus a grace, it is stuck in native code (watchdog.on_hung).
            with self.watchdog.limit(limit, hung_after=hard + conf.HANG_GRACE_S, project=learned):
                out = runner.run_batch([r["input"] for r in reqs])
            if len(out) != len(reqs):
                raise BatchOutputMismatch(len(reqs), len(out))
        except BatchOutputMismatch as exc:
            return [exc] * len(reqs)
        except BatchTooSlow:
            log.warning(
                "batch of %d (%d padded tokens) cut off: past its %.3fs limit, or on course far past it",
                len(reqs),
                padded,
                limit,
            )
            if until is not None and time.monotonic() >= until:
                return [UNRUN] * len(reqs)
            if slow_lane or len(reqs) == 1:
                return [SLOW if not slow_lane else InferenceError(f"ran past the {limit:.0f}s hard limit")]
            return self._halves(model, runner, reqs, until, on_part)
        except Exception as exc:  # noqa: BLE001 - the model's failure becomes outcomes
            runner.after_failure(exc)
            if len(reqs) == 1:
                # The model's own exception, its type and traceback kept: the caller's
                # `.get()` raises it, `.traceback` shows where (docs/models.md).
                return [exc]
            return self._halves(model, runner, reqs, until, on_part)
        if not slow_lane:
            costs.observe(padded, self.clock() - t0)
        if part and on_part is not None:
            on_part(reqs, list(out))
        return list(out)

    def _halves(
        self,
        model: str,
        runner: BatchRunner,
        reqs: list[dict[str, Any]],
        until: float | None,
        on_part: Callable[[list[dict[str, Any]], list[Any]], object] | None,
    ) -> list[Any]:
        mid = len(reqs) // 2
        return [
            *self._run(model, runner, reqs[:mid], slow_lane=False, until=until, on_part=on_part, part=True),
            *self._run(model, runner, reqs[mid:], slow_lane=False, until=until, on_part=on_part, part=True),
        ]
