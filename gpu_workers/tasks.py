"""The batch task that device workers pull from the `batches` queue.

acks_late + reject_on_worker_lost: the batch message is acked only after every
request's outcome is written, so a device worker killed mid-batch leaves it unacked and
the broker hands it to another device after the visibility timeout. The rerun skips
requests already answered (see DeviceRunner.execute), so nobody is answered twice.
"""

from __future__ import annotations

from typing import Any

from batching_site.celery import BATCH_TASK, app

from . import runner


@app.task(name=BATCH_TASK, acks_late=True, reject_on_worker_lost=True)
def run_batch(batch: dict[str, Any]) -> dict[str, Any]:
    return runner.current().execute(batch)
