"""A whole local system for tests and benchmarks: Redis on a free port, the collector
and N device workers, as real processes started from the same command lines as
`make run` (batching_site/processes.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

from tasks.protocol.names import COLLECTOR_KEY, DEVICE_PREFIX

from .processes import collector_command, device_command, redis_server_command


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
            live = list(r.scan_iter(match=DEVICE_PREFIX + "*"))
            collector = r.get(COLLECTOR_KEY)
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
