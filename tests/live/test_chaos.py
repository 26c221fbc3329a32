"""Nothing lost, nothing answered twice, nothing stuck: real processes, killed for real.

These tests run their own system (so they can kill its processes) with a short
visibility timeout, so that messages held by a killed process come back in seconds.
`make chaos` runs this file five times in a row.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from celery.result import AsyncResult
from django.conf import settings

from batching_site.celery import app
from batching_site.harness import LocalSystem
from gpu_workers.models import synthetic
from tasks.core.policy import BatchPolicy
from tasks.edge.client import details, submit, submit_many
from tasks.edge.intake import accept
from tasks.protocol import wire
from tasks.protocol.names import ANSWERS_KEY, REQUEST_TASK, request_queue_name
from tasks.store import ledger, shared_state
from tasks.store.connection import connect

pytestmark = pytest.mark.live

N_REQUESTS = 500
N_THREADS = 8


@pytest.fixture(scope="module")
def chaos_system() -> Iterator[LocalSystem]:
    previous = settings.REDIS_URL
    system = LocalSystem(
        devices=["cpu:0", "cpu:1"],
        preload="synthetic",
        env={
            "VISIBILITY_TIMEOUT_S": "4",
            "SYNTHETIC_OVERHEAD_S": "0.004",
            "SYNTHETIC_PER_TOKEN_S": "0.0006",
        },
    )
    try:
        system.start(timeout=120)
        assert system.redis_url
        connect(system.redis_url)
        yield system
    finally:
        system.close()
        connect(previous)


def answers() -> dict[str, int]:
    raw = shared_state.client().hgetall(ANSWERS_KEY)
    return {k.decode(): int(v) for k, v in raw.items()}


def texts_for(run: str, n: int = N_REQUESTS) -> list[str]:
    return [f"{run} request {i} " + "word " * (i % 17) for i in range(n)]


def load_with(fault: callable, run: str) -> None:  # type: ignore[valid-type]
    """Put N_REQUESTS in flight from N_THREADS threads, inject `fault` once some answers
    have come back, and check that every caller gets exactly its own answer."""
    texts = texts_for(run)
    before = answers().get("first", 0)
    results: dict[int, object] = {}
    lock = threading.Lock()

    def submitter(k: int) -> None:
        mine = list(range(k, N_REQUESTS, N_THREADS))
        for i, r in zip(mine, submit_many([texts[i] for i in mine], model="synthetic"), strict=True):
            with lock:
                results[i] = r

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == N_REQUESTS

    deadline = time.monotonic() + 30
    while answers().get("first", 0) - before < N_REQUESTS // 10:
        assert time.monotonic() < deadline, "no progress before the fault"
        time.sleep(0.01)
    fault()

    for i in range(N_REQUESTS):
        r = results[i]
        assert r.get(timeout=90) == synthetic.embed(texts[i]), f"request {i} got a wrong answer"  # type: ignore[attr-defined]
        assert r.state == "SUCCESS"  # type: ignore[attr-defined]
    # Exactly one first answer per request: a redelivered batch rewrote nothing.
    assert answers().get("first", 0) - before == N_REQUESTS


def test_device_worker_killed_mid_batch_loses_nothing(chaos_system: LocalSystem) -> None:
    def kill_and_restart() -> None:
        chaos_system.stop("gpu-cpu0", signal.SIGKILL)
        chaos_system.start_device("cpu:0")

    load_with(kill_and_restart, "device-kill")
    chaos_system.wait_ready(2)


def test_collector_killed_loses_nothing(chaos_system: LocalSystem) -> None:
    def kill_and_restart() -> None:
        chaos_system.stop("collector", signal.SIGKILL)
        chaos_system.start_collector()

    load_with(kill_and_restart, "collector-kill")
    chaos_system.wait_ready(2)
    # What the killed collector held, the new one adopted from Redis at start: nothing
    # needed the ledger's repair.
    assert (shared_state.read_collector() or {}).get("stats", {}).get("republished", 0) == 0


def test_an_accepted_request_that_went_missing_is_queued_again(chaos_system: LocalSystem) -> None:
    # As if a device worker had died between popping a batch and recording it unacked:
    # the request is in the ledger, and nowhere else.
    task_id = str(uuid.uuid4())
    text = "lost after acceptance"
    request = accept(text, model="synthetic", policy=BatchPolicy(), default_model="synthetic")
    raw = wire.task_message(app, REQUEST_TASK, task_id, [request.to_message()], request_queue_name("normal"))
    r = shared_state.client()
    r.zadd(ledger.LEDGER_KEY, {task_id: time.time() - 3600})
    r.hset(ledger.PAYLOADS_KEY, task_id, raw)
    # The collector sweeps the ledger every few seconds.
    assert AsyncResult(task_id, app=app).get(timeout=30) == synthetic.embed(text)
    assert r.zscore(ledger.LEDGER_KEY, task_id) is None, "the answer strikes it off the ledger"


def test_poison_input_fails_alone_in_a_batch_of_32(chaos_system: LocalSystem) -> None:
    texts = [f"poison test {i}" for i in range(32)]
    texts[9] = "poison test !fail"
    results = submit_many(texts, model="synthetic")
    outcomes = []
    for t, r in zip(texts, results, strict=True):
        try:
            outcomes.append(r.get(timeout=60) == synthetic.embed(t))
        except Exception as exc:  # noqa: BLE001 - the one expected failure
            assert "!fail" in t and "PoisonInput" in str(exc)
            outcomes.append("error")
    assert outcomes.count(True) == 31 and outcomes.count("error") == 1


def test_slow_inputs_are_isolated_and_remembered(chaos_system: LocalSystem) -> None:
    # Warm the devices' cost models with normal batches first.
    for r in submit_many([f"warm up {i} " + "w " * (i % 9) for i in range(200)], model="synthetic"):
        r.get(timeout=60)
    slow_text = "this input is pathological !slow " + "x " * 20
    normal = [f"steady {i} " + "w " * (i % 9) for i in range(40)]
    first = submit_many([*normal[:20], slow_text, *normal[20:]], model="synthetic")
    for r in first:
        r.get(timeout=60)
    d = details(first[20])
    assert d["isolated"] is True, d
    assert all(not details(r)["isolated"] for i, r in enumerate(first) if i != 20)
    # Seen once, it never shares a batch again: it goes straight to the slow lane.
    deadline = time.monotonic() + 10
    while True:
        again = submit(slow_text, model="synthetic")
        again.get(timeout=60)
        if details(again)["batch_size"] == 1 and details(again)["isolated"]:
            break
        assert time.monotonic() < deadline, details(again)


def test_broken_device_opens_its_circuit_and_healthy_devices_answer(chaos_system: LocalSystem) -> None:
    BROKEN = f"cpu:2@{socket.gethostname()}"  # noqa: N806 - the device id its heartbeat uses
    chaos_system.start_device("cpu:2", env={"SYNTHETIC_BROKEN": "1", "CIRCUIT_COOLDOWN_S": "2"})
    try:
        chaos_system.wait_ready(3)
        texts = [f"circuit test {i} " + "w " * (i % 11) for i in range(300)]
        results = submit_many(texts, model="synthetic")
        for t, r in zip(texts, results, strict=True):
            assert r.get(timeout=90) == synthetic.embed(t)
        assert all(details(r)["device"] != BROKEN for r in results)
        # Its heartbeat reports the trip within a beat or two.
        deadline = time.monotonic() + 3 * shared_state.HEARTBEAT_EVERY_S
        while shared_state.live_devices()[BROKEN]["circuit_trips"] < 1:
            assert time.monotonic() < deadline, shared_state.live_devices()[BROKEN]
            time.sleep(0.05)
    finally:
        chaos_system.stop("gpu-cpu2")
        shared_state.forget_device(BROKEN)
