"""RedisMemory: INFO memory's fields in, used/max and the /healthz state out."""

from __future__ import annotations

from typing import Any

import pytest

from dynamic_batching.store.redis_memory import WARN_FRACTION, RedisMemory

GIB = 1 << 30


def test_fields_come_from_info_memory_as_redis_py_parses_it() -> None:
    info = {
        "used_memory": 1_234_567,
        "used_memory_human": "1.18M",
        "maxmemory": 2 * GIB,
        "maxmemory_policy": "noeviction",
    }
    assert RedisMemory.from_info(info) == RedisMemory(used_bytes=1_234_567, max_bytes=2 * GIB)


@pytest.mark.parametrize("info", [{}, {"maxmemory": 10}, {"used_memory": "lots"}, {"used_memory": None}])
def test_a_server_that_does_not_report_used_memory_gives_none(info: dict[str, Any]) -> None:
    assert RedisMemory.from_info(info) is None


def test_no_maxmemory_means_unlimited_with_no_fraction() -> None:
    for info in ({"used_memory": 5}, {"used_memory": 5, "maxmemory": 0}):
        memory = RedisMemory.from_info(info)
        assert memory is not None and memory.max_bytes == 0
        assert memory.fraction is None and memory.state == "unlimited"
        assert memory.to_dict() == {"used_bytes": 5, "max_bytes": 0, "fraction": None, "state": "unlimited"}


@pytest.mark.parametrize(
    ("used", "state"),
    [(0, "ok"), (899, "ok"), (900, "warning"), (1000, "warning"), (1200, "warning")],
)
def test_warning_from_ninety_percent_of_maxmemory(used: int, state: str) -> None:
    assert WARN_FRACTION == 0.9
    memory = RedisMemory(used_bytes=used, max_bytes=1000)
    assert memory.fraction == used / 1000
    assert memory.state == state
    assert memory.to_dict() == {"used_bytes": used, "max_bytes": 1000, "fraction": used / 1000, "state": state}


def test_fraction_is_rounded_for_json() -> None:
    assert RedisMemory(used_bytes=1, max_bytes=3).to_dict()["fraction"] == 0.3333
