"""A host project's own Celery tasks, run by a host-style worker on a queue of its own
(tests/live/test_celery_api.py): what a team's chain, chord and callbacks call after a
batched request."""

from __future__ import annotations

import os

import redis
from celery import shared_task

#: The host worker's own queue: no batching process consumes it.
HOST_QUEUE = "host.jobs"


def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ["REDIS_URL"])


@shared_task(name="host.norm")
def norm(vector: list[float]) -> float:
    return round(sum(x * x for x in vector) ** 0.5, 6)


@shared_task(name="host.count")
def count(values: list[object]) -> int:
    return len(values)


@shared_task(name="host.echo")
def echo(value: object) -> object:
    return value


@shared_task(name="host.note")
def note(value: object, key: str) -> None:
    """A link callback: keep what it was given where the test can read it."""
    _redis().set(key, repr(value), ex=600)


@shared_task(name="host.note_error")
def note_error(task_id: str, key: str) -> None:
    """A link_error callback as Celery sends one to another worker: the failed task's id."""
    _redis().set(key, task_id, ex=600)
