"""How long a batch should take, and when it is too slow.

A batch's cost is its padded tokens (count x longest), because that is what the device
computes. `CostModel` learns seconds per padded token (plus a fixed per-batch overhead)
from batches that ran, with an exponentially weighted average, and turns that into an
expected time and a time limit for the next batch. Pure: it never reads a clock; the
caller reports measured durations.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass


@dataclass
class CostModel:
    #: A batch is too slow once it runs this many times its expected time...
    factor: float = 4.0
    #: ...and at least this long: tiny batches jitter by milliseconds.
    floor_s: float = 0.05
    #: Never allow more than this, learned or not (keep it under the visibility timeout).
    hard_limit_s: float = 20.0
    #: Weight of the newest observation in the running averages.
    alpha: float = 0.2
    #: Batches to observe before any limit is derived from the averages.
    warmup: int = 5

    def __post_init__(self) -> None:
        self._per_token_s: float | None = None
        self._overhead_s = 0.0
        self.observed = 0

    def observe(self, padded_tokens: int, seconds: float) -> None:
        """Learn from a batch that finished normally (never from one that was cut off)."""
        if padded_tokens <= 0 or seconds < 0:
            return
        self.observed += 1
        rate = seconds / padded_tokens
        if self._per_token_s is None:
            self._per_token_s = rate
        else:
            self._per_token_s += self.alpha * (rate - self._per_token_s)

    def expected_s(self, padded_tokens: int) -> float | None:
        if self._per_token_s is None:
            return None
        return self._overhead_s + padded_tokens * self._per_token_s

    def limit_s(self, padded_tokens: int) -> float:
        """How long a batch of this cost may run before it counts as slow."""
        expected = self.expected_s(padded_tokens)
        if expected is None or self.observed < self.warmup:
            return self.hard_limit_s
        return min(self.hard_limit_s, slow_after(expected, factor=self.factor, floor_s=self.floor_s))


def slow_after(expected_s: float | None, *, factor: float, floor_s: float) -> float:
    """The one "too slow" rule: `factor` times the expected time, and never under
    `floor_s` (an unknown expectation counts as 0, so the floor alone applies)."""
    return max(floor_s, factor * (expected_s or 0.0))


def fingerprint(model: str, value: object) -> str:
    """A short, stable name for an input (a text, or any JSON), so a known-slow input
    is recognised again."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
    return hashlib.blake2b(f"{model}\0{text}".encode(), digest_size=12).hexdigest()
