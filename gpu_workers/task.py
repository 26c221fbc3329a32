"""The batch task that device workers pull from the `batches` queue.

acks_late + reject_on_worker_lost: the batch message is acked only after every
request's outcome is written, so a device worker killed mid-batch leaves it unacked and
the broker hands it to another device after the visibility timeout, marked redelivered.
The rerun skips requests already answered (see DeviceRunner.execute), and the outcome
write keeps only a first answer in any case, so nobody is answered twice.
"""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from tasks.protocol.names import BATCH_TASK

from . import runner


@shared_task(name=BATCH_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def run_batch(self: Task, batch: dict[str, Any]) -> dict[str, Any]:
    # kombu marks a message it restored after the visibility timeout as redelivered.
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    return runner.current().execute(batch, redelivered=redelivered)
