"""A whole local system for tests and benchmarks, run the way `make run` runs one: the
same process definitions (batching_site/processes.py) under the same supervisor
(supervisord), on a Redis of its own on a free port.

A process killed here is restarted by supervisord, exactly as under `make run`; the
tests never restart anything themselves. Programs can be added while the system runs
(a third device, a late collector): each is one file in an include folder that
supervisord re-reads.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import xmlrpc.client
from collections.abc import Callable
from typing import Any

from dynamic_batching.protocol.names import COLLECTOR_KEY, DEVICE_PREFIX

from . import processes


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the process that started us dies, so
    a test run that is killed outright leaves no supervisor behind (Linux only);
    supervisord then stops its programs."""
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
    """Redis, the collector and N device workers (and, when asked, the web process,
    Flower and the TLS front door) as real processes under supervisord.

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
        web: bool = False,
        flower: bool = False,
        proxy: bool = False,
        program_env: dict[str, dict[str, str]] | None = None,
    ) -> None:
        self.devices = ["cpu:0", "cpu:1"] if devices is None else devices
        self.preload = preload
        self.extra_env = env or {}
        #: More environment for single programs, by name (a skewed clock, say).
        self.program_env = program_env or {}
        self._tmp = tempfile.mkdtemp(prefix="batching-")
        self.log_dir = log_dir or self._tmp
        os.makedirs(self.log_dir, exist_ok=True)
        self._programs_dir = os.path.join(self._tmp, "programs")
        os.makedirs(self._programs_dir)
        self._redis_port: int | None = None
        if redis_url is None:
            self._redis_port = free_port()
            redis_url = f"redis://127.0.0.1:{self._redis_port}/0"
        self.redis_url: str = redis_url
        self.web_port = free_port() if web or proxy else None
        self.flower_port = free_port() if flower else None
        #: Caddy in front of web (and Flower): https://localhost:PORT, with a certificate
        #: from a CA of its own made in this system's folder.
        self.proxy = (
            processes.Proxy(https_port=free_port(), http_port=free_port(), data_dir=os.path.join(self._tmp, "caddy"))
            if proxy
            else None
        )
        self._supervisord: subprocess.Popen[bytes] | None = None
        self._rpc: Any = None

    # -- the process set

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "REDIS_URL": self.redis_url,
                "DJANGO_SETTINGS_MODULE": "batching_site.settings",
                "DEVICES": ",".join(self.devices),
                "DEVICE_COUNT": str(len(self.devices)),
                "HF_HUB_OFFLINE": "1",
                "PYTHONUNBUFFERED": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "DATABASE_URL": f"sqlite:///{self._tmp}/db.sqlite3",
            }
        )
        env.update(self.extra_env)
        return env

    def user_token(self, username: str, *, quota: dict[str, Any] | None = None) -> str:
        """A new user of this system's own web process (its own database), with a
        ClientQuota row when `quota` is given, and a new API token for it."""
        code = f"from django.contrib.auth.models import User; u = User.objects.create_user({username!r})"
        if quota:
            code += (
                f"; from dynamic_batching.models import ClientQuota; ClientQuota.objects.create(user=u, **{quota!r})"
            )
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "shell", "-c", code], env=self.env(), check=True, capture_output=True, cwd=_ROOT)
        out = subprocess.run(
            [*manage, "create_api_token", username],
            env=self.env(),
            check=True,
            capture_output=True,
            text=True,
            cwd=_ROOT,
        ).stdout
        return out.strip().splitlines()[-1]

    def programs(self) -> dict[str, list[str]]:
        """The programs `start` runs: `make run`'s set (processes.programs)."""
        redis = (self._redis_port, self._tmp) if self._redis_port is not None else None
        return processes.programs(
            self.devices,
            preload=self.preload,
            redis=redis,
            web_port=self.web_port,
            flower_port=self.flower_port,
            proxy=self.proxy,
        )

    def start(self, timeout: float = 120.0) -> LocalSystem:
        programs = self.programs()
        if "redis" in programs:
            self.add("redis", programs.pop("redis"), self.program_env.get("redis"))
            self.wait_redis()
        if "web" in programs:
            subprocess.run(
                [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
                cwd=_ROOT,
                env=self.env(),
                check=True,
            )
        for name, cmd in programs.items():
            self.add(name, cmd, self.program_env.get(name))
        self.wait_ready(len(self.devices), timeout)
        # Web and Flower import for seconds on start: a benchmark that started measuring
        # before they answer shared the CPU with them (a transient in its first seconds).
        for port, path in ((self.web_port, "/healthz"), (self.flower_port, "/")):
            if port is not None:
                self.wait_http(port, path, timeout)
        return self

    def start_redis(self) -> None:
        """Only Redis (a bare broker): what is submitted stays queued."""
        assert self._redis_port is not None, "this system uses a Redis it was given"
        self.add("redis", processes.redis_server_command(self._redis_port, self._tmp, appendonly=True))
        self.wait_redis()

    def start_collector(self, env: dict[str, str] | None = None) -> None:
        self.add("collector", processes.collector_command(), env)

    def start_device(self, device: str, env: dict[str, str] | None = None) -> None:
        self.add(processes.program_name(device), processes.device_command(device, preload=self.preload), env)

    def add(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        """Run one more supervised program (restarted whenever it dies)."""
        section = processes.program_section(
            name, cmd, cwd=_ROOT, log_file=os.path.join(self.log_dir, f"{name}.log"), environment=env
        )
        with open(os.path.join(self._programs_dir, f"{name}.conf"), "w") as f:
            f.write(section)
        rpc = self._supervisor()
        rpc.supervisor.reloadConfig()
        try:
            rpc.supervisor.addProcessGroup(name)
        except xmlrpc.client.Fault as exc:
            if "ALREADY_ADDED" not in exc.faultString:
                raise

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Signal a program's main process, as `kill -9` would; supervisord restarts it.
        Returns the pid it signalled."""
        pid = self.pid(name)
        os.kill(pid, sig)
        return pid

    def stop(self, name: str) -> None:
        """Stop a program for good (supervisord does not restart it) and forget it."""
        rpc = self._supervisor()
        try:
            rpc.supervisor.stopProcessGroup(name)
            rpc.supervisor.removeProcessGroup(name)
        except xmlrpc.client.Fault as exc:
            if "BAD_NAME" not in exc.faultString:
                raise
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(self._programs_dir, f"{name}.conf"))

    def pid(self, name: str) -> int:
        return int(self._supervisor().supervisor.getProcessInfo(name)["pid"])

    def pids(self) -> dict[str, int]:
        """Every running program's main pid, by name."""
        return {p["name"]: int(p["pid"]) for p in self._supervisor().supervisor.getAllProcessInfo() if p["pid"]}

    def states(self) -> dict[str, str]:
        """Every program's state as supervisord sees it: RUNNING, STARTING, BACKOFF, ..."""
        return {p["name"]: p["statename"] for p in self._supervisor().supervisor.getAllProcessInfo()}

    def close(self) -> None:
        sup = self._supervisord
        if sup is not None and sup.poll() is None:
            sup.send_signal(signal.SIGTERM)  # stops every program, Redis last
            try:
                sup.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(sup.pid, signal.SIGKILL)
                sup.wait(10)
        self._supervisord = None
        self._rpc = None
        if self.log_dir == self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
        else:
            shutil.rmtree(self._programs_dir, ignore_errors=True)

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

    # -- waiting

    def wait_redis(self, timeout: float = 15.0) -> None:
        self._wait(lambda: self._redis().ping(), "redis to answer", timeout)

    def wait_ready(self, devices: int, timeout: float = 120.0) -> None:
        def ready() -> bool:
            r = self._redis()
            live = list(r.scan_iter(match=DEVICE_PREFIX + "*"))
            collector = r.get(COLLECTOR_KEY)
            return len(live) >= devices and collector is not None and json.loads(collector)["devices"] >= devices

        self._wait(ready, f"collector and {devices} device worker(s)", timeout)

    def wait_http(self, port: int, path: str, timeout: float = 60.0) -> None:
        """Until something answers HTTP on this port (any status: Flower may ask to log in)."""

        def answers() -> bool:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                conn.request("GET", path)
                return conn.getresponse().status > 0
            finally:
                conn.close()

        self._wait(answers, f"an HTTP answer on port {port}", timeout)

    def wait_running(self, name: str, timeout: float = 60.0) -> None:
        """Until supervisord reports `name` RUNNING (again)."""
        self._wait(lambda: self.states().get(name) == "RUNNING", f"{name} to run", timeout)

    # -- helpers

    def _supervisor(self) -> Any:
        """The XML-RPC interface of this system's supervisord, started on first use."""
        if self._rpc is not None:
            return self._rpc
        conf = os.path.join(self._tmp, "supervisord.conf")
        with open(conf, "w") as f:
            f.write(processes.supervisord_section(self._tmp, include=os.path.join(self._programs_dir, "*.conf")))
        log = open(os.path.join(self.log_dir, "supervisord.out"), "ab")  # noqa: SIM115 - lives as long as the process
        self._supervisord = subprocess.Popen(
            [sys.executable, "-m", "supervisor.supervisord", "-c", conf],
            cwd=_ROOT,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        from supervisor.xmlrpc import SupervisorTransport

        deadline = time.monotonic() + 30
        while True:
            # A fresh transport each try: one whose request failed cannot send another.
            transport = SupervisorTransport(None, None, f"unix://{self._tmp}/supervisor.sock")
            rpc = xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)
            try:
                rpc.supervisor.getState()
                break
            except (OSError, http.client.HTTPException, xmlrpc.client.Fault):
                if self._supervisord.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"supervisord did not start; see {self.log_dir}/supervisord.out") from None
                time.sleep(0.05)
        self._rpc = rpc
        return rpc

    def _redis(self) -> Any:
        import redis

        return redis.Redis.from_url(self.redis_url, socket_connect_timeout=1)

    def _wait(self, predicate: Callable[[], Any], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._supervisord is not None and self._supervisord.poll() is not None:
                raise RuntimeError(f"supervisord exited while waiting for {what}; logs in {self.log_dir}")
            fatal = [name for name, state in (self.states() if self._rpc else {}).items() if state == "FATAL"]
            if fatal:
                raise RuntimeError(
                    f"{fatal[0]} could not start while waiting for {what}:\n{self.logs(fatal[0])[-3000:]}"
                )
            try:
                if predicate():
                    return
            except Exception:  # noqa: BLE001,S110 - not up yet
                pass
            time.sleep(0.1)
        tails = "\n".join(f"--- {name}\n{self.logs(name)[-1500:]}" for name in (self.states() if self._rpc else {}))
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; logs in {self.log_dir}\n{tails}")


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
