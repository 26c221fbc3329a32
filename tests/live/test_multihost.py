"""Many hosts: device workers that share nothing with the rest of the system but
REDIS_URL share the load, and losing one of them (SIGKILL) loses no request.

Each "host" is a device worker in its own network namespace (reaching Redis only over
a veth link, never the host's loopback) and its own UTS namespace (its own hostname), with
its own HOME and TMPDIR. Both run `cpu:0`, as two single-GPU hosts would both run
`cuda:0`. Without root or iproute2 the test falls back to separate process groups on
this host with distinct devices (cpu:0, cpu:1), and says so in its output.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from batching_site.harness import LocalSystem, free_port
from batching_site.processes import device_command, redis_server_command
from dynamic_batching.conf import conf
from dynamic_batching.edge.client import details, submit_many
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.protocol.names import UNACKED_KEY, redeliveries_key, taken_key
from dynamic_batching.store import shared_state
from dynamic_batching.store.connection import connect

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[2]
#: A synthetic batch of 32 short texts takes about a third of a second: long enough
#: that a worker is killed mid-batch, short enough that the test stays well under a minute.
HOST_ENV = {"SYNTHETIC_PER_TOKEN_S": "0.001", "SYNTHETIC_OVERHEAD_S": "0.005", "BATCHING_VISIBILITY_TIMEOUT_S": "5"}


@dataclass
class Host:
    name: str
    device: str
    #: Address of Redis as this host sees it.
    redis_host: str
    #: Prefix that runs a command inside this host's namespaces (empty in fallback).
    enter: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def device_id(self) -> str:
        """How the worker names itself: device@hostname (see DeviceRunner)."""
        return f"{self.device}@{self.name if self.enter else socket.gethostname()}"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Hosts:
    """Network namespaces joined to this host by veth pairs, or the fallback."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        tag = f"{os.getpid() % 10000}"
        k = os.getpid() % 250
        self.namespaces: list[str] = []
        self.links: list[str] = []
        self.mode = "network namespaces"
        try:
            if os.environ.get("MULTIHOST_NO_NAMESPACES"):  # to exercise the fallback
                raise PermissionError("MULTIHOST_NO_NAMESPACES is set")
            if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
                raise PermissionError("needs root, iproute2 and unshare")
            self.hosts = [self._namespace(f"mh{tag}{s}", f"10.233.{k}.{4 * i}", s) for i, s in enumerate("ab")]
        except (PermissionError, subprocess.CalledProcessError) as exc:
            self.close()
            self.mode = f"process groups on one host (no namespaces: {exc})"
            self.hosts = [Host("host-a", "cpu:0", "127.0.0.1"), Host("host-b", "cpu:1", "127.0.0.1")]

    def _namespace(self, ns: str, subnet: str, side: str) -> Host:
        base = subnet.rsplit(".", 1)[0]
        last = int(subnet.rsplit(".", 1)[1])
        outside, inside = f"{base}.{last + 1}", f"{base}.{last + 2}"
        _ip("netns", "add", ns)
        self.namespaces.append(ns)
        _ip("link", "add", f"{ns}h", "type", "veth", "peer", "name", f"{ns}n")
        self.links.append(f"{ns}h")
        _ip("link", "set", f"{ns}n", "netns", ns)
        _ip("addr", "add", f"{outside}/30", "dev", f"{ns}h")
        _ip("link", "set", f"{ns}h", "up")
        _ip("netns", "exec", ns, "ip", "addr", "add", f"{inside}/30", "dev", f"{ns}n")
        _ip("netns", "exec", ns, "ip", "link", "set", f"{ns}n", "up")
        _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        name = f"host-{side}"
        # A fresh UTS namespace too, so the worker's hostname (and its device id) is its own.
        enter = ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", f'hostname {name} && exec "$@"', "sh"]
        return Host(name, "cpu:0", outside, enter)

    def start(self, host: Host, redis_port: int) -> None:
        home = self.tmp / host.name
        (home / "tmp").mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "TMPDIR": str(home / "tmp"),
            "REDIS_URL": f"redis://{host.redis_host}:{redis_port}/0",
            "DJANGO_SETTINGS_MODULE": "batching_site.settings",
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            # A clean environment: the test model is on only when asked for.
            "BATCHING_TEST_MODELS": "1",
            "DEVICES": host.device,
            **HOST_ENV,
        }
        log = open(home / "worker.log", "ab")  # noqa: SIM115 - lives as long as the process
        host.proc = subprocess.Popen(
            [*host.enter, *device_command(host.device, preload="synthetic")],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self, host: Host, sig: int = signal.SIGKILL) -> None:
        if host.proc is not None and host.proc.poll() is None:
            os.killpg(host.proc.pid, sig)
            host.proc.wait(15)

    def close(self) -> None:
        for host in getattr(self, "hosts", []):
            try:
                self.kill(host, signal.SIGTERM)
            except subprocess.TimeoutExpired:
                self.kill(host)
        for ns in self.namespaces:  # deleting a namespace deletes the veth end inside it, and its peer
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        for link in self.links:
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=10)
        self.namespaces, self.links = [], []


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[tuple[Hosts, LocalSystem]]:
    previous = conf.REDIS_URL
    tmp = Path(tempfile.mkdtemp(prefix="multihost-"))
    hosts = Hosts(tmp)
    redis_proc = None
    system = None
    try:
        # Redis and the collector on "this" host; Redis also answers on each veth link.
        port = free_port()
        cmd = redis_server_command(port, str(tmp))
        at = cmd.index("--bind") + 2
        cmd[at:at] = sorted({h.redis_host for h in hosts.hosts} - {"127.0.0.1"})
        redis_proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        url = f"redis://127.0.0.1:{port}/0"
        system = LocalSystem(redis_url=url, devices=[], env={"BATCHING_VISIBILITY_TIMEOUT_S": "5"}, log_dir=str(tmp))
        system._wait(lambda: system._redis().ping(), "redis", 15)
        connect(url)
        system.start_collector()
        for host in hosts.hosts:
            hosts.start(host, port)
        system.wait_ready(2, timeout=90)
        print(f"\nmultihost: {hosts.mode}; devices {sorted(shared_state.live_devices())}")
        yield hosts, system
    finally:
        hosts.close()
        if system is not None:
            system.close()
        if redis_proc is not None:
            redis_proc.kill()
            redis_proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
        connect(previous)


