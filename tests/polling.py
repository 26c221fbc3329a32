"""One way for a test to wait: poll a predicate until it holds or a deadline passes.
Never a bare sleep; the interval only spaces the polls."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def poll_until(predicate: Callable[[], T], what: str, *, timeout: float = 10.0, interval: float = 0.01) -> T:
    """The first truthy value of `predicate()`; fails the test naming `what` after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
