"""The collector's outbox: the body of a batch task, and which queue it goes to."""

from __future__ import annotations

import json

import pytest

from batching_site.celery import app
from dynamic_batching.collector.inbox import Held
from dynamic_batching.collector.outbox import Outbox, batch_body
from dynamic_batching.core.scheduler import Batch, Item
from dynamic_batching.protocol.names import BATCH_QUEUE, device_queue_name
from dynamic_batching.protocol.request import Request


def item(task_id: str, text: str, tokens: int, priority: str, *, slow: bool = False, at: float = 0.0) -> Item[Held]:
    req = Request(input=text, tokens=tokens, model="synthetic", priority=priority, submitted_at=1.0, deadline_at=None)
    return Item(id=task_id, tokens=tokens, priority=priority, enqueued_at=at, payload=Held(req, slow))


def batch(*items: Item[Held]) -> Batch[Held]:
    longest = max(i.tokens for i in items)
    return Batch(items, longest * len(items), sum(i.tokens for i in items), "full", formed_at=10.0)


def test_batch_body_carries_every_request() -> None:
    b = batch(item("a", "one", 2, "high", at=9.5), item("b", "two two", 5, "low", at=4.0))
    body = batch_body("synthetic", b)
    assert body["model"] == "synthetic"
    assert [(r["id"], r["input"], r["tokens"], r["priority"]) for r in body["requests"]] == [
        ("a", "one", 2, "high"),
        ("b", "two two", 5, "low"),
    ]
    assert [r["waited_s"] for r in body["requests"]] == pytest.approx([0.5, 6.0])
    assert body["padded_tokens"] == 10 and body["real_tokens"] == 7 and body["reason"] == "full"
    assert body["lane"] == "normal"
    assert body["batch_id"] and json.loads(json.dumps(body)) == body, "plain JSON"


def test_batch_body_ids_are_fresh_per_batch() -> None:
    b = batch(item("a", "x", 1, "normal"))
    assert batch_body("synthetic", b)["batch_id"] != batch_body("synthetic", b)["batch_id"]


def test_batch_body_goes_to_the_slow_lane_iff_any_request_is_slow() -> None:
    assert batch_body("m", batch(item("a", "x", 1, "normal", slow=True)))["lane"] == "slow"
    mixed = batch(item("a", "x", 1, "normal"), item("b", "y", 1, "normal", slow=True))
    assert batch_body("m", mixed)["lane"] == "slow"
    assert batch_body("m", batch(item("a", "x", 1, "normal"), item("b", "y", 1, "high")))["lane"] == "normal"


def test_pull_mode_sends_everything_to_the_batch_queue() -> None:
    outbox = Outbox(app, redis=None)
    outbox.device_names = ["cuda:0", "cuda:1"]
    assert [outbox.queue() for _ in range(3)] == [BATCH_QUEUE] * 3


def test_push_mode_deals_batches_round_robin_onto_device_queues() -> None:
    outbox = Outbox(app, redis=None, dispatch="push")
    outbox.device_names = ["cuda:0", "cuda:1"]
    assert [outbox.queue() for _ in range(5)] == [
        device_queue_name(d) for d in ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    ]


def test_push_mode_with_no_known_device_falls_back_to_the_batch_queue() -> None:
    assert Outbox(app, redis=None, dispatch="push").queue() == BATCH_QUEUE
