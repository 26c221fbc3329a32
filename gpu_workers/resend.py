"""Handing a batch, or part of one, back to the shared batch queue for any device (or to
one device's own queue)."""

from __future__ import annotations

import logging
from typing import Any

import redis
from celery import Celery

from dynamic_batching.protocol.names import BATCH_TASK, batch_queue_name
from dynamic_batching.store import clock, ledger, shared_state

log = logging.getLogger(__name__)


def resend(app: Celery, batch: dict[str, Any], task_id: str, *, queue: str | None = None) -> None:
    """Back on its lane's shared queue (or on `queue`, one device's), its requests'
    ledger entries touched: handed on, not lost. Untouched, a long bisection passed the
    ledger's grace and the sweep queued its batch-mates and its slow input again while
    the search went on (issue 41, finding 8)."""
    queue = queue or batch_queue_name(batch.get("lane", "normal"))
    app.send_task(BATCH_TASK, args=[batch], task_id=task_id, queue=queue)
    ids = [r["id"] for r in batch.get("requests", ())]
    try:
        ledger.touch(shared_state.client(), ids, clock.now())
    except redis.RedisError:  # the message is out; an untouched entry only risks a late re-queue
        log.warning("could not touch the ledger for batch %s", task_id, exc_info=True)


def part(batch: dict[str, Any], requests: list[dict[str, Any]], suffix: str) -> dict[str, Any]:
    """A batch of some of `batch`'s requests, under its own id, with its token counts."""
    return {
        **batch,
        "batch_id": f"{batch['batch_id']}.{suffix}",
        "requests": requests,
        "padded_tokens": len(requests) * max(r["tokens"] for r in requests),
        "real_tokens": sum(r["tokens"] for r in requests),
    }
