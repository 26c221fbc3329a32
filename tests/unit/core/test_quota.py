"""A client's quota: validated up front, its tier share never zero."""

from __future__ import annotations

import pytest

from dynamic_batching.core.quota import Quota


def test_defaults_are_valid_and_share_is_at_least_one() -> None:
    q = Quota()
    assert q.share_of(2000) == 1000
    assert Quota(tier_share=0.01).share_of(10) == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rate_per_s", 0),
        ("rate_per_s", float("inf")),
        ("burst", 0),
        ("burst", 1.5),
        ("max_in_flight", True),
        ("tier_share", 0),
        ("tier_share", 1.5),
    ],
)
def test_each_bad_value_is_named(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{field} "):
        Quota(**{field: value})  # type: ignore[arg-type]


def test_from_settings_casts_and_names_unknown_fields() -> None:
    q = Quota.from_mapping({"rate_per_s": 2.0, "burst": 10.0, "max_in_flight": 20.0, "tier_share": 0.05})
    assert (q.burst, q.max_in_flight) == (10, 20) and isinstance(q.burst, int)
    with pytest.raises(ValueError, match="unknown quota field"):
        Quota.from_mapping({"rate": 1})


def test_a_refusal_is_remembered_for_its_window_only() -> None:
    from dynamic_batching.core.quota import RefusalMemory

    now = [100.0]
    memory = RefusalMemory(clock=lambda: now[0], size=2)
    memory.remember("a", 0.5, "rate")
    assert memory.recall("a") == ("rate", 0.5)
    now[0] = 100.4
    assert memory.recall("a") == ("rate", pytest.approx(0.1))
    now[0] = 100.5
    assert memory.recall("a") is None and memory.recall("b") is None
    for key in ("a", "b", "c"):
        memory.remember(key, 1.0, key)
    assert memory.recall("a") is None and memory.recall("c") == ("c", 1.0), "the oldest goes first"
