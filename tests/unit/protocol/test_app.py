"""`configure` leaves the host's Celery app as it was; `configure_worker` gives a
batching worker process what its consumers need."""

from __future__ import annotations

from celery import Celery

from dynamic_batching.protocol.app import TASK_MODULES, configure, configure_worker, is_configured
from dynamic_batching.protocol.names import (
    BATCH_QUEUE,
    CONTROL_QUEUE,
    PRIORITIES,
    SLOW_BATCH_QUEUE,
    UNACKED_KEY,
    request_queue_name,
)


def host_app() -> Celery:
    app = Celery("hostproj", include=["hostproj.jobs"], set_as_current=False)
    app.conf.update(
        task_default_queue="hostproj",
        task_routes={"hostproj.jobs.*": {"queue": "jobs"}},
        broker_transport_options={"visibility_timeout": 7200},
        worker_prefetch_multiplier=4,
    )
    return app


def conf_of(app: Celery) -> dict:
    return {k: repr(v) for k, v in app.conf.items()}


def test_configure_changes_nothing_in_the_hosts_app() -> None:
    app = host_app()
    before = conf_of(app)
    assert configure(app) is app
    assert conf_of(app) == before
    assert is_configured(app)
    assert not is_configured(host_app())


def test_a_batching_worker_consumes_its_own_queues_under_its_own_unacked_keys() -> None:
    app = configure_worker(host_app())
    assert {q.name for q in app.conf.task_queues} == {
        *(request_queue_name(p) for p in PRIORITIES),
        BATCH_QUEUE,
        SLOW_BATCH_QUEUE,
        CONTROL_QUEUE,
    }
    options = app.conf.broker_transport_options
    assert options["visibility_timeout"] == 30
    # Its sweep restores batching's messages only, never a host task's.
    assert options["unacked_key"] == UNACKED_KEY
    assert app.conf.worker_prefetch_multiplier == 1
    assert list(app.conf.include) == ["hostproj.jobs", *TASK_MODULES]
    configure_worker(app)
    assert list(app.conf.include) == ["hostproj.jobs", *TASK_MODULES]
