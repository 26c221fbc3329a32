"""The Celery app batching sends through: the host project's own, named by the setting
`CELERY_APP` (BATCHING["CELERY_APP"]) and marked once with `configure(app)`.

Why the host's app and not one of our own: a request's callbacks, chains and chords
run the host's tasks by the host's routes, and its callers read answers through the
host's result backend; a second app would have to copy both and keep them in step.

Why `configure` changes nothing in `app.conf`: the host's queues, routes, default
queue and transport options stay the host's, so its own `celery worker` (with or
without `-Q`) never consumes a batching queue, and no host task runs under batching's
30 s visibility timeout. Every batching message names its queue as it is sent (the
edge, the collector and the devices never rely on routes), and what batching's own
consumers need (their queues, prefetch 1, JSON only, the visibility timeout) is set by
`configure_worker` inside the batching worker processes alone.
"""

from __future__ import annotations

import os
import threading
import weakref

from celery import Celery
from django.utils.module_loading import import_string

from dynamic_batching.conf import conf

from .names import (
    CONTROL_QUEUE,
    PRIORITIES,
    SHARED_BATCH_QUEUES,
    UNACKED_INDEX_KEY,
    UNACKED_KEY,
    UNACKED_MUTEX_KEY,
    request_queue_name,
)
from .wire import kombu_queue

#: The modules that define the batching tasks, imported by every batching worker at
#: start. By name: they sit above this layer, and only a worker needs them.
TASK_MODULES = (
    "dynamic_batching.edge.intake",
    "dynamic_batching.edge.task",
    "dynamic_batching.collector.rounds",
    "dynamic_batching.gpu_workers.task",
)

_apps: dict[str, Celery] = {}
_lock = threading.Lock()
_configured: weakref.WeakSet[Celery] = weakref.WeakSet()


def get_app() -> Celery:
    """The project's Celery app, imported by dotted path on first use (once per path:
    a test that names another app gets that one)."""
    # Scripts in this repository may skip DJANGO_SETTINGS_MODULE; another project's
    # processes have their own set already.
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
    path = conf.CELERY_APP
    app = _apps.get(path)
    if app is None:
        if not path:
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured(
                'BATCHING["CELERY_APP"] names no Celery app: set it to your app\'s dotted path, '
                'e.g. "mysite.celery.app" (and call configure(app) in that module)'
            )
        with _lock:
            app = _apps.get(path)
            if app is None:
                app = _apps[path] = import_string(path)
    return app


def configure(app: Celery) -> Celery:
    """Mark `app` as the one batching sends through, after it has read its own
    configuration. Returns `app`, its configuration untouched (see above); the system
    check batching.E021 fails where the app batching uses was never passed here."""
    _configured.add(app)
    return app


def is_configured(app: Celery) -> bool:
    return app in _configured


def batching_queues() -> list:
    """Every queue a batching worker may consume, declared as kombu declares ours."""
    names = [request_queue_name(p) for p in PRIORITIES] + [*SHARED_BATCH_QUEUES, CONTROL_QUEUE]
    return [kombu_queue(name) for name in names]


def transport_options() -> dict[str, object]:
    """kombu's Redis transport options for batching's consumers."""
    return {
        # An unacked batch goes back to its queue this long after its device vanished.
        "visibility_timeout": conf.VISIBILITY_TIMEOUT_S,
        # Batching's unacked messages apart from the host's (names.py).
        "unacked_key": UNACKED_KEY,
        "unacked_index_key": UNACKED_INDEX_KEY,
        "unacked_mutex_key": UNACKED_MUTEX_KEY,
        # Sweep for abandoned messages every 5 s, all of them, so a killed holder's
        # messages are back in their queue within visibility timeout + 5 s.
        "unacked_restore_interval": 5,
        "unacked_restore_throttle": 1,
        "unacked_restore_limit": 10000,
        # A sweeper killed mid-sweep must not block every other sweep for kombu's
        # default 5 minutes.
        "unacked_mutex_expire": 10,
    }


def configure_worker(app: Celery) -> Celery:
    """What a batching consumer needs, set in a batching worker process only (the
    collector's and each device's `worker.py`): this process consumes nothing of the
    host's, so nothing the host runs sees these values."""
    app.conf.update(
        include=[*app.conf.include, *(m for m in TASK_MODULES if m not in app.conf.include)],
        # Its own queues only: a device queue (-Q) is added on the command line.
        task_queues=batching_queues(),
        task_default_queue=CONTROL_QUEUE,
        # JSON only: pickle would let anyone who can write to the broker run code.
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        # A device worker never hoards batches that an idle device could run.
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_send_task_events=True,
        task_send_sent_event=conf.TASK_SENT_EVENTS,
        result_expires=conf.RESULT_EXPIRES_S,
        broker_transport_options={**(app.conf.broker_transport_options or {}), **transport_options()},
    )
    return app
