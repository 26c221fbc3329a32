"""Receivers of Celery's task signals, as Sentry's and OpenTelemetry's Celery
integrations connect them, loaded into a device worker (-I signal_probe) by
tests/live/test_celery_signals.py: each notes the request it heard of in Redis."""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import signals


def _note(key: str, value: str) -> None:
    redis.Redis.from_url(os.environ["REDIS_URL"]).set(key, value, ex=600)


@signals.task_success.connect
def _success(sender: Any = None, result: Any = None, **_: Any) -> None:
    if sender is not None and sender.name == "batching.infer":
        _note(f"probe:success:{sender.request.id}", "1")


@signals.task_failure.connect
def _failure(sender: Any = None, task_id: str | None = None, exception: Any = None, **_: Any) -> None:
    if sender is not None and sender.name == "batching.infer":
        _note(f"probe:failure:{task_id}", type(exception).__name__)
