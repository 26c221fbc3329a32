"""The site's async view under its ASGI server, on the process set `make run` starts
(issue 39, await): `GET /api/v1/requests/{id}?wait=S` waits for its request to end as a
coroutine on the web worker's event loop. Two hundred long polls in flight, more than
the old threaded workers had threads (2 x 8), leave the site answering everybody else at
once, hold no thread each, and each gets its own answer the moment it is stored."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from systems import running

from batching_site.harness import LocalSystem
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.store import shared_state

pytestmark = pytest.mark.live

POLLS = 200


@pytest.fixture(scope="module")
def system() -> Iterator[LocalSystem]:
    # No device at first: what is submitted waits.
    with running(LocalSystem(devices=[], preload="synthetic", web=True), timeout=180) as s:
        yield s


def call(port: int, token: str, method: str, path: str, body: object = None, timeout: float = 60) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method=method,
    )
    with urllib.request.urlopen(req, timeout=timeout) as reply:
        return reply.status, json.loads(reply.read())


def web_threads(system: LocalSystem) -> int:
    """Threads of the web role's worker processes (the children of gunicorn's master)."""
    master = system.pid("web")
    with open(f"/proc/{master}/task/{master}/children") as f:
        children = [int(p) for p in f.read().split()]
    return sum(len(os.listdir(f"/proc/{c}/task")) for c in children)


def test_long_polls_wait_on_the_event_loop_and_the_site_keeps_answering(system: LocalSystem) -> None:
    assert system.web_port is not None
    port = system.web_port
    quota = {"rate_per_s": 1000, "burst": 1000, "max_in_flight": 1000, "tier_share": 1.0}
    token = system.user_token("long-poller", quota=quota)
    texts = [f"long poll {i}" for i in range(POLLS)]
    status, body = call(port, token, "POST", "/api/v1/requests", {"texts": texts, "model": "synthetic"})
    assert status == 202, body
    ids = body["ids"]
    idle_threads = web_threads(system)

    with ThreadPoolExecutor(max_workers=POLLS) as pool:
        polls = [pool.submit(call, port, token, "GET", f"/api/v1/requests/{i}?wait=25") for i in ids]
        r = shared_state.client()
        deadline = time.monotonic() + 30
        # Every poll is waiting once the web workers have subscribed to all their answers.
        while len(r.pubsub_channels("celery-task-meta-*")) < POLLS:
            assert time.monotonic() < deadline, "the long polls did not all start waiting"
            assert not any(p.done() for p in polls), "a long poll ended before its request did"
            time.sleep(0.05)
        waiting_threads = web_threads(system)

        # The site still answers at once: a status read without wait, and the health check.
        t0 = time.monotonic()
        assert call(port, token, "GET", f"/api/v1/requests/{ids[0]}")[1]["status"] == "PENDING"
        try:  # 503 with no device yet: an answer all the same
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).close()
        except urllib.error.HTTPError as e:
            assert e.code == 503, e
        other_s = time.monotonic() - t0
        print(
            f"\n{POLLS} long polls waiting: web worker threads {idle_threads} idle -> {waiting_threads}; "
            f"a status read and /healthz meanwhile took {other_s:.2f} s"
        )
        assert other_s < 5, "the long polls held up everybody else"
        assert waiting_threads < POLLS // 2, "a thread for each waiting request"

        system.start_device("cpu:0")
        t0 = time.monotonic()
        replies = [p.result(timeout=60) for p in polls]
        print(f"all {POLLS} answered {time.monotonic() - t0:.2f} s after the device started")
    assert [s for s, _ in replies] == [200] * POLLS
    assert [b["status"] for _, b in replies] == ["SUCCESS"] * POLLS
    assert [b["result"] for _, b in replies] == [synthetic.embed(t) for t in texts]


def test_a_wait_past_its_limit_is_refused_and_a_short_one_returns_pending(system: LocalSystem) -> None:
    assert system.web_port is not None
    token = system.user_token("impatient")
    # No answer comes for an id that is not there: 404 at once, not after the wait.
    t0 = time.monotonic()
    with pytest.raises(urllib.error.HTTPError) as missing:
        call(system.web_port, token, "GET", "/api/v1/requests/00000000-0000-4000-8000-000000000000?wait=5")
    assert missing.value.code == 404 and time.monotonic() - t0 < 2
    with pytest.raises(urllib.error.HTTPError) as too_long:
        call(system.web_port, token, "GET", "/api/v1/requests/00000000-0000-4000-8000-000000000000?wait=31")
    assert too_long.value.code == 422
