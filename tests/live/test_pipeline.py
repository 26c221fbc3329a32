"""End to end through real Redis and real worker processes: each caller gets its own
answer, in order, and bad input fails at the edge with nothing enqueued."""

from __future__ import annotations

import json
import pickle
import random
import threading
import time
import uuid

import numpy as np
import pytest
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult
from polling import poll_until

from batching_site.celery import app
from dynamic_batching.edge.client import details, gather, run_many, submit, submit_many
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.protocol import wire
from dynamic_batching.protocol.names import (
    EVENTS_QUEUE,
    LEDGER_KEY,
    PRIORITIES,
    REQUEST_TASK,
    reply_ids,
    reply_key,
    request_queue_name,
)
from dynamic_batching.store import replies, request_queues, shared_state

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=False)]

WORDS = "alpha beta gamma delta kernel tensor batch queue worker device token budget latency".split()


def distinct_texts(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        length = rng.choice([3] * 7 + [30] * 2 + [120])  # mostly short, some long
        texts.append(f"request {i}: " + " ".join(rng.choice(WORDS) for _ in range(length)))
    return texts


def assert_own_answers(texts: list[str], values: list[object]) -> None:
    """Each text's own answer in its place; a poison text's own error in its place."""
    assert len(values) == len(texts)
    for text, value in zip(texts, values, strict=True):
        if "!fail" in text:
            assert isinstance(value, synthetic.PoisonInput) and "refuses input" in str(value)
        else:
            assert value == synthetic.embed(text)


@pytest.fixture(scope="module")
def minilm():  # type: ignore[no-untyped-def]
    from dynamic_batching.gpu_workers.models import get_spec

    runner = get_spec("minilm").load("cpu")
    yield runner
    runner.close()


def test_many_threads_each_get_their_own_minilm_embedding(live_system, minilm) -> None:  # type: ignore[no-untyped-def]
    texts = distinct_texts(16 * 25)
    answers: dict[int, list[float]] = {}
    errors: list[BaseException] = []

    def caller(t: int) -> None:
        try:
            for i in range(t * 25, (t + 1) * 25):
                answers[i] = submit(texts[i]).get(timeout=120)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors[:3]
    assert sorted(answers) == list(range(len(texts)))

    # Expected: each text encoded alone. Batching and padding must not change it.
    for i in random.Random(1).sample(range(len(texts)), 60):
        expected = minilm.run_batch([texts[i]])[0]
        got = np.asarray(answers[i])
        assert got.shape == (384,)
        assert np.max(np.abs(got - np.asarray(expected))) < 1e-4, f"text {i} got another caller's answer"


def test_submit_many_keeps_input_order(live_system) -> None:  # type: ignore[no-untyped-def]
    texts = distinct_texts(120, seed=3)
    results = submit_many(texts, model="synthetic")
    assert [r.get(timeout=60) for r in results] == [synthetic.embed(t) for t in texts]
    assert len({details(r)["batch_id"] for r in results}) < len(texts), "nothing was batched"


@pytest.mark.parametrize(
    ("text", "kwargs", "error"),
    [
        ("", {}, ValueError),
        ("   \n\t", {}, ValueError),
        (42, {}, TypeError),
        (None, {}, TypeError),
        ("fine text", {"priority": "urgent"}, ValueError),
        ("fine text", {"model": "gpt-5"}, ValueError),
        ("fine text", {"deadline_s": -1}, ValueError),
    ],
)
def test_bad_input_raises_and_enqueues_nothing(live_system, redis_client, text, kwargs, error) -> None:  # type: ignore[no-untyped-def]
    before = [redis_client.llen(request_queue_name(p)) for p in PRIORITIES]
    with pytest.raises(error):
        submit(text, **kwargs)
    with pytest.raises(error):
        submit_many(["a good one", text], **kwargs)
    assert [redis_client.llen(request_queue_name(p)) for p in PRIORITIES] == before


def test_one_poison_input_fails_alone(live_system) -> None:  # type: ignore[no-untyped-def]
    texts = [f"healthy input {i}" for i in range(31)]
    texts.insert(17, "this one is poison !fail")
    results = submit_many(texts, model="synthetic")
    for text, r in zip(texts, results, strict=True):
        if "!fail" in text:
            with pytest.raises(synthetic.PoisonInput, match="refuses input"):
                r.get(timeout=60)
            assert r.state == "FAILURE"
        else:
            assert r.get(timeout=60) == synthetic.embed(text)
            assert r.state == "SUCCESS"


def test_gather_gives_each_request_its_own_answer_or_error_in_order(live_system, redis_client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # No fallback to the stored answers within the run: every answer comes by the list.
    monkeypatch.setattr(replies, "QUIET_S", 120.0)
    texts = distinct_texts(60, seed=11)
    texts.insert(23, "gathered, and poison !fail")
    subscribed_before = set(app.backend.result_consumer.subscribed_to)
    results = submit_many(texts, model="synthetic")
    values = gather(results, timeout=60)
    assert_own_answers(texts, values)
    # One reply group, popped from its list: no channel subscribed, no list left.
    assert set(app.backend.result_consumer.subscribed_to) == subscribed_before
    assert not redis_client.exists(reply_key(results[0].id))
    assert results[5].get(timeout=1) == values[5]  # kept, not waited for again


def test_answers_pushed_before_anyone_waits_are_kept_for_each_get(live_system, redis_client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A channel drops what is published before its subscription; the reply list keeps
    # it. Each result of one call, got on its own and from its own thread, finds its
    # own answer, and the list goes once the last is in.
    monkeypatch.setattr(replies, "QUIET_S", 120.0)
    texts = [f"answered before anyone waits {i}" for i in range(8)]
    results = submit_many(texts, model="synthetic")
    poll_until(lambda: redis_client.llen(reply_key(results[0].id)) == len(texts), "every answer on the list")
    got: dict[int, object] = {}

    def get(i: int) -> None:
        got[i] = results[i].get(timeout=30)

    threads = [threading.Thread(target=get, args=(i,)) for i in reversed(range(len(texts)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [got[i] for i in range(len(texts))] == [synthetic.embed(t) for t in texts]
    assert not redis_client.exists(reply_key(results[0].id))
    # Pickled for another process, it is a plain AsyncResult that waits through Celery.
    copy = pickle.loads(pickle.dumps(results[0]))
    assert type(copy) is AsyncResult and copy.get(timeout=10) == synthetic.embed(texts[0])


def test_gather_times_out_with_celerys_error_when_an_answer_never_comes(live_system) -> None:  # type: ignore[no-untyped-def]
    done = submit("answered at once", model="synthetic")
    never = AsyncResult(str(uuid.uuid4()), app=app)
    with pytest.raises(CeleryTimeoutError):
        gather([done, never], timeout=0.5)
    assert done.get(timeout=10) == synthetic.embed("answered at once")


def test_run_many_gives_each_request_its_own_answer_or_error_in_order(live_system, redis_client, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    texts = distinct_texts(60, seed=12)
    texts.insert(17, "run_many, and poison !fail")
    seen = []
    admit = request_queues.admit

    def checked_admit(client, priority, cap, entries, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.extend(task_id for task_id, _ in entries)
        return admit(client, priority, cap, entries, *args, **kwargs)

    monkeypatch.setattr(request_queues, "admit", checked_admit)
    # No fallback to the stored answers within the run: every answer must come by the
    # list the outcome script pushed it to (set_once.lua and reply_key agree).
    monkeypatch.setattr(replies, "QUIET_S", 120.0)
    subscribed_before = set(app.backend.result_consumer.subscribed_to)
    values = run_many(texts, model="synthetic", timeout=60)
    assert_own_answers(texts, values)
    # One reply group, waited on through its list: no channel subscribed, no list left,
    # and each answer is stored under its id as for any other request.
    assert len({reply_key(t) for t in seen}) == 1 and None not in {reply_key(t) for t in seen}
    assert set(app.backend.result_consumer.subscribed_to) == subscribed_before
    assert not redis_client.exists(reply_key(seen[0]))
    assert AsyncResult(seen[0], app=app).get(timeout=10) == synthetic.embed(texts[0])


def test_run_many_times_out_with_celerys_error_and_leaves_no_list(live_system, redis_client) -> None:  # type: ignore[no-untyped-def]
    key, ids = reply_ids(2)
    redis_client.rpush(key, app.backend.encode({"status": "SUCCESS", "result": 1, "task_id": ids[0]}))
    # The second is accepted (in the ledger) and not answered yet: a request with no
    # ledger entry would end with RequestLost instead (issue 41, finding 13).
    redis_client.zadd(LEDGER_KEY, {ids[1]: time.time()})
    try:
        with pytest.raises(CeleryTimeoutError):
            replies.wait(redis_client, key, ids, app.backend, timeout=0.5)
    finally:
        redis_client.zrem(LEDGER_KEY, ids[1])
    assert not redis_client.exists(key)


def test_an_answer_missing_from_its_reply_list_is_read_where_it_is_stored(live_system, redis_client) -> None:  # type: ignore[no-untyped-def]
    # The list lost an answer (a Redis restart without its append-only file, say): a
    # quiet second later the wait reads the stored answers of what it still misses.
    key, ids = reply_ids(2)
    redis_client.rpush(key, app.backend.encode({"status": "SUCCESS", "result": 1, "task_id": ids[0]}))
    stored = {"status": "SUCCESS", "result": 2, "task_id": ids[1]}
    redis_client.set(app.backend.get_key_for_task(ids[1]), app.backend.encode(stored), ex=60)
    metas = replies.wait(redis_client, key, ids, app.backend, timeout=10)
    assert {t: m["result"] for t, m in metas.items()} == {ids[0]: 1, ids[1]: 2}


def test_every_priority_is_served(live_system) -> None:  # type: ignore[no-untyped-def]
    for p in PRIORITIES:
        r = submit(f"a {p} request", priority=p, model="synthetic")
        assert r.get(timeout=60) == synthetic.embed(f"a {p} request")
        assert details(r)["priority"] == p


def test_malformed_request_messages_get_an_error_and_never_stop_the_collector(live_system, redis_client) -> None:  # type: ignore[no-untyped-def]
    # What a buggy or foreign producer might put on a request queue: a body that is not
    # a request, a message for another task, and bytes that are not a message at all.
    queue = request_queue_name("normal")
    bad_body = str(uuid.uuid4())
    wrong_task = str(uuid.uuid4())
    raws = [
        wire.task_message(app, REQUEST_TASK, bad_body, [{"text": "no tokens field"}], queue),
        wire.task_message(app, "some.other.task", wrong_task, [{}], queue),
        "not a message at all",
    ]
    redis_client.lpush(queue, *raws)
    redis_client.lpush(EVENTS_QUEUE, "not an event either", json.dumps({"body": "bm90IGpzb24="}))
    # Issue 41, finding 11: eight `done` events whose fields have the wrong types once
    # restarted the collector (its pid changed). Its pid must stay.
    pid = shared_state.read_collector(redis_client)["pid"]
    for run_ms in ("abc", None, [], {}, "nan", -1, "1e999", True):
        bad = {"kind": "done", "batch_id": str(uuid.uuid4()), "run_ms": run_ms, "padded_tokens": "x"}
        redis_client.lpush(EVENTS_QUEUE, wire.event_message(bad, EVENTS_QUEUE))
    redis_client.lpush(request_queues.WAKE_KEY, 1)

    with pytest.raises(ValueError, match="malformed request message"):
        AsyncResult(bad_body, app=app).get(timeout=30)
    with pytest.raises(ValueError, match="not a request message"):
        AsyncResult(wrong_task, app=app).get(timeout=30)
    # Nothing of them is left held, and the collector goes on serving.
    assert request_queues.held(redis_client)["normal"] == []
    assert submit("after the bad messages", model="synthetic").get(timeout=30) == synthetic.embed(
        "after the bad messages"
    )
    # The events were read (the answer above came through the same loop), and the same
    # collector read them.
    # (The answer's batch's own `done` event is written with the answer: the collector
    # reads it a moment later.)
    poll_until(lambda: redis_client.llen(EVENTS_QUEUE) == 0, "the collector to read every event", timeout=10)
    assert shared_state.read_collector(redis_client)["pid"] == pid
