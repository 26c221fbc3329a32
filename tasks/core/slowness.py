"""How long a batch should take, when it is too slow, and when an input is slow in itself.

A batch's cost is its padded tokens (count x longest), because that is what the device
computes. `CostModel` learns a fixed per-batch overhead and seconds per padded token
from batches that ran (an exponentially weighted least-squares line), and turns that
into an expected time and a time limit for the next batch. Pure: it never reads a clock; the
caller reports measured durations.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Callable
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
        # Exponentially weighted sums for a least-squares line t = overhead + p x rate:
        # weight, p, t, p*p, p*t. A line, not a rate through zero, because a batch has a
        # fixed cost too (kernel launches, the hand-off), which dominates small batches.
        self._sums = [0.0] * 5
        self.observed = 0

    def observe(self, padded_tokens: int, seconds: float) -> None:
        """Learn from a batch that finished normally (never from one that was cut off)."""
        if padded_tokens <= 0 or seconds < 0:
            return
        self.observed += 1
        keep = 1.0 - self.alpha if self.observed > 1 else 0.0
        p, t = float(padded_tokens), float(seconds)
        for i, v in enumerate((1.0, p, t, p * p, p * t)):
            self._sums[i] = keep * self._sums[i] + v

    def line(self) -> tuple[float, float] | None:
        """(overhead seconds, seconds per padded token) as learned, or None before any."""
        w, sp, st, spp, spt = self._sums
        if w <= 0 or sp <= 0:
            return None
        spread = w * spp - sp * sp
        if spread > 1e-9 * w * spp:
            rate = (w * spt - sp * st) / spread
            overhead = (st - rate * sp) / w
            if rate > 0 and overhead >= 0:
                return overhead, rate
        # Batches all of one cost (or a fit that makes no physical sense): a rate alone.
        return 0.0, st / sp

    @property
    def warm(self) -> bool:
        """Seen enough batches (`warmup`) for its averages to be acted on."""
        return self.observed >= self.warmup

    def expected_s(self, padded_tokens: int) -> float | None:
        line = self.line()
        if line is None:
            return None
        overhead, rate = line
        return overhead + padded_tokens * rate

    def limit_s(self, padded_tokens: int) -> float:
        """How long a batch of this cost may run before it counts as slow."""
        expected = self.expected_s(padded_tokens)
        if expected is None or not self.warm:
            return self.hard_limit_s
        return min(self.hard_limit_s, slow_after(expected, factor=self.factor, floor_s=self.floor_s))


def confirms_slow(
    suspect: tuple[int, float],
    control: tuple[int, float],
    *,
    factor: float,
    floor_s: float,
    expected: Callable[[int], float | None] | None = None,
) -> tuple[bool, float]:
    """Is an input slow in itself, or was the device just slow? Both ran alone, one
    right after the other, on the same device: `suspect` (padded tokens, seconds) and
    `control`, an input that ran in time. Each is measured against what the cost model
    expects for its size (`expected`, seconds for padded tokens; per token when there is
    none), and the suspect against the control: the device's speed now, whatever it was
    when the model learned. A busy machine slows both alike. Returns (slow, how many
    times the control's slowdown the suspect's was)."""
    (p_s, t_s), (p_c, t_c) = suspect, control
    if p_s <= 0 or p_c <= 0 or t_c <= 0:
        return False, 0.0
    e_s, e_c = (expected(p_s), expected(p_c)) if expected is not None else (None, None)
    if not e_s or not e_c:
        e_s, e_c = float(p_s), float(p_c)
    ratio = (t_s / e_s) / (t_c / e_c)
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
