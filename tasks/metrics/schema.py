"""What the metrics store holds: the per-tier counters, the histograms and how much
history is kept. Writers (record.py) and the reader (snapshot.py) share it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.histogram import FILL_BOUNDS, SIZE_BOUNDS, TOKEN_BOUNDS, WAIT_BOUNDS_S
from ..protocol.names import PRIORITIES

#: Request outcomes counted per tier, as "<kind>:<tier>" fields of the counters hash.
REQUEST_KINDS = ("dispatched", "completed", "failed", "expired", "rejected", "isolated")
#: One time-series sample per this many seconds; SERIES_LEN of them are kept (10 min).
SAMPLE_EVERY_S = 1.0
SERIES_LEN = 600
#: Failed and isolated requests listed on the dashboard.
RECENT_LEN = 50
#: The "recent" window of the collector's own p50/p99 wait and fill ratio.
WINDOW_S = 60.0

HISTOGRAMS: dict[str, tuple[float, ...]] = {
    **{f"wait:{p}": WAIT_BOUNDS_S for p in PRIORITIES},
    "batch_size": SIZE_BOUNDS,
    "batch_tokens": TOKEN_BOUNDS,
    "fill": FILL_BOUNDS,
}


def decode_counters(raw: Mapping[Any, Any]) -> dict[str, int]:
    out = {}
    for k, v in raw.items():
        name = k.decode() if isinstance(k, bytes) else str(k)
        out[name] = int(float(v))
    return out
