"""The Redis client of this process, and pointing the process at another Redis."""

from __future__ import annotations

import threading
from collections.abc import Callable

import redis
from django.conf import settings

from ..protocol.app import get_app

_clients: dict[str, redis.Redis] = {}
_clients_lock = threading.Lock()
_on_connect: list[Callable[[], None]] = []


def client(url: str | None = None) -> redis.Redis:
    """One thread-safe client (and connection pool) per Redis URL per process."""
    url = url or settings.REDIS_URL
    with _clients_lock:
        if url not in _clients:
            _clients[url] = redis.Redis.from_url(url, socket_connect_timeout=2, health_check_interval=30)
        return _clients[url]


def connect(redis_url: str) -> None:
    """Make this process a client of the system at `redis_url`: the client API, the
    result backend and the shared state all read the address from here."""
    from kombu import pools

    app = get_app()
    settings.REDIS_URL = redis_url
    app.conf.broker_url = redis_url
    app.conf.result_backend = redis_url
    # Forget connections made to any earlier address. app.pool comes from kombu's
    # process-wide registry of pools, one per address: close them all and empty it, or
    # coming back to an address used before would hand out its closed pool.
    app._local.__dict__.clear()  # the per-thread result backend
    pools.reset()
    app._pool = None
    app.amqp._producer_pool = None
    with _clients_lock:
        _clients.clear()
    for hook in _on_connect:
        hook()


def on_connect(hook: Callable[[], None]) -> None:
    """Call `hook` after every connect(): a cache of what was read from the previous
    Redis drops it."""
    _on_connect.append(hook)
