"""The Celery app: configuration only. Queue names live in tasks/protocol/names.py;
each worker role adds its own start-up step where it starts (tasks/collector/worker.py,
gpu_workers/worker.py).

Redis priorities in kombu are strict and coarse, so priority lives in separate request
queues and the collector's own scheduler decides who goes next.
"""

import os

from celery import Celery

from tasks.protocol.names import (
    BATCH_QUEUE,
    BATCH_TASK,
    CONTROL_QUEUE,
    PRIORITIES,
    ROUND_TASK,
    request_queue_name,
)
from tasks.protocol.wire import kombu_queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")

#: The modules that define tasks, imported by every worker at start.
TASK_MODULES = ["tasks.edge.intake", "tasks.collector.rounds", "gpu_workers.task"]

app = Celery("batching_site", include=TASK_MODULES)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = [kombu_queue(request_queue_name(p)) for p in PRIORITIES] + [
    kombu_queue(BATCH_QUEUE),
    kombu_queue(CONTROL_QUEUE),
]
app.conf.task_default_queue = CONTROL_QUEUE
app.conf.task_routes = {BATCH_TASK: {"queue": BATCH_QUEUE}, ROUND_TASK: {"queue": CONTROL_QUEUE}}
