"""The ledger sweep's rule for "lost": pure, on made-up times."""

from __future__ import annotations

import math

from dynamic_batching.store.ledger import lost

INF = math.inf


def test_an_entry_older_than_its_queues_oldest_waiting_request_and_not_held_is_lost() -> None:
    candidates = [("a", 10.0, "normal"), ("b", 50.0, "normal"), ("c", 10.0, "high")]
    # normal's oldest waiting request was touched at 40: a (10) cannot be in that queue,
    # b (50) may be waiting behind it. high's queue is empty: c is nowhere.
    assert lost(candidates, held={}, oldest_waiting={"normal": 40.0, "high": INF}) == ["a", "c"]


def test_a_backlog_never_stops_the_sweep() -> None:
    # Under sustained load the queue is never empty; what was dispatched and lost
    # before the oldest waiting request was queued is still found.
    candidates = [(f"r{i}", float(i), "low") for i in range(100)]
    assert lost(candidates, held={}, oldest_waiting={"low": 60.0}) == [f"r{i}" for i in range(60)]


def test_held_requests_are_never_lost() -> None:
    assert lost([("a", 1.0, "normal")], held={"a": object()}, oldest_waiting={"normal": INF}) == []


def test_when_the_queue_head_cannot_be_told_nothing_is_called_lost() -> None:
    # -inf: the oldest queued message has no ledger entry; wait for the next sweep.
    assert lost([("a", 1.0, "normal")], held={}, oldest_waiting={"normal": -INF}) == []


def test_a_message_of_no_known_tier_is_left_alone() -> None:
    assert lost([("a", 1.0, None)], held={}, oldest_waiting={"normal": INF}) == []
