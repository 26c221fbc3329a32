"""Batch bodies as the collector builds them, for tests that hand a batch straight to a
device runner."""

from __future__ import annotations

import time
import uuid


def batch_of(texts: list[str]) -> dict[str, object]:
    now = time.time()
    requests = [
        {
            "id": str(uuid.uuid4()),
            "input": t,
            "tokens": len(t.split()) + 2,
            "priority": "normal",
            "submitted_at": now,
            "deadline_at": None,
            "truncated": False,
            "waited_s": 0.0,
        }
        for t in texts
    ]
    return {
        "batch_id": str(uuid.uuid4()),
        "model": "synthetic",
        "requests": requests,
        "padded_tokens": len(texts) * max(r["tokens"] for r in requests),
        "real_tokens": sum(r["tokens"] for r in requests),
        "dispatched_at": now,
    }
