"""fits(): a batch costs its size times its longest request, and must stay within the budget."""

from __future__ import annotations

from dynamic_batching.core.budget import fits


def test_a_request_that_brings_the_batch_exactly_to_the_budget_fits() -> None:
    # 3 requests padded to 10, plus one of 10: 4 x 10 = 40 padded tokens.
    assert fits(size=3, padded_len=10, tokens=10, budget=40)


def test_a_request_below_the_budget_fits() -> None:
    assert fits(size=3, padded_len=10, tokens=10, budget=100)
    # A shorter request is padded up to the batch's longest: still 4 x 10.
    assert fits(size=3, padded_len=10, tokens=2, budget=40)


def test_a_request_that_passes_the_budget_does_not_fit() -> None:
    assert not fits(size=3, padded_len=10, tokens=10, budget=39)


def test_a_longer_request_pads_everyone_already_in_the_batch() -> None:
    # Real tokens would be 3 x 10 + 12 = 42, under 45; but all four are padded to 12.
    assert 3 * 10 + 12 <= 45
    assert not fits(size=3, padded_len=10, tokens=12, budget=45)
    assert fits(size=3, padded_len=10, tokens=12, budget=48)


def test_the_first_request_of_an_empty_batch_costs_its_own_length() -> None:
    assert fits(size=0, padded_len=0, tokens=512, budget=512)
    assert not fits(size=0, padded_len=0, tokens=513, budget=512)
