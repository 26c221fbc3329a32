"""Handing a batch, or part of one, back to the shared batch queue for any device."""

from __future__ import annotations

from typing import Any

from celery import Celery

from dynamic_batching.protocol.names import BATCH_TASK, batch_queue_name


def resend(app: Celery, batch: dict[str, Any], task_id: str) -> None:
    """Back on its lane's shared queue."""
    app.send_task(BATCH_TASK, args=[batch], task_id=task_id, queue=batch_queue_name(batch.get("lane", "normal")))


def part(batch: dict[str, Any], requests: list[dict[str, Any]], suffix: str) -> dict[str, Any]:
    """A batch of some of `batch`'s requests, under its own id, with its token counts."""
    return {
        **batch,
        "batch_id": f"{batch['batch_id']}.{suffix}",
        "requests": requests,
        "padded_tokens": len(requests) * max(r["tokens"] for r in requests),
        "real_tokens": sum(r["tokens"] for r in requests),
    }
