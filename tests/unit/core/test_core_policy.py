"""BatchPolicy: validation names the field and the value; dict round trip; frozen."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

from dynamic_batching.core.policy import PRIORITIES, BatchPolicy


def test_defaults_are_valid() -> None:
    p = BatchPolicy()
    assert p.max_batch_size >= 1 and p.max_batch_tokens >= 1
    assert set(p.weights) == set(PRIORITIES) == set(p.queue_caps)
    assert math.isclose(sum(p.share(t) for t in PRIORITIES), 1.0)
    assert p.share("high") == 0.6 and p.share("low") == 0.1


def test_every_request_has_a_deadline_by_default() -> None:
    # A caller blocked on .get() with no timeout is always answered (DeadlineExceeded
    # at worst): the default is finite, and the admin's form starts from it.
    from dynamic_batching.models import BatchingPolicy

    assert BatchPolicy().default_deadline_s == 300.0
    assert BatchingPolicy().default_deadline_s == 300.0


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("max_batch_size", 0, "0"),
        ("max_batch_size", -3, "-3"),
        ("max_batch_size", 2.5, "2.5"),
        ("max_batch_size", "32", "'32'"),
        ("max_batch_size", True, "True"),
        ("max_batch_size", None, "None"),
        ("max_batch_tokens", 0, "0"),
        ("max_batch_tokens", 10.0, "10.0"),
        ("max_wait_ms", -1, "-1"),
        ("max_wait_ms", float("nan"), "nan"),
        ("max_wait_ms", float("inf"), "inf"),
        ("max_wait_ms", "5", "'5'"),
        ("max_wait_ms", False, "False"),
        ("aging_ms", 0, "0"),
        ("aging_ms", 0.5, "0.5"),
        ("aging_ms", None, "None"),
        ("oversized", "drop", "'drop'"),
        ("oversized", None, "None"),
        ("default_deadline_s", 0, "0"),
        ("default_deadline_s", -1.0, "-1.0"),
        ("default_deadline_s", float("inf"), "inf"),
        ("default_deadline_s", "1", "'1'"),
        ("version", -1, "-1"),
        ("version", 1.0, "1.0"),
    ],
)
def test_invalid_scalar_names_field_and_value(field: str, value: Any, shown: str) -> None:
    with pytest.raises(ValueError) as info:
        BatchPolicy(**{field: value})
    message = str(info.value)
    assert field in message
    assert shown in message


@pytest.mark.parametrize("field", ["weights", "queue_caps"])
@pytest.mark.parametrize(
    ("value", "names", "shown"),
    [
        ({"high": 6, "normal": 3}, None, "'normal': 3"),  # a tier missing
        ({"high": 6, "normal": 3, "low": 1, "urgent": 9}, None, "'urgent'"),  # an unknown tier
        ([6, 3, 1], None, "[6, 3, 1]"),  # not a dict
        ({"high": 6, "normal": 0, "low": 1}, "[normal]", "0"),
        ({"high": 6, "normal": 3, "low": -2}, "[low]", "-2"),
        ({"high": 1.5, "normal": 3, "low": 1}, "[high]", "1.5"),
        ({"high": True, "normal": 3, "low": 1}, "[high]", "True"),
    ],
)
def test_invalid_tiers_name_field_tier_and_value(field: str, value: Any, names: str | None, shown: str) -> None:
    with pytest.raises(ValueError) as info:
        BatchPolicy(**{field: value})
    message = str(info.value)
    assert field + (names or "") in message
    assert shown in message


def test_boundary_values_are_accepted() -> None:
    p = BatchPolicy(
        max_batch_size=1,
        max_batch_tokens=1,
        max_wait_ms=0,
        aging_ms=1,
        weights={"high": 1, "normal": 1, "low": 1},
        queue_caps={"high": 1, "normal": 1, "low": 1},
        oversized="run_alone",
        default_deadline_s=0.001,
        version=0,
    )
    assert p.max_wait_s == 0.0 and p.aging_s == 0.001


@pytest.mark.parametrize("action", ["reject", "truncate", "run_alone"])
def test_each_oversized_action_is_accepted(action: str) -> None:
    assert BatchPolicy(oversized=action).oversized == action


def test_round_trip_through_dict_and_json() -> None:
    p = BatchPolicy(
        max_batch_size=8,
        max_batch_tokens=4096,
        max_wait_ms=2.5,
        weights={"high": 5, "normal": 4, "low": 2},
        aging_ms=750.0,
        queue_caps={"high": 10, "normal": 20, "low": 30},
        oversized="truncate",
        default_deadline_s=3.0,
        version=7,
    )
    d = p.to_dict()
    assert d["weights"] == {"high": 5, "normal": 4, "low": 2}
    assert BatchPolicy.from_dict(d) == p
    assert BatchPolicy.from_dict(json.loads(json.dumps(d))) == p
    assert BatchPolicy.from_dict(BatchPolicy().to_dict()) == BatchPolicy()


def test_to_dict_is_a_copy() -> None:
    p = BatchPolicy()
    d = p.to_dict()
    d["weights"]["high"] = 99
    assert p.weights["high"] == 6


def test_from_dict_ignores_unknown_keys_and_fills_defaults() -> None:
    p = BatchPolicy.from_dict({"max_batch_size": 4, "added_in_v9": True, "another": {"x": 1}})
    assert p == BatchPolicy(max_batch_size=4)


def test_from_dict_still_validates() -> None:
    with pytest.raises(ValueError, match="max_batch_size.*0"):
        BatchPolicy.from_dict({"max_batch_size": 0})


def test_frozen() -> None:
    p = BatchPolicy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.max_batch_size = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.weights = {}  # type: ignore[misc]


def test_callers_dicts_are_copied() -> None:
    weights = {"high": 6, "normal": 3, "low": 1}
    p = BatchPolicy(weights=weights)
    weights["high"] = 100
    assert p.weights["high"] == 6
    assert p.share("high") == 0.6


def test_evolve_validates_and_leaves_the_original_alone() -> None:
    p = BatchPolicy()
    q = p.evolve(max_batch_size=4, version=1)
    assert (q.max_batch_size, q.version) == (4, 1)
    assert p.max_batch_size == 32
    with pytest.raises(ValueError, match="max_wait_ms"):
        p.evolve(max_wait_ms=-5)
