"""The legs between two batches on one device, from each batch's own record."""

from __future__ import annotations

import pytest

from bench.device_gaps import Ran, legs


def test_a_batch_sent_after_the_run_ended_and_one_already_queued() -> None:
    # Ran(device, started, dispatched, run_s, size): on cpu:0 the second batch was sent 7 ms
    # after the first run ended and started 3 ms later; the third was queued before the
    # second ended and started 2 ms after it. cpu:1's lone batch has no pair.
    batches = {
        "a": Ran("cpu:0", 10.000, 9.990, 0.100, 4),
        "b": Ran("cpu:0", 10.110, 10.107, 0.050, 5),
        "c": Ran("cpu:0", 10.162, 10.140, 0.020, 3),
        "d": Ran("cpu:1", 10.050, 10.040, 0.100, 4),
    }
    out = legs(batches)
    assert out["run end -> next dispatched"] == pytest.approx([0.007, -0.020])
    assert out["-> started"] == pytest.approx([0.003, 0.002])
    assert out["gap"] == pytest.approx([0.010, 0.002])
