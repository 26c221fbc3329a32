"""Bucketed histograms and a rolling window of them: pure, with the clock passed in.

Metrics keep counts per bucket instead of every observation, so recording costs O(1)
and a percentile is read from the buckets the way Prometheus' `histogram_quantile`
does (linear inside the bucket that holds it). Two bucket layouts:

- `WAIT_BOUNDS_S`, coarse Prometheus-style bounds for what is stored and exported;
- `FINE_BOUNDS_S`, ~80 geometric bounds (each 1.2x the last, so a percentile read from
  them is off by at most ~20%) for the collector's own last-minute p50/p99.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: Seconds a request waited before dispatch; also used for batch run times.
WAIT_BOUNDS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip
#: Requests per batch.
SIZE_BOUNDS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
#: Padded tokens per batch.
TOKEN_BOUNDS: tuple[float, ...] = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
#: Real tokens over padded tokens per batch.
FILL_BOUNDS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


def geometric_bounds(low: float, high: float, ratio: float) -> tuple[float, ...]:
    """low, low*ratio, ... up to the first bound >= high."""
    if not (0 < low < high) or ratio <= 1:
        raise ValueError(f"need 0 < low < high and ratio > 1, got {low}, {high}, {ratio}")
    n = math.ceil(math.log(high / low) / math.log(ratio))
    return tuple(low * ratio**i for i in range(n + 1))


#: 0.1 ms .. 10 min, ratio 1.2: every percentile within 20% of the truth.
FINE_BOUNDS_S: tuple[float, ...] = geometric_bounds(0.0001, 600.0, 1.2)


@dataclass
class Histogram:
    """Counts per bucket: `counts[i]` holds values in (bounds[i-1], bounds[i]];
    the last slot holds values above every bound (Prometheus' `+Inf`)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"bounds must be strictly increasing, got {self.bounds}")
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        elif len(self.counts) != len(self.bounds) + 1:
            raise ValueError(f"{len(self.bounds)} bounds need {len(self.bounds) + 1} counts, got {len(self.counts)}")

    def index(self, value: float) -> int:
        return bisect.bisect_left(self.bounds, value)

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[self.index(value)] += n
        self.total += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def mean(self) -> float | None:
        n = self.count
        return self.total / n if n else None

    def add(self, other: Histogram) -> None:
        if other.bounds != self.bounds:
            raise ValueError("cannot add histograms with different bounds")
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.total += other.total

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 <= q <= 1), interpolated inside its bucket; None if empty.
        A quantile in the overflow bucket reads as the highest bound: a floor."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be within [0, 1], got {q}")
        n = self.count
        if n == 0:
            return None
        rank = q * n
        seen = 0
        for i, c in enumerate(self.counts):
            if c and seen + c >= rank:
                if i == len(self.bounds):
                    return self.bounds[-1]
                lower = self.bounds[i - 1] if i else 0.0
                return lower + (self.bounds[i] - lower) * max(0.0, rank - seen) / c
            seen += c
        return self.bounds[-1]

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, count of values <= it) per bucket, ending with (+inf, count)."""
        out, running = [], 0
        for bound, c in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += c
            out.append((bound, running))
        return out

    # Stored as a Redis hash: field "<index>" -> count, plus "sum".
    def to_fields(self) -> dict[str, float]:
        fields: dict[str, float] = {str(i): c for i, c in enumerate(self.counts) if c}
        if fields:
            fields["sum"] = self.total
        return fields

    @classmethod
    def from_fields(cls, bounds: tuple[float, ...], fields: Mapping[str | bytes, str | bytes | float]) -> Histogram:
        h = cls(bounds)
        for key, value in fields.items():
            name = key.decode() if isinstance(key, bytes) else key
            if name == "sum":
                h.total = float(value)
            elif name.isdigit() and int(name) < len(h.counts):
                h.counts[int(name)] = int(float(value))
        return h


class RollingHistogram:
    """A histogram of the last `window_s` seconds, kept as one histogram per slot, so
    old observations fall out a slot at a time without storing each one."""

    def __init__(self, bounds: tuple[float, ...], *, window_s: float = 60.0, slot_s: float = 1.0) -> None:
        if window_s <= 0 or slot_s <= 0 or slot_s > window_s:
            raise ValueError(f"need 0 < slot_s <= window_s, got slot_s={slot_s}, window_s={window_s}")
        self.bounds = bounds
        self.window_s = window_s
        self.slot_s = slot_s
        self._slots: dict[int, Histogram] = {}

    def _slot(self, now: float) -> int:
        return math.floor(now / self.slot_s)

    def observe(self, value: float, now: float, n: int = 1) -> None:
        key = self._slot(now)
        h = self._slots.get(key)
        if h is None:
            h = self._slots[key] = Histogram(self.bounds)
            self._prune(now)
        h.observe(value, n)

    def _prune(self, now: float) -> None:
        oldest = self._slot(now - self.window_s)
        for key in [k for k in self._slots if k <= oldest]:
            del self._slots[key]

    def snapshot(self, now: float) -> Histogram:
        """Everything observed in the last window_s seconds (to a slot's precision)."""
        self._prune(now)
        out = Histogram(self.bounds)
        for h in self._slots.values():
            out.add(h)
        return out


class RollingSum:
    """Sums of a few named quantities over the last `window_s` seconds."""

    def __init__(self, names: Sequence[str], *, window_s: float = 60.0, slot_s: float = 1.0) -> None:
        self.names = tuple(names)
        self.window_s = window_s
        self.slot_s = slot_s
        self._slots: dict[int, list[float]] = {}

    def add(self, now: float, **values: float) -> None:
        key = math.floor(now / self.slot_s)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = [0.0] * len(self.names)
            oldest = math.floor((now - self.window_s) / self.slot_s)
            for k in [k for k in self._slots if k <= oldest]:
                del self._slots[k]
        for name, v in values.items():
            slot[self.names.index(name)] += v

    def totals(self, now: float) -> dict[str, float]:
        oldest = math.floor((now - self.window_s) / self.slot_s)
        sums = [0.0] * len(self.names)
        for k, slot in self._slots.items():
            if k > oldest:
                for i, v in enumerate(slot):
                    sums[i] += v
        return dict(zip(self.names, sums, strict=True))
