"""Guarantees of the outcome store and the device runner that no other test exercised
(issue 41, "untested guarantees"): a second write of an outcome, `missing`, the script
reload after SCRIPT FLUSH, a redelivered batch partly answered, and the device-side
deadline. Each runs on a Redis of its own."""

from __future__ import annotations

import time
from typing import Any

import pytest
from batches import batch_of
from celery.result import AsyncResult

from batching_site.celery import app
from dynamic_batching.core.errors import DeadlineExceeded
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.gpu_workers.runner import DeviceRunner
from dynamic_batching.protocol.names import ANSWERS_KEY, redeliveries_key, reply_ids, reply_key
from dynamic_batching.protocol.results import Outcome
from dynamic_batching.store import clock, shared_state
from dynamic_batching.store.outcomes import OutcomeWriter

pytestmark = pytest.mark.live


def stored(task_id: str) -> Any:
    return app.backend.get_task_meta(task_id)["result"]


def test_a_second_write_of_an_outcome_keeps_the_first_and_tells_nobody(bare_redis) -> None:  # type: ignore[no-untyped-def]
    r = shared_state.client()
    key, [task_id] = reply_ids(1)
    writer = OutcomeWriter(app)
    channel = r.pubsub(ignore_subscribe_messages=True)
    channel.subscribe(app.backend.get_key_for_task(task_id))
    channel.get_message(timeout=1)

    assert writer.write([Outcome(task_id, result=[1.0])]) == 1
    assert writer.write([Outcome(task_id, result=[2.0])]) == 0
    assert writer.write([Outcome(task_id, error=DeadlineExceeded(task_id, "late"))]) == 0

    assert stored(task_id) == [1.0]
    assert r.llen(reply_key(task_id) or "") == 1 and reply_key(task_id) == key, "pushed once"
    published = []
    end = time.monotonic() + 1
    while time.monotonic() < end:
        message = channel.get_message(timeout=0.1)
        if message is not None:
            published.append(message)
    assert len(published) == 1, "published once"
    assert r.hget(ANSWERS_KEY, "first") == b"1" and r.hget(ANSWERS_KEY, "refused") == b"2"
    channel.close()


def test_missing_names_exactly_the_ids_without_an_outcome(bare_redis) -> None:  # type: ignore[no-untyped-def]
    writer = OutcomeWriter(app)
    _, ids = reply_ids(4)
    writer.write([Outcome(ids[0], result=[0.0]), Outcome(ids[2], error=DeadlineExceeded(ids[2], "late"))])
    writer.started([ids[3]], "cpu:7@here")  # STARTED is no outcome
    assert writer.missing(ids) == {ids[1], ids[3]}
    assert writer.missing([]) == set()


def test_outcomes_are_written_after_redis_forgot_the_script(bare_redis) -> None:  # type: ignore[no-untyped-def]
    # A Redis restarted without its scripts (or SCRIPT FLUSH) refuses EVALSHA: the
    # writer loads the script again and writes, losing nothing.
    writer = OutcomeWriter(app)
    _, ids = reply_ids(2)
    assert writer.write([Outcome(ids[0], result=[0.5])]) == 1
    shared_state.client().script_flush()
    assert writer.write([Outcome(ids[1], result=[1.5])]) == 1
    assert stored(ids[1]) == [1.5] and stored(ids[0]) == [0.5]


def test_a_redelivered_batch_partly_answered_runs_only_the_rest(bare_runner: DeviceRunner) -> None:
    # Its worker died after answering two of three: the redelivery counts, skips those
    # two (their first answers stay) and runs the third.
    texts = ["answered before", "answered too", "not yet"]
    batch = batch_of(texts)
    done = batch["requests"][:2]
    OutcomeWriter(app).write([Outcome(r["id"], result=["the first answer"]) for r in done])
    summary = bare_runner.execute(batch, redelivered=True, task_id="partly")
    assert summary["skipped"] == 2 and summary["ran"] == 1 and summary["written"] == 1, summary
    assert all(stored(r["id"]) == ["the first answer"] for r in done), "the first answers stay"
    assert AsyncResult(batch["requests"][2]["id"], app=app).get(timeout=5) == synthetic.embed(texts[2])
    assert shared_state.client().scard(redeliveries_key("partly")) == 1, "the redelivery counted"


def test_a_request_past_its_deadline_when_its_batch_starts_gets_its_own_error(bare_runner: DeviceRunner) -> None:
    batch = batch_of(["already late", "in time"])
    late, in_time = batch["requests"]
    late["deadline_at"] = clock.now() - 1.0
    in_time["deadline_at"] = clock.now() + 60.0
    summary = bare_runner.execute(batch)
    assert summary["written"] == 2 and summary["ran"] == 1, summary
    with pytest.raises(DeadlineExceeded, match="before a device was free"):
        AsyncResult(late["id"], app=app).get(timeout=5)
    assert AsyncResult(in_time["id"], app=app).get(timeout=5) == synthetic.embed("in time")


class Watching:
    """The synthetic model, noting each request's state as its batch runs."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self.seen: list[str] = []

    def load(self, device: str) -> Any:
        runner = synthetic.SyntheticSpec().load(device)
        run_batch = runner.run_batch

        def watched(inputs: Any) -> Any:
            self.seen = [AsyncResult(t, app=app).state for t in self.ids]
            return run_batch(inputs)

        runner.run_batch = watched  # type: ignore[method-assign]
        return runner


def test_with_task_track_started_a_request_is_started_while_its_batch_runs(
    bare_runner: DeviceRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dynamic_batching.gpu_workers import runner as runner_module

    batch = batch_of(["one", "two"])
    ids = [r["id"] for r in batch["requests"]]
    watching = Watching(ids)
    monkeypatch.setattr(runner_module, "get_spec", lambda name: watching)
    before, app.conf.task_track_started = app.conf.task_track_started, True
    try:
        bare_runner.execute(batch)
    finally:
        app.conf.task_track_started = before
    assert watching.seen == ["STARTED", "STARTED"], watching.seen
    assert [AsyncResult(t, app=app).state for t in ids] == ["SUCCESS", "SUCCESS"], "the answer replaced STARTED"
    assert AsyncResult(ids[0], app=app).get(timeout=5) == synthetic.embed("one")


def test_a_requests_own_failure_is_logged_once_with_its_id(
    bare_runner: DeviceRunner, caplog: pytest.LogCaptureFixture
) -> None:
    batch = batch_of(["fine", "refused !fail", "fine too"])
    bad = batch["requests"][1]["id"]
    with caplog.at_level("ERROR", logger="dynamic_batching.protocol.canvas"):
        bare_runner.execute(batch)
    lines = [r.getMessage() for r in caplog.records if bad in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"request {bad} failed: PoisonInput: "), lines
    with pytest.raises(synthetic.PoisonInput):
        AsyncResult(bad, app=app).get(timeout=5)
