"""The Redis client of this process, and pointing the process at another Redis.

Every client here, and Celery's result backend (tasks/store/result_backend.py), retries
a command that fails because Redis went away, for up to about `RETRY_FOR_S` seconds:
long enough for a supervised Redis to restart from its append-only file. So a caller
blocked on `AsyncResult.get()` when Redis restarts gets its answer, not a
ConnectionError.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from dynamic_batching.conf import conf

from ..protocol.app import get_app

#: About how long a command keeps retrying while Redis is away.
RETRY_FOR_S = 20.0


def retrying() -> dict[str, Any]:
    """Connection options that retry a command through a Redis restart: exponential
    backoff from 20 ms to 0.5 s, on a lost connection or while Redis loads its data."""
    return {
        "retry": Retry(ExponentialBackoff(cap=0.5, base=0.02), int(RETRY_FOR_S / 0.5)),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError, BusyLoadingError],
    }


def backend_url(redis_url: str) -> str:
    """The result backend setting for `redis_url`: Celery's Redis backend, retrying."""
    return f"dynamic_batching.store.result_backend:RetryingRedisBackend+{redis_url}"


_clients: dict[str, redis.Redis] = {}
_clients_lock = threading.Lock()
_on_connect: list[Callable[[], None]] = []


#: Connections the shared client of one process opens at most (redis-py's default). Past
#: it a command waits up to POOL_WAIT_S for one to come free: a web worker may run more
#: sync views at once than that (batching_site/asgi.py), and redis-py's plain pool would
#: refuse the extra ones with "Too many connections".
MAX_CONNECTIONS = 100
POOL_WAIT_S = 10.0


def client(url: str | None = None) -> redis.Redis:
    """One thread-safe client (and connection pool) per Redis URL per process."""
    url = url or conf.REDIS_URL
    with _clients_lock:
        if url not in _clients:
            pool = redis.BlockingConnectionPool.from_url(
                url,
                max_connections=MAX_CONNECTIONS,
                timeout=POOL_WAIT_S,
                socket_connect_timeout=2,
                health_check_interval=30,
                **retrying(),
            )
            _clients[url] = redis.Redis(connection_pool=pool)
        return _clients[url]


_probes: dict[str, redis.Redis] = {}


def probe(url: str | None = None) -> redis.Redis:
    """A client that never retries and gives up within a second, for asking "is Redis
    there?" (/healthz): the shared client's retries would make the answer wait about
    RETRY_FOR_S while Redis is away, past any load balancer's health check timeout."""
    url = url or conf.REDIS_URL
    with _clients_lock:
        if url not in _probes:
            _probes[url] = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1, retry=None)
        return _probes[url]


def connect(redis_url: str) -> None:
    """Make this process a client of the system at `redis_url`: the client API, the
    result backend and the shared state all read the address from here."""
    from kombu import pools

    app = get_app()
    conf.set(REDIS_URL=redis_url)
    app.conf.broker_url = redis_url
    app.conf.result_backend = backend_url(redis_url)
    # Forget connections made to any earlier address. app.pool comes from kombu's
    # process-wide registry of pools, one per address: close them all and empty it, or
    # coming back to an address used before would hand out its closed pool.
    app._local.__dict__.clear()  # the per-thread result backend
    pools.reset()
    app._pool = None
    app.amqp._producer_pool = None
    with _clients_lock:
        _clients.clear()
        _probes.clear()
    for hook in _on_connect:
        hook()


def on_connect(hook: Callable[[], None]) -> None:
    """Call `hook` after every connect(): a cache of what was read from the previous
    Redis drops it."""
    _on_connect.append(hook)
