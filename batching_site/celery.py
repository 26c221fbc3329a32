"""The Celery app, its queues and the routing of every message kind.

Queues (all in one Redis):

    requests.high / requests.normal / requests.low   client -> collector  (one request each)
    batches                                          collector -> any device worker
    device.<name>                                    collector -> one pinned device
    collector.events                                 device workers -> collector (batch done)
    collector.control                                Celery's own queue for the collector worker
                                                     (and tasks.round_done, see tasks/rounds.py)

Redis priorities in kombu are strict and coarse, so priority lives in separate request
queues and the collector's own scheduler decides who goes next.
"""

import os

from celery import Celery
from kombu import Exchange, Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")

PRIORITIES = ("high", "normal", "low")
REQUEST_TASK = "tasks.request"
BATCH_TASK = "gpu_workers.run_batch"
#: Callback of a chord of batches sent in one collector turn (tasks/rounds.py).
ROUND_TASK = "tasks.round_done"
BATCH_QUEUE = "batches"
EVENTS_QUEUE = "collector.events"
CONTROL_QUEUE = "collector.control"


def request_queue_name(priority: str) -> str:
    return f"requests.{priority}"


def device_queue_name(device: str) -> str:
    # Queue names become Redis keys; keep them free of the ':' in "cuda:0".
    return "device." + device.replace(":", "")


def _queue(name: str) -> Queue:
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


app = Celery("batching_site", include=["tasks.intake", "tasks.rounds", "gpu_workers.tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = [_queue(request_queue_name(p)) for p in PRIORITIES] + [
    _queue(BATCH_QUEUE),
    _queue(CONTROL_QUEUE),
]
app.conf.task_default_queue = CONTROL_QUEUE
app.conf.task_routes = {BATCH_TASK: {"queue": BATCH_QUEUE}, ROUND_TASK: {"queue": CONTROL_QUEUE}}


def _install_worker_roles() -> None:
    """`--collector` and `--device NAME` turn a plain worker into one of our roles."""
    from click import Option

    from gpu_workers.worker_steps import DeviceStep
    from tasks.worker_steps import CollectorStep

    app.user_options["worker"].add(
        Option(["--collector"], is_flag=True, default=False, help="Run the batch collector in this worker.")
    )
    app.user_options["worker"].add(
        Option(["--device"], default=None, help="Run batches on this device (cuda:0, cpu:0, ...).")
    )
    app.user_options["worker"].add(
        Option(["--preload"], default=None, help="Comma-separated models to load at start (default: DEFAULT_MODEL).")
    )
    app.steps["worker"].add(CollectorStep)
    app.steps["worker"].add(DeviceStep)


_install_worker_roles()
