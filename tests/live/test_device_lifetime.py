"""Issue 41, finding 14: a worker dies with its supervisor, and one device id is served
by one live worker at a time. On the process set the harness starts under supervisord,
as `make run` does."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import pytest
from polling import poll_until
from systems import running

from batching_site.harness import LocalSystem
from dynamic_batching.processes import device_command

pytestmark = pytest.mark.live


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0) until its parent reaps it: ask /proc.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def system() -> Iterator[LocalSystem]:
    # Redis, the collectors, a device worker and the web process, as `make run` has them.
    with running(LocalSystem(devices=["cpu:0"], web=True), timeout=120) as s:
        pids = s.pids()
        try:
            yield s
        finally:
            for pid in pids.values():  # whatever outlived its supervisor (Redis does)
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


def test_finding_14_every_program_dies_with_a_killed_supervisor(system: LocalSystem) -> None:
    pids = system.pids()
    assert {"redis", "gpu-cpu0"} <= set(pids) and any(n.startswith("collector") for n in pids), pids
    assert system._supervisord is not None
    system._supervisord.kill()  # kill -9 of the supervisor: no chance to stop its programs
    system._supervisord.wait(10)
    poll_until(lambda: not any(alive(pid) for pid in pids.values()), "every program to die with it", timeout=10)


def test_finding_14_a_second_worker_for_a_served_device_refuses_to_start(system: LocalSystem) -> None:
    served = system.pids()["gpu-cpu0"]
    done = subprocess.run(device_command("cpu:0"), env=system.env(), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"already served on this host by worker pid {served}" in done.stdout + done.stderr
    assert alive(served), "the worker that served it keeps serving"
