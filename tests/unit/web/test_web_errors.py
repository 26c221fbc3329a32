"""refusal(): the HTTP status, detail and headers for each exception the edge raises."""

from __future__ import annotations

import pytest
import redis
from kombu.exceptions import OperationalError

from dynamic_batching.core.errors import Overloaded, RequestTooLarge
from dynamic_batching.web.errors import Refusal, refusal


@pytest.mark.parametrize(("retry_after", "header"), [(0.0, "1"), (0.2, "1"), (1.0, "1"), (2.3, "3")])
def test_overloaded_is_429_with_a_whole_retry_after_of_at_least_one_second(retry_after: float, header: str) -> None:
    exc = Overloaded("requests", 100, retry_after)
    assert refusal(exc) == Refusal(429, str(exc), {"Retry-After": header})


def test_request_too_large_is_413_even_though_it_is_a_value_error() -> None:
    exc = RequestTooLarge(5000, 512, "model's limit")
    r = refusal(exc)
    assert r is not None and r.status == 413 and "5000" in r.detail and r.headers == {}


@pytest.mark.parametrize("exc", [ValueError("text must not be empty"), TypeError("tokens must be an int")])
def test_a_refused_value_is_422_or_the_given_invalid_status(exc: Exception) -> None:
    assert refusal(exc) == Refusal(422, str(exc))
    assert refusal(exc, invalid_status=400) == Refusal(400, str(exc))


@pytest.mark.parametrize(
    "exc", [redis.ConnectionError("refused"), redis.TimeoutError("slow"), OperationalError("down"), ConnectionError()]
)
def test_an_unreachable_broker_is_503(exc: Exception) -> None:
    r = refusal(exc)
    assert r is not None and r.status == 503 and "unreachable" in r.detail
    assert "refused" not in r.detail, "the broker's own error is not shown to the caller"


def test_a_full_redis_is_503_saying_so() -> None:
    exc = redis.OutOfMemoryError("command not allowed when used memory > 'maxmemory'. script: 143fc16")
    r = refusal(exc)
    assert r == Refusal(503, "the broker is out of memory; try again later")


@pytest.mark.parametrize("exc", [RuntimeError("bug"), KeyError("x"), Exception()])
def test_anything_else_is_a_bug_not_a_refusal(exc: Exception) -> None:
    assert refusal(exc) is None
