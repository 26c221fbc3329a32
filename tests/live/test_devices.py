"""Devices: one worker process per device, pulling one batch at a time, each with its own
queue for pinned work; a CUDA out-of-memory error fails only the inputs that cause it
and never the worker."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pytest
import torch
from batches import batch_of
from celery.result import AsyncResult

from batching_site.celery import app
from batching_site.harness import LocalSystem
from batching_site.processes import default_devices, device_command
from dynamic_batching.collector.loop import Collector
from dynamic_batching.edge.client import details
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.gpu_workers.models.base import BatchRunner
from dynamic_batching.gpu_workers.runner import DeviceRunner
from dynamic_batching.protocol.names import BATCH_QUEUE, BATCH_TASK, SHARED_BATCH_QUEUES, device_queue_name

EMULATED = "dynamic_batching.gpu_workers.models.emulated.EmulatedAcceleratorSpec"

# --- how device workers are started ----------------------------------------------------


def test_device_worker_pulls_from_shared_and_own_queue_one_batch_a_thread() -> None:
    from django.test import override_settings

    from dynamic_batching.gpu_workers import worker

    cmd = device_command("cuda:1")
    assert cmd[cmd.index("--device") + 1] == "cuda:1"
    assert cmd[cmd.index("-Q") + 1] == ",".join([*SHARED_BATCH_QUEUES, device_queue_name("cuda:1")])
    # The pool is the worker's own, from DEVICE_OVERLAP, not the command line's.
    assert "-P" not in cmd and "-c" not in cmd
    assert worker.pool(True) == {"worker_pool": "threads", "worker_concurrency": 2, "worker_prefetch_multiplier": 1}
    assert worker.pool(False) == {"worker_pool": "solo", "worker_concurrency": 1, "worker_prefetch_multiplier": 1}
    # Imported outside a worker (no --device on pytest's command line): as on an accelerator.
    assert worker.app.conf.worker_pool == "threads" and worker.app.conf.worker_concurrency == 2
    # A thread for the batch on the device and one for each the collector sends ahead:
    # with fewer, a batch sent ahead waits in the broker for a thread.
    with override_settings(BATCHING={"COLLECTOR_BATCHES_AHEAD": 2}):
        assert worker.pool(True)["worker_concurrency"] == 3
    with override_settings(BATCHING={"COLLECTOR_BATCHES_AHEAD": 0}):
        assert worker.pool(True)["worker_concurrency"] == 2
    # The batch taking the device waits at most this long for the GIL.
    assert sys.getswitchinterval() == pytest.approx(worker.switch_interval_s(True)) == pytest.approx(0.0005)


def test_a_device_worker_overlaps_batches_on_an_accelerator_not_on_a_cpu() -> None:
    from django.test import override_settings

    from dynamic_batching.gpu_workers import worker

    # Auto: by the device, and by every model the worker loads (the emulated accelerator
    # runs beside the host whatever its device's name).
    assert worker.overlaps("cuda:0", ["minilm"])
    assert not worker.overlaps("cpu:0", ["minilm"])
    assert not worker.overlaps("cpu", ["synthetic"])
    with override_settings(BATCHING={"MODELS": {"minilm-gpu": {"spec": EMULATED, "of": "minilm"}}}):
        assert worker.overlaps("cpu:0", ["minilm-gpu"])
        assert not worker.overlaps("cpu:0", ["minilm-gpu", "minilm"])
    assert not worker.overlaps("cpu:0", ["no-such-model"])
    # Said outright, either way.
    with override_settings(BATCHING={"DEVICE_OVERLAP": True}):
        assert worker.overlaps("cpu:0", ["minilm"])
    with override_settings(BATCHING={"DEVICE_OVERLAP": False}):
        assert not worker.overlaps("cuda:0", ["minilm"])
    # From the worker's own command line, as tasks/processes.py::device_command writes it.
    cmd = device_command("cpu:1", preload="synthetic,minilm")
    assert worker.own_option("--device", cmd) == "cpu:1"
    assert worker.own_option("--preload", cmd) == "synthetic,minilm"
    assert worker.own_option("--device", ["worker", "--device=cuda:2"]) == "cuda:2"
    assert worker.own_option("--device", ["worker"]) is None


def test_devices_setting_wins_else_every_cuda_device_else_two_cpus() -> None:
    assert default_devices(["cuda:3"]) == ["cuda:3"]
    if torch.cuda.is_available():
        assert default_devices([]) == [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    else:
        assert default_devices([]) == ["cpu:0", "cpu:1"]


def test_push_baseline_deals_batches_round_robin_and_pull_uses_the_shared_queue() -> None:
    collector = Collector(app)
    collector.device_names = ["cpu:0", "cpu:1"]
    assert collector.dispatch == "pull"
    assert {collector._queue() for _ in range(4)} == {BATCH_QUEUE}
    collector.dispatch = "push"
    assert [collector._queue() for _ in range(4)] == [device_queue_name("cpu:0"), device_queue_name("cpu:1")] * 2


# --- CUDA out of memory ---------------------------------------------------------------


class OutOfMemoryAbove(BatchRunner):
    """Raises torch's real CUDA OOM error for batches above `fits` inputs, and for any
    batch holding an input marked "huge"; answers like the synthetic model otherwise."""

    def __init__(self, fits: int) -> None:
        self.device = "cuda:0"
        self.fits = fits
        self.calls: list[int] = []
        self.cleanups = 0

    def run_batch(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(len(texts))
        if len(texts) > self.fits or any("huge" in t for t in texts):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return [synthetic.embed(t) for t in texts]

    def after_failure(self, exc: BaseException) -> None:
        assert isinstance(exc, torch.cuda.OutOfMemoryError)
        self.cleanups += 1

    def close(self) -> None:
        pass


def outcome(request: dict[str, object]) -> AsyncResult:
    return AsyncResult(str(request["id"]), app=app)


def test_oom_on_a_big_batch_is_bisected_until_it_fits(bare_runner: DeviceRunner) -> None:
    model = bare_runner._models["synthetic"] = OutOfMemoryAbove(fits=4)
    texts = [f"text {i}" for i in range(16)]
    batch = batch_of(texts)
    bare_runner.execute(batch)
    assert model.calls == [16, 8, 4, 4, 8, 4, 4]
    # Cached memory is released after each failed attempt, before its halves run.
    assert model.cleanups == 3
    for req, text in zip(batch["requests"], texts, strict=True):  # type: ignore[call-overload]
        assert outcome(req).get(timeout=5) == synthetic.embed(text)


def test_oom_caused_by_one_input_fails_only_that_input_and_the_worker_goes_on(bare_runner: DeviceRunner) -> None:
    bare_runner._models["synthetic"] = OutOfMemoryAbove(fits=64)
    texts = [f"text {i}" for i in range(8)]
    texts[5] = "a huge input"
    batch = batch_of(texts)
    summary = bare_runner.execute(batch)
    assert summary["written"] == 8
    for req, text in zip(batch["requests"], texts, strict=True):  # type: ignore[call-overload]
        if text == "a huge input":
            # The model's own exception, rebuilt by Celery with its type and message.
            with pytest.raises(torch.cuda.OutOfMemoryError, match="CUDA out of memory"):
                outcome(req).get(timeout=5)
        else:
            assert outcome(req).get(timeout=5) == synthetic.embed(text)

    # The same runner (the same worker process) takes the next batch as if nothing happened.
    after = batch_of(["next batch one", "next batch two"])
    bare_runner.execute(after)
    assert [outcome(r).get(timeout=5) for r in after["requests"]] == [  # type: ignore[attr-defined]
        synthetic.embed("next batch one"),
        synthetic.embed("next batch two"),
    ]


# --- pinned work ------------------------------------------------------------------------


@pytest.mark.live
def test_work_pinned_to_a_device_queue_runs_on_that_device(live_system: LocalSystem) -> None:
    for device in ("cpu:0", "cpu:1"):
        batch = batch_of([f"pinned to {device} #{i}" for i in range(3)])
        app.send_task(BATCH_TASK, args=[batch], task_id=batch["batch_id"], queue=device_queue_name(device))
        for req in batch["requests"]:  # type: ignore[attr-defined]
            assert outcome(req).get(timeout=30) == synthetic.embed(req["input"])
            assert details(req["id"])["device"].startswith(device + "@")
