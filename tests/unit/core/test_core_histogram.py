"""The bucketed histograms behind the wait, size and fill metrics: pure, fake clock."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamic_batching.core.histogram import (
    FINE_BOUNDS_S,
    WAIT_BOUNDS_S,
    Histogram,
    RollingHistogram,
    RollingSum,
    geometric_bounds,
)


def test_values_land_in_prometheus_le_buckets() -> None:
    h = Histogram((1.0, 2.0, 5.0))
    for v in (0.5, 1.0, 1.5, 2.0, 4.0, 9.0):
        h.observe(v)
    assert h.counts == [2, 2, 1, 1]  # (..1], (1..2], (2..5], (5..+Inf)
    assert h.cumulative() == [(1.0, 2), (2.0, 4), (5.0, 5), (math.inf, 6)]
    assert h.count == 6 and h.total == pytest.approx(18.0)


def test_quantile_interpolates_inside_its_bucket() -> None:
    h = Histogram((10.0, 20.0))
    h.observe(15.0, n=100)
    assert h.quantile(0.5) == pytest.approx(15.0)
    assert h.quantile(0.0) == pytest.approx(10.0)
    assert Histogram((1.0,)).quantile(0.99) is None
    overflow = Histogram((1.0,))
    overflow.observe(50.0)
    assert overflow.quantile(0.99) == 1.0  # a floor: all Prometheus can say too


@given(st.lists(st.floats(min_value=0.0002, max_value=500.0), min_size=1, max_size=400))
def test_fine_quantiles_are_within_twenty_percent(values: list[float]) -> None:
    h = Histogram(FINE_BOUNDS_S)
    for v in values:
        h.observe(v)
    ordered = sorted(values)
    for q in (0.5, 0.99):
        got = h.quantile(q)
        assert got is not None
        # The true value at this rank lies in the same bucket, which spans a ratio of 1.2.
        rank = max(0, math.ceil(q * len(ordered)) - 1)
        true = ordered[rank]
        assert true / 1.2 - 1e-12 <= got <= true * 1.2 + 1e-12, (q, got, true)


def test_fields_round_trip_through_a_redis_hash() -> None:
    h = Histogram(WAIT_BOUNDS_S)
    for v in (0.0001, 0.03, 0.03, 200.0):
        h.observe(v)
    stored = {k.encode(): str(v).encode() for k, v in h.to_fields().items()}
    back = Histogram.from_fields(WAIT_BOUNDS_S, stored)
    assert back.counts == h.counts and back.total == pytest.approx(h.total)
    assert Histogram(WAIT_BOUNDS_S).to_fields() == {}


def test_add_requires_the_same_bounds() -> None:
    a, b = Histogram((1.0, 2.0)), Histogram((1.0, 2.0))
    a.observe(0.5)
    b.observe(1.5)
    a.add(b)
    assert a.counts == [1, 1, 0]
    with pytest.raises(ValueError, match="different bounds"):
        a.add(Histogram((1.0,)))


def test_bad_bounds_are_refused_with_the_values_named() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        Histogram((2.0, 1.0))
    with pytest.raises(ValueError, match="ratio > 1"):
        geometric_bounds(1.0, 2.0, 1.0)
    with pytest.raises(ValueError, match="q must be"):
        Histogram((1.0,)).quantile(1.5)


def test_rolling_histogram_forgets_observations_older_than_its_window() -> None:
    rh = RollingHistogram((1.0, 10.0), window_s=60.0, slot_s=1.0)
    rh.observe(0.5, now=1000.0)
    rh.observe(5.0, now=1030.0)
    assert rh.snapshot(1030.0).count == 2
    assert rh.snapshot(1060.5).counts == [0, 1, 0]  # the first has aged out
    assert rh.snapshot(1100.0).count == 0


def test_rolling_sum_totals_the_window_only() -> None:
    rs = RollingSum(("a", "b"), window_s=10.0)
    rs.add(0.0, a=1, b=2)
    rs.add(5.0, a=3)
    assert rs.totals(5.0) == {"a": 4.0, "b": 2.0}
    assert rs.totals(12.0) == {"a": 3.0, "b": 0.0}


def test_many_random_observations_match_the_count() -> None:
    rng = random.Random(3)
    h = Histogram(WAIT_BOUNDS_S)
    values = [rng.expovariate(20) for _ in range(5000)]
    for v in values:
        h.observe(v)
    assert h.count == 5000
    assert h.mean() == pytest.approx(sum(values) / len(values))
