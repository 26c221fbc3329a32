"""The batch task that device workers pull from the `batches` queue.

acks_late + reject_on_worker_lost: the batch message is acked only after every
request's outcome is written, so a device worker killed mid-batch leaves it unacked and
the broker hands it to another device after the visibility timeout, marked redelivered.
The rerun skips requests already answered (see DeviceRunner.execute), and the outcome
write keeps only a first answer in any case, so nobody is answered twice.

Celery acks a task that raises. A batch must never be acked with callers unanswered,
so anything that escapes the runner (a Redis error while writing the answers, say)
hands the message back to the broker instead: it comes back marked redelivered and is
counted, and a batch that keeps coming back is split until the input at fault is
alone and gets its own error (DeviceRunner._came_back).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Reject

from dynamic_batching.protocol.names import BATCH_TASK

from . import runner

log = logging.getLogger(__name__)


@shared_task(name=BATCH_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def run_batch(self: Task, batch: dict[str, Any]) -> dict[str, Any]:
    # kombu marks a message it restored after the visibility timeout as redelivered.
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    if not well_formed(batch):
        # Only the collector writes batches; this one names nobody to answer, and
        # handing it back would only bring it back.
        log.error("batch task %s has a malformed body; dropping it", self.request.id)
        return {"malformed": True}
    device = runner.current()
    try:
        return device.execute(batch, redelivered=redelivered, task_id=self.request.id)
    except Exception as exc:
        log.exception("batch %s could not finish; handing it back to the broker", self.request.id)
        raise Reject(f"{type(exc).__name__}: {exc}", requeue=True) from exc
    finally:
        # Answered or handed back: a worker started after this one must not restore it.
        device.taken.finished(self.request.id)


def well_formed(batch: Any) -> bool:
    return (
        isinstance(batch, dict)
        and isinstance(batch.get("batch_id"), str)
        and isinstance(batch.get("model"), str)
        and isinstance(batch.get("requests"), list)
        and all(isinstance(r, dict) and isinstance(r.get("id"), str) for r in batch["requests"])
    )
