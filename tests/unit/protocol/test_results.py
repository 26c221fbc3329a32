"""result_meta(): what a caller's AsyncResult reads back for a success or a failure."""

from __future__ import annotations

import json

import pytest
from celery import states

from batching_site.celery import app
from dynamic_batching.core.errors import Overloaded
from dynamic_batching.protocol.results import Outcome, result_meta

DONE = "2025-01-02T03:04:05.000000+00:00"


def test_success_meta_carries_the_result_and_the_details() -> None:
    details = {"batch_id": "b1", "device": "cpu:0", "run_ms": 12}
    meta = result_meta(Outcome("r1", result={"embedding": [0.5, 1.0]}, details=details), app.backend, DONE)
    assert meta == {
        "status": states.SUCCESS,
        "result": {"embedding": [0.5, 1.0]},
        "traceback": None,
        "children": [],
        "date_done": DONE,
        "task_id": "r1",
        "batching": details,
    }
    assert json.loads(json.dumps(meta)) == meta, "storable as JSON"


def test_failure_meta_rebuilds_the_requests_own_exception() -> None:
    meta = result_meta(Outcome("r2", error=Overloaded("requests", 10, 1.5)), app.backend, DONE)
    assert meta["status"] == states.FAILURE and meta["task_id"] == "r2"
    assert meta["traceback"] is None, "an error that was never raised has no traceback"
    json.dumps(meta)
    exc = app.backend.exception_to_python(meta["result"])
    assert isinstance(exc, Overloaded)
    assert (exc.queue, exc.cap, exc.retry_after) == ("requests", 10, 1.5)


def test_failure_meta_keeps_the_traceback_of_a_raised_error() -> None:
    try:
        raise ValueError("model exploded")
    except ValueError as e:
        error = e
    meta = result_meta(Outcome("r3", error=error, details={"batch_id": "b3"}), app.backend, DONE)
    assert meta["status"] == states.FAILURE and meta["batching"] == {"batch_id": "b3"}
    assert "ValueError: model exploded" in meta["traceback"]
    with pytest.raises(ValueError, match="model exploded"):
        raise app.backend.exception_to_python(meta["result"])
