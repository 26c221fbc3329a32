"""timeline(): a request's events, in order, as the API and its page show them."""

from __future__ import annotations

from celery import states

from dynamic_batching.reporting.timeline import json_safe, timeline

DETAILS = {
    "priority": "high",
    "submitted_at": 100.0,
    "dispatched_at": 100.5,
    "batch_id": "b1",
    "batch_size": 4,
    "padded_tokens": 40,
    "real_tokens": 30,
    "waited_ms": 500,
    "started_at": 100.6,
    "device": "cpu:0",
    "run_ms": 20,
}


def test_a_success_is_submitted_dispatched_started_finished_in_order() -> None:
    events = timeline(states.SUCCESS, DETAILS, done_at=100.7)
    assert [(e["event"], e["at"]) for e in events] == [
        ("submitted", 100.0),
        ("dispatched", 100.5),
        ("started", 100.6),
        ("finished", 100.7),
    ]
    submitted, dispatched, started, finished = (e["text"] for e in events)
    assert "high priority" in submitted
    assert "batch b1 of 4" in dispatched and "fill 75%" in dispatched and "500 ms" in dispatched
    assert "cpu:0" in started and "alone" not in started
    assert finished.startswith("succeeded") and "20 ms" in finished and "truncated" not in finished


def test_a_truncated_isolated_success_says_so() -> None:
    events = timeline(states.SUCCESS, {**DETAILS, "truncated": True, "isolated": True}, done_at=101.0)
    assert "alone" in events[2]["text"] and "truncated" in events[3]["text"]


def test_a_failure_finishes_with_its_error() -> None:
    events = timeline(states.FAILURE, DETAILS, done_at=101.0, error="InferenceError: out of memory")
    assert events[-1] == {"event": "finished", "at": 101.0, "text": "failed: InferenceError: out of memory"}


def test_a_request_not_yet_done_ends_pending() -> None:
    events = timeline(states.PENDING, {"submitted_at": 100.0, "priority": "low"}, done_at=None)
    assert [e["event"] for e in events] == ["submitted", "pending"] and events[-1]["at"] is None


def test_an_unknown_request_is_only_pending() -> None:
    assert [e["event"] for e in timeline(states.PENDING, {}, done_at=None)] == ["pending"]


def test_json_safe_nulls_only_the_numbers_json_has_not() -> None:
    nan, inf = float("nan"), float("inf")
    answer = {"v": [1.5, nan, -inf, 0], "pair": (inf, "text"), "ok": True, "none": None, "deep": [[[nan]]]}
    assert json_safe(answer) == {
        "v": [1.5, None, None, 0],
        "pair": [None, "text"],
        "ok": True,
        "none": None,
        "deep": [[[None]]],
    }
    assert json_safe("NaN") == "NaN" and json_safe(7) == 7


def test_an_owner_sees_their_own_fields_only_never_the_batchs() -> None:
    # Issue 42, finding 6: batch_size and padded tokens, with the owner's own token count,
    # gave away the lengths of other tenants' inputs in the same batch.
    from dynamic_batching.reporting.timeline import SHARED_FIELDS, own_details

    mine = own_details(DETAILS, staff=False)
    assert not set(SHARED_FIELDS) & set(mine) and mine["waited_ms"] == DETAILS["waited_ms"]
    assert own_details(DETAILS, staff=True) == DETAILS
    events = {e["event"]: e["text"] for e in timeline(states.SUCCESS, mine, done_at=100.7)}
    assert events["dispatched"] == "after waiting 500 ms" and events["started"] == "on a device"