def texts(run: str, n: int) -> list[str]:
    return [f"{run} {i} " + "word " * (i % 7) for i in range(n)]


def test_workers_that_share_only_redis_share_the_load(two_hosts: tuple[Hosts, LocalSystem]) -> None:
    hosts, _ = two_hosts
    batch = texts("share", 200)
    results = submit_many(batch, model="synthetic")
    assert [r.get(timeout=60) for r in results] == [synthetic.embed(t) for t in batch]
    ran_on = {details(r)["device"] for r in results}
    assert ran_on == {h.device_id for h in hosts.hosts}, f"not both hosts ran batches ({hosts.mode})"


def test_losing_a_host_loses_no_request(two_hosts: tuple[Hosts, LocalSystem]) -> None:
    hosts, _ = two_hosts
    victim, survivor = hosts.hosts
    batch = texts("kill", 400)
    results = submit_many(batch, model="synthetic")
    # Kill one host while it holds a batch, once the load is well under way. The fault
    # must land: the victim is stopped first (so it cannot finish between the look and
    # the kill) and killed only while a batch message it took is still unacked.
    deadline = time.monotonic() + 30
    while sum(r.ready() for r in results[:100]) < 30:
        assert time.monotonic() < deadline, "no answers before the kill"
        time.sleep(0.02)
    assert victim.proc is not None
    r = shared_state.client()
    held: list[str] = []
    deadline = time.monotonic() + 30
    while not held:
        assert time.monotonic() < deadline, "the victim never held a batch"
        os.killpg(victim.proc.pid, signal.SIGSTOP)
        tags = list(r.hkeys(taken_key(victim.device_id)))
        held = [json.loads(raw)[0]["headers"]["id"] for raw in (r.hmget(UNACKED_KEY, tags) if tags else []) if raw]
        if not held:
            os.killpg(victim.proc.pid, signal.SIGCONT)
            time.sleep(0.01)
    hosts.kill(victim)
    killed_at = time.time()
    assert victim.proc.returncode == -signal.SIGKILL, victim.proc

    # Every request is answered: the victim's unacked batch comes back after the
    # visibility timeout and runs on the survivor, and nothing is answered wrongly.
    answers = [r.get(timeout=60) for r in results]
    assert answers == [synthetic.embed(t) for t in batch]
    late = [d for d in (details(r) for r in results) if d["started_at"] > killed_at]
    assert late, "nothing ran after the kill"
    assert {d["device"] for d in late} == {survivor.device_id}
    # The batches the victim held came back through the broker, counted as redelivered.
    assert all(r.exists(redeliveries_key(task_id)) for task_id in held), f"no redelivery counted for {held}"
    print(f"multihost: {hosts.mode}; {len(late)} requests ran on the survivor after the kill")
