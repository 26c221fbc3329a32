"""Fixtures for tests that need the real thing: a Redis-compatible server started on a
free port, and real collector and device-worker processes talking to it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def point_at(redis_url: str) -> None:
    """Make this test process talk to `redis_url`: the client API, the result backend
    and the shared state all read it from here."""
    from django.conf import settings

    from batching_site.celery import app
    from tasks import client, shared_state

    settings.REDIS_URL = redis_url
    app.conf.broker_url = redis_url
    app.conf.result_backend = redis_url
    # Forget connections made to any earlier address.
    app._local.__dict__.clear()  # the per-thread result backend
    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None
    app.amqp._producer_pool = None
    shared_state._clients.clear()
    client._policy._read_at = float("-inf")


@pytest.fixture(scope="session")
def live_system() -> Iterator[object]:
    """Redis, the collector and two simulated CPU devices, with both models loaded."""
    from batching_site.processes import LocalSystem

    system = LocalSystem(
        devices=["cpu:0", "cpu:1"],
        preload="synthetic,minilm",
        env={"TORCH_THREADS": "1", "SYNTHETIC_PER_TOKEN_S": "0.00005"},
    )
    try:
        system.start(timeout=180)
        assert system.redis_url
        point_at(system.redis_url)
        yield system
    finally:
        system.close()


@pytest.fixture
def redis_client(live_system: object):  # type: ignore[no-untyped-def]
    from tasks import shared_state

    return shared_state.client()
