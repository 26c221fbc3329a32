"""Metrics: counted where they happen (record.py), aggregated in Redis, read back as one
Snapshot (snapshot.py) by /metrics and /dashboard/."""

from .record import CollectorMetrics, record_batch, record_invalid, record_isolated, record_rejected
from .schema import REQUEST_KINDS, SERIES_LEN
from .snapshot import Snapshot, read, refused_by_owner, reset

__all__ = [
    "REQUEST_KINDS",
    "SERIES_LEN",
    "CollectorMetrics",
    "Snapshot",
    "read",
    "record_batch",
    "record_isolated",
    "record_invalid",
    "record_rejected",
    "refused_by_owner",
    "reset",
]
