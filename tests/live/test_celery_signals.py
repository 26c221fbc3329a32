"""Celery's per-task signals fire in the device worker for each batched request, so an
integration that listens to them (Sentry, OpenTelemetry) reports each request's success
or failure; a request's own failure is logged there once, with its id (issue 39)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from polling import poll_until

from batching_site.processes import device_command
from dynamic_batching.edge.client import submit_many
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.store import shared_state

pytestmark = pytest.mark.live

HERE = str(Path(__file__).resolve().parents[1] / "hostworker")


def test_task_signals_fire_per_request_in_the_device_worker(bare_redis) -> None:  # type: ignore[no-untyped-def]
    bare_redis.start_collector()
    bare_redis.add(
        "gpu-cpu5",
        [*device_command("cpu:5", preload="synthetic"), "-I", "signal_probe"],
        env={"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )
    bare_redis.wait_ready(1)
    good, bad = submit_many(["heard of once", "refused !fail"], model="synthetic")
    assert good.get(timeout=30) == synthetic.embed("heard of once")
    with pytest.raises(synthetic.PoisonInput):
        bad.get(timeout=30)
    assert "PoisonInput" in (bad.traceback or "") and "run_batch" in bad.traceback, bad.traceback

    r = shared_state.client()
    assert poll_until(lambda: r.get(f"probe:success:{good.id}"), "task_success for the good request", timeout=10)
    assert poll_until(lambda: r.get(f"probe:failure:{bad.id}"), "task_failure for the bad one", timeout=10) == (
        b"PoisonInput"
    )
    assert r.get(f"probe:failure:{good.id}") is None and r.get(f"probe:success:{bad.id}") is None
    log = Path(bare_redis.log_dir, "gpu-cpu5.log").read_text()
    assert sum(bad.id in line and "raised unexpected" in line for line in log.splitlines()) == 1, "logged once"
