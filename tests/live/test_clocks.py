"""One clock for decisions across hosts: a device worker whose clock is 11 s slow and a
web process a minute and ten seconds behind still agree with everyone else, because
every time another process judges is read from Redis's clock (tasks/store/clock.py).
The web process's whole wall clock is shifted by libfaketime; the device's by an
injected offset (CLOCK_SKEW_S), since the synthetic model's sleep fails under
libfaketime.

Without it, the slow device was dropped as dead on every read of the live devices, and
a request with a 5 s deadline submitted through the lagging web process had expired
before it was queued."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator

import pytest
from polling import poll_until
from systems import running
from webapi import api_token, http

from batching_site.harness import LocalSystem
from dynamic_batching.edge.client import details
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.store import shared_state

pytestmark = pytest.mark.live

#: Debian's libfaketime, under this machine's architecture's library folder.
LIBFAKETIME = next(
    iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))), "/usr/lib/faketime/libfaketimeMT.so.1"
)


def skewed(seconds: int) -> dict[str, str]:
    """The environment that shifts a process's clocks by `seconds`, but not file times:
    gunicorn's arbiter reads its workers' liveness from a file's mtime. The monotonic
    clock moves with the wall clock (by a constant, so every duration is unchanged):
    sleeping fails under libfaketime when only the wall clock is shifted."""
    return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": f"{seconds:+d}s", "NO_FAKE_STAT": "1"}


@pytest.fixture(scope="module")
def skewed_system() -> Iterator[LocalSystem]:
    if not os.path.exists(LIBFAKETIME):
        pytest.skip(f"no libfaketime at {LIBFAKETIME}: `apt-get install -y faketime` (make test does it)")
    skews = {"gpu-cpu1": {"BATCHING_CLOCK_SKEW_S": "-11"}, "web": skewed(-70)}
    with running(LocalSystem(devices=["cpu:0", "cpu:1"], web=True, program_env=skews)) as system:
        yield system


def test_a_device_with_a_slow_clock_stays_live(skewed_system: LocalSystem) -> None:
    for _ in range(5):
        assert len(shared_state.live_devices()) == 2, shared_state.live_devices()


def test_a_request_through_a_lagging_web_process_keeps_its_deadline(skewed_system: LocalSystem) -> None:
    token = api_token(skewed_system)
    texts = [f"clock test {i}" for i in range(40)]
    status, body = http(
        skewed_system, "POST", "/api/v1/requests", {"model": "synthetic", "texts": texts, "deadline_s": 5}, token=token
    )
    assert status == 202, body
    answers = []
    for request_id in body["ids"]:
        got = poll_until(
            lambda rid=request_id: (
                (r := http(skewed_system, "GET", f"/api/v1/requests/{rid}", token=token)[1]).get("status")
                in ("SUCCESS", "FAILURE")
                and r
            ),
            f"request {request_id} to finish",
            timeout=30,
        )
        assert got["status"] == "SUCCESS", got
        answers.append(got["result"])
    assert answers == [synthetic.embed(t) for t in texts]
    # Submitted by a clock 70 s behind, started by one 11 s behind: on one clock, the
    # start follows the submission, on both devices, and within the deadline. (That
    # bound is the request's own deadline, already kept: it was answered, not expired;
    # a skewed clock would show a gap of about -70 s or +59 s.)
    ran = {}
    for request_id in body["ids"]:
        d = details(request_id)
        ran[d["device"].split("@")[0]] = d["started_at"] - d["submitted_at"]
    assert all(0 <= gap <= 5 for gap in ran.values()), ran
    assert (shared_state.read_collector() or {}).get("stats", {}).get("republished", 0) == 0
