"""A device worker killed while it holds a batch: the worker supervisord starts in its
place hands the batch back at once (gpu_workers/taken.py), so its callers wait for a
restart and a run, not for the broker's visibility timeout (30 s here, the default)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from polling import poll_until
from systems import running

from batching_site.harness import LocalSystem
from dynamic_batching.edge.client import submit
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.protocol.names import taken_key
from dynamic_batching.store import shared_state

pytestmark = pytest.mark.live

VISIBILITY_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def one_slow_device() -> Iterator[LocalSystem]:
    # Every batch takes 2 s, so a kill lands while the device holds one.
    env = {"BATCHING_VISIBILITY_TIMEOUT_S": str(VISIBILITY_TIMEOUT_S), "SYNTHETIC_OVERHEAD_S": "2"}
    with running(LocalSystem(devices=["cpu:0"], preload="synthetic", env=env), timeout=180) as system:
        yield system


def test_a_batch_held_by_a_killed_device_is_handed_back_by_the_worker_that_replaces_it(
    one_slow_device: LocalSystem,
) -> None:
    text = "held by a device that is killed"
    result = submit(text, model="synthetic")
    holder = taken_key(f"cpu:0@{socket.gethostname()}")
    poll_until(lambda: shared_state.client().hlen(holder) == 1, "the device to take the batch", timeout=30)
    one_slow_device.kill("gpu-cpu0")
    # The broker alone would hand it out again only after the visibility timeout; the
    # one device's successor hands it back as it starts, then runs it (2 s).
    assert result.get(timeout=VISIBILITY_TIMEOUT_S - 5) == synthetic.embed(text)
    one_slow_device.wait_ready(1)
