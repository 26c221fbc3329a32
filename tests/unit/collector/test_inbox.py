"""The collector's inbox: request messages and device events, well-formed or not."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace

import pytest

from batching_site.celery import app
from dynamic_batching.collector.inbox import Held, parse_event, parse_request, to_item
from dynamic_batching.protocol import wire
from dynamic_batching.protocol.names import EVENTS_QUEUE, REQUEST_TASK, request_queue_name
from dynamic_batching.protocol.request import Request

REQ = Request(input="hello", tokens=3, model="synthetic", priority="normal", submitted_at=100.0, deadline_at=130.0)


def message(args: list, *, task: str = REQUEST_TASK, task_id: str = "req-1") -> bytes:
    return wire.task_message(app, task, task_id, args, request_queue_name("normal")).encode()


def raw_envelope(body: object, headers: object) -> bytes:
    return json.dumps({"body": json.dumps(body), "headers": headers}).encode()


def test_parse_request_round_trips_a_request() -> None:
    assert parse_request(message([REQ.to_message()]), "normal") == ("req-1", REQ)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(message([REQ.to_message()], task="other.task"), id="wrong task name"),
        pytest.param(message([REQ.to_message()], task_id=""), id="missing id"),
        pytest.param(raw_envelope([[REQ.to_message()], {}, {}], {"task": REQUEST_TASK}), id="no id header"),
        pytest.param(b"\xff\xfe not json", id="garbage bytes"),
        pytest.param(b"[1, 2]", id="a JSON list"),
        pytest.param("\ud800", id="lone surrogate text"),
        pytest.param(message(["not a dict"]), id="argument not a dict"),
        pytest.param(message([{"bogus": 1}]), id="unknown fields"),
    ],
)
def test_parse_request_refuses_a_malformed_message(raw: bytes | str) -> None:
    with pytest.raises((ValueError, TypeError)):
        parse_request(raw, "normal")  # type: ignore[arg-type]


def test_parse_request_refuses_a_request_queued_on_another_priority() -> None:
    with pytest.raises(ValueError, match="priority"):
        parse_request(message([REQ.to_message()]), "high")


def test_parse_request_with_no_arguments() -> None:
    with pytest.raises(ValueError):
        parse_request(message([]), "normal")


def test_parse_request_with_headers_not_a_dict() -> None:
    with pytest.raises(ValueError):
        parse_request(raw_envelope([[REQ.to_message()], {}, {}], [1]), "normal")


def test_to_item_turns_wall_clock_age_and_deadline_into_the_collector_clock() -> None:
    item = to_item("req-1", REQ, now=5000.0, wall=110.0, slow=False)  # 10 s after submitted
    assert item.id == "req-1" and item.tokens == 3 and item.priority == "normal"
    assert item.enqueued_at == pytest.approx(4990.0)
    assert item.deadline == pytest.approx(5020.0)  # 20 s left on the wall clock
    assert isinstance(item.payload, Held) and item.payload.request is REQ and not item.payload.slow
    assert not item.alone


def test_to_item_without_deadline_from_the_future_and_slow() -> None:
    req = Request(input="x", tokens=1, model="synthetic", priority="low", submitted_at=100.0)
    item = to_item("req-2", req, now=7.0, wall=90.0, slow=True)  # clocks disagree
    assert item.enqueued_at == 7.0, "an age is never negative"
    assert item.deadline is None
    assert item.alone and item.payload is not None and item.payload.slow


def test_parse_event_returns_the_event_dict() -> None:
    event = {"kind": "done", "batch_id": "b1", "padded_tokens": 40, "run_ms": 12, "lane": "slow", "started_at": 5.5}
    assert parse_event(wire.event_message(event, EVENTS_QUEUE).encode()) == event
    # A start of the wrong type drops the event, as any other field's would; one that is
    # not a finite time is only not learned from.
    assert parse_event(wire.event_message({**event, "started_at": "soon"}, EVENTS_QUEUE).encode()) is None
    nan = parse_event(wire.event_message({**event, "started_at": float("nan")}, EVENTS_QUEUE).encode())
    assert nan is not None and nan["started_at"] is None
    hello = {"kind": "hello", "device": "cpu:0"}
    assert parse_event(wire.event_message(hello, EVENTS_QUEUE).encode()) == hello


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff garbage",
        b"[1]",
        b"{}",
        b"null",
        wire.event_message([1, 2], EVENTS_QUEUE).encode(),  # a body, but not a dict
        json.dumps({"body": base64.b64encode(b"\xff").decode(), "properties": {"body_encoding": "base64"}}).encode(),
    ],
)
def test_parse_event_returns_none_for_anything_else(raw: bytes) -> None:
    assert parse_event(raw) is None


def test_parse_event_with_a_body_that_is_not_a_string() -> None:
    # One such message on the events queue must not stop the collector.
    assert parse_event(b'{"body": 1}') is None


def test_the_collector_rejects_hostile_request_content_without_raising() -> None:
    """Fuzz of the collector's intake: every hostile message becomes that request's own
    error (or is dropped when it has no usable id), and the loop never sees an exception."""
    from dynamic_batching.collector.loop import Collector
    from dynamic_batching.core.clock import FakeClock
    from dynamic_batching.core.policy import BatchPolicy
    from dynamic_batching.core.slots import Slots

    class Recorder:
        def __init__(self) -> None:
            self.written: list[str] = []

        def write(self, outcomes, also=None):  # type: ignore[no-untyped-def]
            self.written += [o.task_id for o in outcomes]
            return len(outcomes)

    collector = Collector.__new__(Collector)
    collector.held, collector.slow_inputs, collector.stats = {}, set(), {"rejected": 0}
    collector.clock, collector.schedulers, collector.policy = FakeClock(), {}, BatchPolicy()
    collector.slots = Slots(collector.clock.now)
    collector.outcomes = Recorder()  # type: ignore[assignment]
    collector.redis = None
    collector.lease = SimpleNamespace(token="1")  # type: ignore[assignment]
    acked: list[object] = []
    import dynamic_batching.collector.loop as loop

    original_ack = loop.request_queues.ack
    loop.request_queues.ack = lambda r, token, items: acked.extend(items)  # type: ignore[assignment]
    try:
        hostile = [
            {**REQ.to_message(), "input": "lone \ud800 surrogate"},
            {**REQ.to_message(), "input": "nul \x00 inside"},
            {**REQ.to_message(), "submitted_at": "yesterday"},
            {**REQ.to_message(), "tokens": [1]},
            {**REQ.to_message(), "extra": 1},
            {"input": 5},
        ]
        for i, body in enumerate(hostile):
            raw = wire.task_message(app, REQUEST_TASK, f"hostile-{i}", [body], request_queue_name("normal"))
            collector._on_request(raw.encode("utf-8", "surrogatepass"), "normal")
        for raw in (b"", b"\xff\xfe", b"[]", b'{"headers": {"id": "\\ud800"}}', b"x" * 100_000):
            collector._on_request(raw, "normal")
    finally:
        loop.request_queues.ack = original_ack  # type: ignore[assignment]
    # A NUL is just a character: that request is held like any other.
    assert list(collector.held) == ["hostile-1"]
    assert collector.stats["rejected"] == 10
    # Each hostile request with an id is answered with its own error and struck off.
    assert sorted(collector.outcomes.written) == sorted(f"hostile-{i}" for i in (0, 2, 3, 4, 5))  # type: ignore[attr-defined]
    assert len(acked) == 5


@pytest.mark.parametrize(
    "fields",
    [
        {"run_ms": "abc"},
        {"run_ms": None, "padded_tokens": [1]},
        {"run_ms": "nan"},
        {"run_ms": -5},
        {"padded_tokens": "many"},
        {"batch_id": 7},
        {"batch_id": None},
        {"run_ms": "1e999"},
    ],
)
def test_finding_11_a_malformed_done_event_is_dropped_not_fatal(fields: dict) -> None:
    event = {"kind": "done", "batch_id": "b1", "run_ms": 3.5, "padded_tokens": 40, **fields}
    assert parse_event(wire.event_message(event, EVENTS_QUEUE).encode()) is None


def test_a_done_event_reads_back_with_the_types_the_collector_uses() -> None:
    event = {"kind": "done", "batch_id": "b1", "run_ms": "3.5", "padded_tokens": 40.0}
    parsed = parse_event(wire.event_message(event, EVENTS_QUEUE).encode())
    assert parsed is not None
    assert (parsed["run_ms"], parsed["padded_tokens"], parsed["lane"]) == (3.5, 40, "normal")
