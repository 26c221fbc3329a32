"""The no-op ceiling projected to a larger machine, from CPU per request by process."""

from __future__ import annotations

import pytest

from bench.cpu import projected_ceiling


def test_the_cores_bind_while_every_single_process_has_room() -> None:
    ms = {"collector": 0.1, "redis": 0.1, "client": 0.4, "gpu-cpu0": 0.2, "gpu-cpu1": 0.2}
    rate, bound = projected_ceiling(ms, 2, ["collector", "redis"])
    assert bound == "all 2 cores"
    assert rate == pytest.approx(2000.0)


def test_a_single_process_binds_on_a_large_machine() -> None:
    ms = {"collector": 0.2, "redis": 0.1, "client": 0.4, "gpu-cpu0": 0.2, "gpu-cpu1": 0.2}
    rate, bound = projected_ceiling(ms, 16, ["collector", "redis"])
    assert bound == "collector"
    assert rate == pytest.approx(5000.0)


def test_nothing_measured_binds_nothing() -> None:
    assert projected_ceiling({}, 16, ["redis"]) == (float("inf"), "nothing")
