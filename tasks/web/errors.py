"""One map from what the edge raises to HTTP, used by the form (views.py) and the API
(api.py): the same status, the same `{"detail": ...}` body, the same Retry-After."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import redis
from django.http import HttpResponse
from kombu.exceptions import OperationalError

from dynamic_batching.core.errors import Overloaded, PriorityNotAllowed, RequestTooLarge

from .access import NotLoggedIn


@dataclass(frozen=True)
class Refusal:
    status: int
    detail: str
    headers: dict[str, str] = field(default_factory=dict)

    def onto(self, response: HttpResponse) -> HttpResponse:
        """`response` with this refusal's headers (Retry-After)."""
        for name, value in self.headers.items():
            response[name] = value
        return response


def refusal(exc: BaseException, *, invalid_status: int = 422) -> Refusal | None:
    """The HTTP answer to an exception from `submit_many`, or None if it is a bug.
    `invalid_status` is what a value the edge refused gets: 422 from the API, whose
    schema has already checked the types; 400 from the form, which has no schema."""
    if isinstance(exc, NotLoggedIn):
        return Refusal(401, str(exc))
    if isinstance(exc, Overloaded):
        return Refusal(429, str(exc), {"Retry-After": str(max(1, math.ceil(exc.retry_after)))})
    if isinstance(exc, RequestTooLarge):
        return Refusal(413, str(exc))
    if isinstance(exc, PriorityNotAllowed):
        return Refusal(403, str(exc))
    if isinstance(exc, redis.OutOfMemoryError):
        # maxmemory-policy noeviction (docker-compose.yml): a full Redis refuses new
        # requests instead of evicting queued ones or answers.
        return Refusal(503, "the broker is out of memory; try again later")
    if isinstance(exc, (redis.RedisError, OperationalError, ConnectionError)):
        return Refusal(503, "the broker is unreachable; try again shortly")
    if isinstance(exc, (ValueError, TypeError)):
        return Refusal(invalid_status, str(exc))
    return None
