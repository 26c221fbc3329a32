"""Await batched requests from asyncio code (a Django async view, an ASGI app), with no
thread per waiting request.

    from dynamic_batching.edge.aio import asubmit, asubmit_many
    from dynamic_batching.edge.task import infer

    result = await infer.asubmit("a sentence")          # admitted; an AsyncResult
    vector = await result                                # its answer (or its error, raised)
    vector = await result.aget(timeout=10)
    vectors = await asyncio.gather(*(await asubmit_many(texts)))

Admission (validation, token count, the queue cap, the ledger) is the edge's, as for
`submit`, run on the event loop's default executor: one short round trip to Redis, on
a bounded pool of threads. Waiting is not: every answer is published on its result
key's channel as it is stored (tasks/protocol/lua/set_once.lua), and one subscriber per
event loop (`_Waiter`, on redis.asyncio) listens for all the requests awaited on that
loop, on one connection. A request subscribes, then reads its stored answer once (so
one stored before the subscription is not missed), then waits for its message; 1,000
awaits hold 1,000 futures, not 1,000 threads or connections
(tests/live/test_aio.py counts them).

Written here rather than with Celery's result consumer, which is synchronous and would
hold a thread per waiting `.get()`.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Generator, Iterable
from typing import Any

import redis.asyncio as aioredis
from celery import states
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult

from dynamic_batching.conf import conf

from ..core.quota import Quota
from ..protocol.app import get_app
from . import client


class AwaitableResult(AsyncResult):
    """An AsyncResult that asyncio code can await: `await result` is its answer (or
    raises its error), `await result.aget(timeout)` the same with a timeout. Everything
    else is Celery's (`.id`, `.state`, `.revoke()`)."""

    def __await__(self) -> Generator[Any, None, Any]:
        return self.aget().__await__()

    async def aget(self, timeout: float | None = None, propagate: bool = True) -> Any:
        meta = await _waiter().wait(self.id, self.backend, timeout)
        self._maybe_set_cache(meta)
        return self.maybe_throw(propagate=propagate)


async def asubmit_many(
    inputs: Iterable[Any],
    *,
    priority: str = "normal",
    model: str | None = None,
    deadline_s: float | None = None,
    owner: str = "",
    quota: Quota | None = None,
    celery: dict[str, Any] | None = None,
) -> list[AwaitableResult]:
    """`submit_many` for asyncio: admitted in one round trip (on the default executor),
    an awaitable result per input, in input order. Raises as `submit_many` does."""
    inputs = list(inputs)
    loop = asyncio.get_running_loop()
    ids = await loop.run_in_executor(
        None,
        lambda: client.admit(
            inputs, priority, model=model, deadline_s=deadline_s, owner=owner, quota=quota, celery=celery
        ),
    )
    app = get_app()
    return [AwaitableResult(task_id, app=app) for task_id in ids]


async def asubmit(input: Any, **options: Any) -> AwaitableResult:
    """One input: `submit` for asyncio."""
    [result] = await asubmit_many([input], **options)
    return result


#: Redis connections per event loop: the subscriber's, and a few for reads.
MAX_CONNECTIONS = 8


class _Waiter:
    """One event loop's listener for the answers awaited on it."""

    def __init__(self) -> None:
        # A few connections, shared: a thousand awaits read their stored answers through
        # them in turn (a plain pool would open one per concurrent read).
        pool = aioredis.BlockingConnectionPool.from_url(conf.REDIS_URL, max_connections=MAX_CONNECTIONS)
        self._redis = aioredis.Redis(connection_pool=pool)
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        self._futures: dict[bytes, list[asyncio.Future[dict[str, Any]]]] = {}
        self._reader: asyncio.Task[None] | None = None
        # One (un)subscribe at a time: the subscriber takes its connection on its first
        # command, and concurrent first commands would each take one.
        self._lock = asyncio.Lock()
        self._backend: Any = None

    async def wait(self, task_id: str, backend: Any, timeout: float | None) -> dict[str, Any]:
        self._backend = backend
        key = backend.get_key_for_task(task_id)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        waiting = self._futures.setdefault(key, [])
        waiting.append(future)
        try:
            if len(waiting) == 1:
                async with self._lock:
                    await self._pubsub.subscribe(key)
            if self._reader is None or self._reader.done():
                self._reader = asyncio.create_task(self._read())
            # Stored before the subscription took: read once, after it.
            stored = await self._redis.get(key)
            if stored is not None:
                self._deliver(key, stored)
            try:
                return await asyncio.wait_for(future, timeout)
            except TimeoutError:
                raise CeleryTimeoutError(f"request {task_id} not answered within {timeout} s") from None
        finally:
            waiting.remove(future)
            if not waiting:
                del self._futures[key]
                async with self._lock:
                    await self._pubsub.unsubscribe(key)

    def _deliver(self, key: bytes, raw: bytes) -> None:
        meta = self._backend.decode_result(raw)
        if meta.get("status") not in states.READY_STATES:
            return  # STARTED: not an answer yet
        for future in self._futures.get(key, ()):
            if not future.done():
                future.set_result(meta)

    async def _read(self) -> None:
        while self._futures:
            if not self._pubsub.subscribed:
                await asyncio.sleep(0.01)
                continue
            message = await self._pubsub.get_message(timeout=1.0)
            if message is not None and message.get("type") == "message":
                self._deliver(message["channel"], message["data"])


_waiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Waiter] = weakref.WeakKeyDictionary()


def _waiter() -> _Waiter:
    loop = asyncio.get_running_loop()
    waiter = _waiters.get(loop)
    if waiter is None:
        waiter = _waiters[loop] = _Waiter()
    return waiter
