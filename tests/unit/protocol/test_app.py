"""`configure`: what a project's own Celery app needs to carry batching."""

from __future__ import annotations

from celery import Celery

from tasks.protocol.app import TASK_MODULES, configure
from tasks.protocol.names import (
    BATCH_QUEUE,
    BATCH_TASK,
    CONTROL_QUEUE,
    PRIORITIES,
    ROUND_TASK,
    SLOW_BATCH_QUEUE,
    request_queue_name,
)


def test_a_fresh_app_gets_every_queue_route_and_task_module() -> None:
    app = configure(Celery("hostproj", set_as_current=False))
    assert {q.name for q in app.conf.task_queues} == {
        *(request_queue_name(p) for p in PRIORITIES),
        BATCH_QUEUE,
        SLOW_BATCH_QUEUE,
        CONTROL_QUEUE,
    }
    assert app.conf.task_routes[BATCH_TASK] == {"queue": BATCH_QUEUE}
    assert app.conf.task_routes[ROUND_TASK] == {"queue": CONTROL_QUEUE}
    assert app.conf.task_default_queue == CONTROL_QUEUE
    assert list(app.conf.include) == list(TASK_MODULES)


def test_the_projects_own_task_modules_stay_and_ours_are_not_doubled() -> None:
    app = Celery("hostproj", include=["hostproj.jobs"], set_as_current=False)
    configure(configure(app))
    assert list(app.conf.include) == ["hostproj.jobs", *TASK_MODULES]
