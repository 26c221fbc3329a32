"""Stored message format: task and event messages are read back as they were written."""

from __future__ import annotations

import json
import math

import pytest
from kombu.utils import json as kombu_json

from batching_site.celery import app
from dynamic_batching.protocol import wire
from dynamic_batching.protocol.names import BATCH_QUEUE, BATCH_TASK, EVENTS_QUEUE

GARBAGE = [b"\xff\xfe", b"not json", b"[1, 2]", b"null", b"{}", b'{"headers": [1], "properties": [1]}']


def test_task_message_decodes_to_its_name_id_and_args() -> None:
    args = [{"batch_id": "b1", "requests": [{"id": "r1", "text": "héllo"}]}]
    raw = wire.task_message(app, BATCH_TASK, "b1", args, BATCH_QUEUE)
    for stored in (raw, raw.encode()):
        decoded = wire.decode(stored)
        assert decoded.task == BATCH_TASK
        assert decoded.task_id == "b1"
        assert list(decoded.args) == args
        assert decoded.kwargs == {}
        assert wire.task_id_of(stored) == "b1"
        assert wire.routing_key(stored) == BATCH_QUEUE


def test_each_message_gets_its_own_delivery_tag() -> None:
    a = wire.task_message(app, BATCH_TASK, "b1", [], BATCH_QUEUE)
    b = wire.task_message(app, BATCH_TASK, "b1", [], BATCH_QUEUE)
    assert a != b and wire.decode(a) == wire.decode(b)


def test_event_message_body_is_the_event() -> None:
    event = {"kind": "done", "batch_id": "b1", "run_ms": 250}
    raw = wire.event_message(event, EVENTS_QUEUE)
    assert wire.body(raw) == event
    assert wire.routing_key(raw) == EVENTS_QUEUE
    assert wire.task_id_of(raw) is None


@pytest.mark.parametrize("raw", GARBAGE)
def test_task_id_and_routing_key_of_garbage_are_none(raw: bytes) -> None:
    assert wire.task_id_of(raw) is None
    assert wire.routing_key(raw) is None


@pytest.mark.parametrize("raw", [*GARBAGE[:-1], b'{"body": "not json"}'])
def test_body_of_garbage_raises_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        wire.body(raw)


@pytest.mark.parametrize("raw", [b'{"body": 1}', b'{"body": null}', b'{"body": {}}'])
def test_body_that_is_not_a_string(raw: bytes) -> None:
    with pytest.raises(ValueError):
        wire.body(raw)


@pytest.mark.parametrize("raw", [*GARBAGE[:-1], wire.event_message({"kind": "done"}, EVENTS_QUEUE)])
def test_decode_of_anything_but_a_task_message_raises_value_error(raw: bytes | str) -> None:
    with pytest.raises(ValueError):
        wire.decode(raw)


# What orjson refuses (wire.dumps / wire.loads) goes through json, so a message holds and
# reads back exactly what json would have made of it.
AWKWARD = [2**70, -(2**64), "lone \ud800 surrogate", {1: "an int key"}, [1e300, -0.0, 5e-324], "héllo ✓"]


@pytest.mark.parametrize("value", AWKWARD)
def test_a_value_orjson_cannot_write_reads_back_as_json_would(value: object) -> None:
    raw = wire.task_message(app, BATCH_TASK, "b1", [value], BATCH_QUEUE)
    assert list(wire.decode(raw).args) == json.loads(json.dumps([value]))
    # kombu, which a Celery worker reads it with, agrees.
    assert kombu_json.loads(raw)["headers"]["id"] == "b1"


def test_text_that_only_json_reads_is_still_read() -> None:
    # A NaN literal, as json.dumps writes one (the edge no longer lets one in).
    assert math.isnan(wire.loads(b"[NaN]")[0])
    assert wire.loads(b'"\\ud800"') == "\ud800"
