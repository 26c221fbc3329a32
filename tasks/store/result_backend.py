"""Celery's Redis result backend, with connections that retry through a Redis restart
(the policy is tasks/store/connection.py's `retrying`)."""

from __future__ import annotations

from typing import Any

from celery.backends.redis import RedisBackend

from .connection import retrying


class RetryingRedisBackend(RedisBackend):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connparams.update(retrying())
