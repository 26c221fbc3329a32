"""Awaiting batched requests from one event loop (issue 39, await): 1,000 concurrent
awaits each get their own answer, and the process holds no thread per request."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dynamic_batching.edge.aio import asubmit_many
from dynamic_batching.edge.task import infer
from dynamic_batching.gpu_workers.models import synthetic

pytestmark = pytest.mark.live

N = 1000


def test_a_thousand_concurrent_awaits_from_one_event_loop_thread(live_system: object) -> None:
    texts = [f"awaited {i} " + "w " * (i % 9) for i in range(N)]
    peak = 0

    async def main() -> list[object]:
        nonlocal peak
        # Admitted in tens (one round trip each), then all awaited at once.
        chunks = [texts[i : i + 10] for i in range(0, N, 10)]
        results = [r for rs in await asyncio.gather(*(asubmit_many(c, model="synthetic") for c in chunks)) for r in rs]

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, threading.active_count())
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        try:
            return await asyncio.wait_for(asyncio.gather(*(r.aget() for r in results)), 120)
        finally:
            watcher.cancel()

    before = threading.active_count()
    answers = asyncio.run(main())
    assert answers == [synthetic.embed(t) for t in texts]
    print(f"threads: {before} before, {peak} at most while {N} awaits were pending")
    assert peak - before < 50, f"{peak - before} more threads for {N} awaits"


def test_infer_asubmit_and_await(live_system: object) -> None:
    async def main() -> object:
        result = await infer.asubmit("awaited through the task", model="synthetic")
        return await result

    assert asyncio.run(main()) == synthetic.embed("awaited through the task")


def test_an_awaited_failure_raises_the_models_own_error(live_system: object) -> None:
    async def main() -> object:
        result = await infer.asubmit("refused !fail", model="synthetic")
        return await result.aget(timeout=30)

    with pytest.raises(synthetic.PoisonInput):
        asyncio.run(main())
