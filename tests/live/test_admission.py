"""Admission, oversized requests and deadlines, end to end through real Redis and real
worker processes: what a caller of `submit` and of POST /submit sees under each policy.

Every test that changes the policy restores the default (the `restore_policy` fixture),
because the live system is shared with the other test files.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import apply_policy
from polling import poll_until
from systems import running

from batching_site.celery import app
from batching_site.harness import LocalSystem
from dynamic_batching.core.errors import DeadlineExceeded, Overloaded, RequestTooLarge
from dynamic_batching.core.policy import BatchPolicy
from dynamic_batching.edge.client import details, submit, submit_many
from dynamic_batching.gpu_workers.models import get_spec, synthetic
from dynamic_batching.protocol.names import PRIORITIES, request_queue_name
from dynamic_batching.store import request_queues, shared_state

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("live_system", "restore_policy")]


def words(n: int, tag: str) -> str:
    """`n` distinct words, so texts never collide with another test's."""
    return " ".join(f"{tag}{i}" for i in range(n))


def poll(predicate: Callable[[], Any], what: str, timeout: float = 5.0) -> Any:
    return poll_until(predicate, what, timeout=timeout)


def waiting(redis_client: Any) -> list[int]:
    return [redis_client.llen(request_queue_name(p)) for p in PRIORITIES]


# --- admission --------------------------------------------------------------------------


def test_full_queue_raises_overloaded_and_enqueues_nothing(redis_client: Any, admin_client: Any) -> None:
    # A long max wait keeps accepted requests waiting in the collector: the low queue
    # fills and does not drain until the policy changes back.
    caps = {"high": 2000, "normal": 2000, "low": 3}
    apply_policy(BatchPolicy(max_wait_ms=60_000, queue_caps=caps))
    texts = [f"held low {i}" for i in range(3)]
    accepted = submit_many(texts, priority="low", model="synthetic")
    poll(
        lambda: (
            request_queues.depths(shared_state.client())["low"] == 3
            and redis_client.llen(request_queue_name("low")) == 0
        ),
        "3 held",
    )
    before = (waiting(redis_client), request_queues.depths(shared_state.client()))

    listening = set(app.backend.result_consumer.subscribed_to)
    with pytest.raises(Overloaded) as info:
        submit_many([f"burst {i}" for i in range(20)], priority="low", model="synthetic")
    assert app.backend.result_consumer.subscribed_to == listening, "a refused request is listened for"
    exc = info.value
    assert (exc.queue, exc.cap) == (request_queue_name("low"), 3)
    assert 0 < exc.retry_after <= 5
    assert "requests.low" in str(exc) and "3" in str(exc)
    with pytest.raises(Overloaded):
        submit("one more", priority="low", model="synthetic")

    response = admin_client.post("/submit", {"text": "one more", "priority": "low"}, content_type="application/json")
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert "requests.low" in response.json()["detail"]
    assert (waiting(redis_client), request_queues.depths(shared_state.client())) == before, (
        "a refused request was enqueued"
    )

    # Caps are per tier: another tier still accepts (and waits with the rest).
    texts.append("normal still accepted")
    accepted.append(submit(texts[-1], model="synthetic"))

    # Nothing accepted is dropped: once the wait is back to 0 the held requests run.
    apply_policy(BatchPolicy())
    assert [r.get(timeout=30) for r in accepted] == [synthetic.embed(t) for t in texts]


def test_cap_is_exact_with_many_submitters_at_once() -> None:
    # The depth (queued + held by the collector) is checked and the request queued in
    # one script, so a cap is exact however many callers race for the last places.
    cap = 10
    apply_policy(BatchPolicy(max_wait_ms=60_000, queue_caps={"high": 2000, "normal": 2000, "low": cap}))
    accepted: list[Any] = []
    refused = []
    lock = threading.Lock()

    def submitter(k: int) -> None:
        for i in range(10):
            try:
                r = submit(f"racing {k} {i}", priority="low", model="synthetic")
            except Overloaded:
                with lock:
                    refused.append((k, i))
            else:
                with lock:
                    accepted.append(r)

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(accepted) == cap and len(refused) == 80 - cap
    assert request_queues.depths(shared_state.client())["low"] == cap

    apply_policy(BatchPolicy())
    assert all(r.get(timeout=30) for r in accepted)


# --- oversized requests -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "policy", "text", "limit"),
    [
        ("synthetic", BatchPolicy(), words(600, "s"), 512),
        ("minilm", BatchPolicy(), words(300, "m"), 256),
        ("synthetic", BatchPolicy(max_batch_tokens=100), words(150, "b"), 100),
    ],
    ids=["synthetic-model-limit", "minilm-model-limit", "token-budget"],
)
def test_reject_raises_request_too_large_at_submit(
    redis_client: Any, model: str, policy: BatchPolicy, text: str, limit: int
) -> None:
    apply_policy(policy)
    tokens = get_spec(model).count_tokens(text)
    assert tokens > limit
    before = waiting(redis_client)
    with pytest.raises(RequestTooLarge) as info:
        submit(text, model=model)
    assert isinstance(info.value, ValueError)
    assert (info.value.tokens, info.value.limit) == (tokens, limit)
    assert f"{tokens} tokens" in str(info.value) and str(limit) in str(info.value)
    with pytest.raises(RequestTooLarge):
        submit_many(["short and fine", text], model=model)
    assert waiting(redis_client) == before


