"""The batched model as a Celery task, written only against Celery's public API: delay,
apply_async, signature, send_task, chain, group, chord, link and link_error, on the
process set `make run` starts, with a host-style worker of its own running the host's
callback tasks on a queue of its own (tests/hostworker/host_tasks.py). Issue 39."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import chain, chord, group, signature
from polling import poll_until

from batching_site.celery import app
from batching_site.harness import LocalSystem

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hostworker"))
from host_tasks import HOST_QUEUE, count, echo, norm, note, note_error  # noqa: E402

from dynamic_batching.edge.task import infer  # noqa: E402
from dynamic_batching.gpu_workers.models import synthetic  # noqa: E402
from dynamic_batching.processes import celery_command  # noqa: E402
from dynamic_batching.store import shared_state  # noqa: E402

pytestmark = [pytest.mark.live, pytest.mark.django_db]

HOST = {"queue": HOST_QUEUE}


@pytest.fixture(scope="module")
def host_worker(live_system: LocalSystem) -> Iterator[LocalSystem]:
    """The live system plus a host worker: the site's Celery app, the host's tasks, its
    own queue only."""
    here = str(Path(__file__).resolve().parents[1] / "hostworker")
    cmd = celery_command(
        "batching_site.celery:app", "worker", "-Q", HOST_QUEUE, "-I", "host_tasks", "--pool", "solo", "-n", "host@%h"
    )
    live_system.add("host-worker", cmd, env={"PYTHONPATH": here + os.pathsep + os.environ.get("PYTHONPATH", "")})
    try:
        assert echo.apply_async(("ready?",), **HOST).get(timeout=60) == "ready?"
        yield live_system
    finally:
        live_system.stop("host-worker")


def text(label: str) -> str:
    return f"celery api {label} {uuid.uuid4().hex[:6]}"


def test_delay_returns_the_requests_own_answer(host_worker: LocalSystem) -> None:
    t = text("delay")
    assert infer.delay(t, model="synthetic").get(timeout=30) == synthetic.embed(t)


def test_a_signature_by_name_and_apply_async_with_celery_options(host_worker: LocalSystem) -> None:
    t = text("signature")
    task_id = str(uuid.uuid4())
    result = app.signature("batching.infer", args=[t], kwargs={"model": "synthetic"}).apply_async(
        task_id=task_id, priority=0, expires=60
    )
    assert result.id == task_id
    assert result.get(timeout=30) == synthetic.embed(t)
    assert result.state == "SUCCESS"
    meta = app.backend.get_task_meta(task_id)
    assert meta["batching"]["priority"] == "high", "Celery's priority 0 is the high tier"


def test_send_task_by_name_is_admitted_by_the_worker_that_consumes_it(host_worker: LocalSystem) -> None:
    # A process that does not import the package sends by name: the message lands on the
    # host's queue, and the host's worker (with dynamic_batching installed) admits it.
    t = text("send_task")
    result = app.send_task("batching.infer", args=[t], kwargs={"model": "synthetic"}, queue=HOST_QUEUE)
    assert result.get(timeout=30) == synthetic.embed(t)


def test_send_task_with_a_bad_input_stores_a_clear_error(host_worker: LocalSystem) -> None:
    result = app.send_task("batching.infer", args=[""], kwargs={"model": "synthetic"}, queue=HOST_QUEUE)
    with pytest.raises(ValueError, match="empty"):
        result.get(timeout=30)
    assert result.state == "FAILURE"


def test_a_chain_feeds_the_answer_to_a_host_task(host_worker: LocalSystem) -> None:
    t = text("chain")
    result = chain(infer.s(t, model="synthetic"), norm.s().set(**HOST)).delay()
    assert result.get(timeout=30) == norm(synthetic.embed(t))


def test_a_group_of_batched_requests(host_worker: LocalSystem) -> None:
    texts = [text(f"group {i}") for i in range(12)]
    result = group(infer.s(t, model="synthetic") for t in texts).delay()
    assert result.get(timeout=30) == [synthetic.embed(t) for t in texts]


def test_a_chord_of_batched_requests_and_host_tasks(host_worker: LocalSystem) -> None:
    texts = [text(f"chord {i}") for i in range(6)]
    header = [infer.s(t, model="synthetic") for t in texts] + [echo.s("a host task").set(**HOST)]
    result = chord(header, count.s().set(**HOST)).delay()
    assert result.get(timeout=30) == len(texts) + 1


def test_link_runs_once_with_the_answer(host_worker: LocalSystem) -> None:
    t, key = text("link"), f"host:link:{uuid.uuid4()}"
    result = infer.apply_async((t,), {"model": "synthetic"}, link=note.s(key).set(**HOST))
    assert result.get(timeout=30) == synthetic.embed(t)
    r = shared_state.client()
    noted = poll_until(lambda: r.get(key), "the link callback to run", timeout=30)
    assert noted.decode() == repr(synthetic.embed(t))


def test_link_error_runs_with_the_failed_requests_id(host_worker: LocalSystem) -> None:
    key = f"host:link_error:{uuid.uuid4()}"
    result = infer.apply_async(
        (text("fail !fail"),), {"model": "synthetic"}, link_error=signature(note_error.s(key)).set(**HOST)
    )
    with pytest.raises(Exception, match="fail"):
        result.get(timeout=30)
    r = shared_state.client()
    noted = poll_until(lambda: r.get(key), "the link_error callback to run", timeout=30)
    assert noted.decode() == result.id
