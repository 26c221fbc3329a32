"""Issue 41, finding 9: a deadline binds a request wherever it is. The collector's
scheduler expires the requests it holds; a request in a batch whose device stopped, or
waiting behind the window, was answered only when the broker handed its batch out again
(the visibility timeout plus the restore sweep, about 35 s), or through the ledger."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from polling import poll_until
from systems import running

from batching_site.harness import LocalSystem
from dynamic_batching.core.errors import DeadlineExceeded
from dynamic_batching.edge.client import submit
from dynamic_batching.protocol.names import DEADLINES_KEY, UNACKED_KEY
from dynamic_batching.store import shared_state

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def system() -> Iterator[LocalSystem]:
    # One device, whose batch of one long text runs about two seconds.
    with running(LocalSystem(devices=["cpu:0"], env={"SYNTHETIC_PER_TOKEN_S": "0.05"})) as s:
        yield s


def test_finding_9_a_deadline_binds_a_request_whose_device_stopped_mid_batch(system: LocalSystem) -> None:
    r = shared_state.client()
    result = submit("runs long " * 20, model="synthetic", deadline_s=1.5)
    assert r.zscore(DEADLINES_KEY, result.id) is not None, "admitted without its deadline"
    poll_until(lambda: r.hlen(UNACKED_KEY) == 1, "the device to take the batch")
    device = system.pid("gpu-cpu0")
    os.kill(device, signal.SIGSTOP)  # a device that stops answering mid-batch
    try:
        with pytest.raises(DeadlineExceeded, match="passed its deadline before it was answered"):
            result.get(timeout=15)
    finally:
        os.kill(device, signal.SIGCONT)
    assert r.zscore(DEADLINES_KEY, result.id) is None, "the answer strikes it off"