def test_truncate_runs_the_cut_text_and_says_so() -> None:
    apply_policy(BatchPolicy(oversized="truncate"))

    long_synthetic = words(600, "t")
    r = submit(long_synthetic, model="synthetic")
    assert r.get(timeout=30) == synthetic.embed(" ".join(long_synthetic.split()[:510]))
    assert details(r)["truncated"] is True
    assert details(r)["tokens"] == 512

    spec = get_spec("minilm")
    long_minilm = words(300, "u")
    cut, cut_tokens = spec.truncate(long_minilm, spec.max_tokens)
    assert cut_tokens <= spec.max_tokens < spec.count_tokens(long_minilm)
    long_r, cut_r = submit_many([long_minilm, cut], model="minilm")
    got, expected = np.asarray(long_r.get(timeout=60)), np.asarray(cut_r.get(timeout=60))
    assert got.shape == (384,)
    assert np.max(np.abs(got - expected)) < 1e-4, "the truncated request must embed exactly its cut text"
    assert (details(long_r)["truncated"], details(cut_r)["truncated"]) == (True, False)


def test_run_alone_runs_an_oversized_request_in_a_batch_of_its_own() -> None:
    # 300 words fit the model (512) but not the batch budget (200 padded tokens).
    apply_policy(BatchPolicy(oversized="run_alone", max_batch_tokens=200))
    long = words(300, "a")
    texts = [f"short {i}" for i in range(10)] + [long] + [f"short {i}" for i in range(10, 20)]
    results = submit_many(texts, model="synthetic")
    assert [r.get(timeout=30) for r in results] == [synthetic.embed(t) for t in texts]
    info = {t: details(r) for t, r in zip(texts, results, strict=True)}
    assert info[long]["batch_size"] == 1
    assert info[long]["truncated"] is False
    shorts = [d["batch_size"] for t, d in info.items() if t != long]
    print(f"\nrun_alone: oversized batch_size=1, short batch sizes {sorted(shorts)}")
    assert all(d["batch_id"] != info[long]["batch_id"] for t, d in info.items() if t != long)


# --- deadlines ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def without_preemption() -> Any:
    """Two devices that never run a waiting batch between a long one's layers
    (BATCHING_PREEMPTION=0, gpu_workers/preempt.py): only then do busy devices leave requests
    queued at the collector, as every device without layers does."""
    with running(
        LocalSystem(
            devices=["cpu:0", "cpu:1"],
            preload="synthetic",
            env={"BATCHING_PREEMPTION": "0", "SYNTHETIC_PER_TOKEN_S": "0.00005"},
        )
    ) as system:
        yield system


def test_request_not_dispatched_by_its_deadline_fails_and_never_runs(without_preemption: LocalSystem) -> None:
    # One request per batch, so two slow requests occupy both devices and two more queue.
    apply_policy(BatchPolicy(max_batch_size=1))
    blockers = [f"!slow {words(500, f'd{i}_')}" for i in range(4)]
    started = time.monotonic()
    blocking = submit_many(blockers, model="synthetic")
    poll(lambda: (shared_state.read_collector() or {}).get("outstanding", 0) >= 2, "both devices busy")

    late = submit("too late", model="synthetic", deadline_s=0.05)
    with pytest.raises(DeadlineExceeded):
        late.get(timeout=30)
    failed_after = time.monotonic() - started
    assert late.state == "FAILURE"
    assert details(late).get("expired") is True, "it must fail at the collector, without running"

    assert [r.get(timeout=60) for r in blocking] == [synthetic.embed(t) for t in blockers]
    busy = time.monotonic() - started
    run_ms = sorted(details(r)["run_ms"] for r in blocking)
    print(
        f"\ndeadline: failed {failed_after:.3f}s after the blockers were sent; blockers done at {busy:.3f}s, run_ms {run_ms}"
    )
    assert failed_after < busy


# --- HTTP ------------------------------------------------------------------------------------


def test_http_submit_answers_202_413_and_400(admin_client: Any) -> None:
    def post(body: Any, content_type: str = "application/json") -> Any:
        return admin_client.post("/submit", body, content_type=content_type)

    ok = post({"text": "an http request", "priority": "normal"})
    assert ok.status_code == 202
    assert ok.json()["status"] == "PENDING"
    # Above the quota's highest tier (users: normal, unless the admin says more).
    above = post({"text": "an http request", "priority": "high"})
    assert above.status_code == 403 and "above what your quota allows" in above.json()["detail"]

    too_large = post({"text": words(400, "h")})  # the default model, minilm: 256 tokens at most
    assert too_large.status_code == 413
    assert "tokens" in too_large.json()["detail"]

    for body in ({"text": ""}, {"text": "fine", "priority": "urgent"}, {}, "{not json"):
        assert post(body).status_code == 400, body
    # Hostile bodies are a 400 too, never a 500: not an object, nested past the parser.
    for raw in ("[1, 2]", '"text"', "3", "[" * 100_000 + "]" * 100_000, '{"text": ["a list"]}'):
        assert post(raw).status_code == 400, raw[:40]

    assert len(app.AsyncResult(ok.json()["id"]).get(timeout=60)) == 384
