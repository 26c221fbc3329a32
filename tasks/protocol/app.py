"""The Celery app, found through the `BATCHING_CELERY_APP` setting.

The batching package never imports the project's Celery module: the project imports
the package, as Django resolves ROOT_URLCONF by name. A Django project that adds
batching points the setting at its own app, and hands that app to `configure`.
"""

from __future__ import annotations

import os
import threading

from celery import Celery
from django.utils.module_loading import import_string

from .names import BATCH_QUEUE, BATCH_TASK, CONTROL_QUEUE, PRIORITIES, ROUND_TASK, SLOW_BATCH_QUEUE, request_queue_name
from .wire import kombu_queue

#: The modules that define the batching tasks, imported by every worker at start. By
#: name: they sit above this layer, and only a worker needs them.
TASK_MODULES = ("tasks.edge.intake", "tasks.collector.rounds", "gpu_workers.task")

_app: Celery | None = None
_lock = threading.Lock()


def get_app() -> Celery:
    """The project's Celery app, imported by dotted path on first use."""
    global _app
    if _app is None:
        with _lock:
            if _app is None:
                # Scripts in this repository may skip DJANGO_SETTINGS_MODULE; another
                # project's processes have their own set already.
                os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
                from django.conf import settings

                _app = import_string(settings.BATCHING_CELERY_APP)
    return _app


def configure(app: Celery) -> Celery:
    """Make `app` carry batching: our task modules, a queue per priority, the batch and
    control queues, and the routes between them. Returns `app`. Call it after the app
    reads its configuration (`config_from_object`), once, in the project's celery.py.

    Redis priorities in kombu are strict and coarse, so priority lives in separate
    request queues and the collector's own scheduler decides who goes next. Tasks the
    project defines itself keep their own routes; without one they go to the control
    queue, which only the collector consumes."""
    app.conf.include = [*app.conf.include, *(m for m in TASK_MODULES if m not in app.conf.include)]
    app.conf.task_queues = [kombu_queue(request_queue_name(p)) for p in PRIORITIES] + [
        kombu_queue(BATCH_QUEUE),
        kombu_queue(SLOW_BATCH_QUEUE),
        kombu_queue(CONTROL_QUEUE),
    ]
    app.conf.task_default_queue = CONTROL_QUEUE
    app.conf.task_routes = {BATCH_TASK: {"queue": BATCH_QUEUE}, ROUND_TASK: {"queue": CONTROL_QUEUE}}
    return app
