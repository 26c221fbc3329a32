"""How long a batch should take, when it is too slow, and when an input is slow in itself.

A batch's cost is its padded tokens (count x longest), because that is what the device
computes. `CostModel` learns seconds per padded token (plus a fixed per-batch overhead)
from batches that ran, with an exponentially weighted average, and turns that into an
expected time and a time limit for the next batch. Pure: it never reads a clock; the
caller reports measured durations.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
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


def confirms_slow(
    suspect: tuple[int, float], control: tuple[int, float], *, factor: float, floor_s: float
) -> tuple[bool, float]:
    """Is an input slow in itself, or was the device just slow? Both ran alone, one
    right after the other, on the same device: `suspect` (padded tokens, seconds) and
    `control`, a batch-mate that ran in time. Judged per padded token against the
    control, the device's speed now, whatever it was when it was idle: a busy machine
    slows both alike. Returns (slow, how many times the control's rate it ran at)."""
    (p_s, t_s), (p_c, t_c) = suspect, control
    if p_s <= 0 or p_c <= 0 or t_c <= 0:
        return False, 0.0
    ratio = (t_s / p_s) / (t_c / p_c)
    return (t_s >= floor_s and ratio >= factor), ratio


def slow_after(expected_s: float | None, *, factor: float, floor_s: float) -> float:
    """The one "too slow" rule: `factor` times the expected time, and never under
    `floor_s` (an unknown expectation counts as 0, so the floor alone applies)."""
    return max(floor_s, factor * (expected_s or 0.0))


def normalise(value: object) -> object:
    """An input as far as its cost goes: every text in it Unicode-normalised (NFKC) with
    its runs of whitespace made one space and its ends trimmed, so the same slow input
    with an extra space, a non-breaking one or a composed accent is still the same."""
    if isinstance(value, str):
        return " ".join(unicodedata.normalize("NFKC", value).split())
    if isinstance(value, list | tuple):
        return [normalise(v) for v in value]
    if isinstance(value, dict):
        return {str(k): normalise(v) for k, v in value.items()}
    return value


def fingerprint(model: str, value: object) -> str:
    """A short, stable name for an input (a text, or any JSON) of one model, so a
    known-slow input is recognised again, trivial changes (`normalise`) included."""
    text = json.dumps(normalise(value), sort_keys=True, ensure_ascii=False)
    return hashlib.blake2b(f"{model}\0{text}".encode(), digest_size=12).hexdigest()
