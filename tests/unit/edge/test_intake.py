"""accept(): what the edge refuses before anything is counted or queued."""

from __future__ import annotations

import math

import pytest

from dynamic_batching.core.policy import BatchPolicy
from dynamic_batching.edge.intake import accept


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_an_input_holding_nan_or_infinity_is_refused_as_not_json(number: float) -> None:
    # Messages are written by orjson, which would turn the number into null.
    with pytest.raises(TypeError, match="NaN or Infinity"):
        accept({"values": [1.0, number]}, policy=BatchPolicy(), default_model="synthetic")


def test_an_input_that_is_not_json_at_all_is_refused() -> None:
    with pytest.raises(TypeError, match="input must be JSON"):
        accept({1, 2}, policy=BatchPolicy(), default_model="synthetic")
