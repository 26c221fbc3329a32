"""The front door's configuration: processes.programs() adds Caddy, with the Caddyfile
compose mounts, only when asked; the Caddyfile parses with compose's environment and
with the local one; the web role runs threaded; and no role starts on a change-me
placeholder, naming the variable but never its value."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from batching_site import processes, serve

PROXY = processes.Proxy(https_port=8443, http_port=8080, data_dir="/tmp/caddy-test")


def env_of(cmd: list[str]) -> dict[str, str]:
    """The KEY=VALUE words that `env` puts before the program."""
    assert os.path.basename(cmd[0]) == "env"
    return dict(word.split("=", 1) for word in cmd[1:] if "=" in word and not word.startswith("-"))


def test_programs_add_the_proxy_only_when_asked() -> None:
    assert "proxy" not in processes.programs(["cpu:0"])
    assert "--url_prefix=flower" not in processes.programs(["cpu:0"])["flower"]

    progs = processes.programs(["cpu:0"], web_port=8001, flower_port=5556, proxy=PROXY)
    assert list(progs)[-1] == "proxy"
    assert "--url_prefix=flower" in progs["flower"]
    cmd = progs["proxy"]
    assert os.path.basename(cmd[-6]) == "caddy"
    assert cmd[-5:] == ["run", "--config", processes.CADDYFILE, "--adapter", "caddyfile"]
    env = env_of(cmd)
    assert env["SITE_ADDRESS"] == "localhost:8443"
    assert env["FLOWER_ADDRESS"] == "flower.localhost:8443", "Flower on a host name of its own"
    assert env["HTTP_PORT"] == "8080"
    assert env["PROXY_BIND"] == "127.0.0.1"
    assert (env["WEB_UPSTREAM"], env["FLOWER_UPSTREAM"]) == ("127.0.0.1:8001", "127.0.0.1:5556")
    assert env["XDG_DATA_HOME"].startswith(PROXY.data_dir)

    with pytest.raises(ValueError, match="web_port"):
        processes.programs(["cpu:0"], web_port=None, proxy=PROXY)


def test_the_proxy_program_survives_supervisord_quoting() -> None:
    cmd = processes.programs([], web_port=8001, flower_port=None, proxy=PROXY)["proxy"]
    text = processes.supervisor_config({"proxy": cmd}, run_dir="/tmp/run", cwd="/srv/app")
    assert f"--config {processes.CADDYFILE}" in text


@pytest.mark.parametrize(
    "where",
    [
        {
            "SITE_ADDRESS": "localhost",
            "FLOWER_ADDRESS": "flower.localhost",
            "WEB_UPSTREAM": "web:8000",
            "FLOWER_UPSTREAM": "flower:5555",
        },  # compose
        {"SITE_ADDRESS": "batching.example.com", "FLOWER_ADDRESS": "flower.batching.example.com"},  # ACME
        "local",
    ],
)
def test_the_caddyfile_adapts(where: object, tmp_path: Path) -> None:
    caddy = shutil.which("caddy")
    if caddy is None:
        pytest.skip("no caddy: `apt-get install -y caddy` (make test does it)")
    if where == "local":
        settings = env_of(processes.programs([], web_port=8001, flower_port=5556, proxy=PROXY)["proxy"])
    else:
        assert isinstance(where, dict)
        settings = where
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), **settings}
    result = subprocess.run(
        [caddy, "adapt", "--config", processes.CADDYFILE, "--adapter", "caddyfile"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    (server,) = config["apps"]["http"]["servers"].values()
    routes = {tuple(r["match"][0]["host"]): json.dumps(r) for r in server["routes"]}
    site = settings["SITE_ADDRESS"].split(":")[0]
    flower = settings.get("FLOWER_ADDRESS", "flower.localhost").split(":")[0]
    assert set(routes) == {(site,), (flower,)}, "the site and Flower, each on its own host name"
    # The site's host name only sends old Flower links on; Flower's admits staff only,
    # read-only, without its control API.
    assert "flower:5555" not in routes[(site,)] and settings.get("FLOWER_UPSTREAM", "5556") not in routes[(site,)]
    text = routes[(flower,)]
    assert "/auth/staff" in text and "*/api/task/*" in text and "*/api/worker/*" in text
    assert "/_staff/enter" in text
    assert settings.get("WEB_UPSTREAM", "web:8000") in text


def test_the_web_role_serves_the_site_as_asgi_on_uvicorn_workers() -> None:
    cmd = processes.web_command(workers=3, connections=50)
    assert "batching_site.asgi:application" in cmd
    assert cmd[cmd.index("--workers") + 1] == "3"
    assert cmd[cmd.index("--worker-class") + 1] == "batching_site.web_worker.Worker"
    assert cmd[cmd.index("--worker-connections") + 1] == "50"
    default = serve.command(["web"])
    assert default[default.index("--worker-connections") + 1] == "1000"


def test_a_placeholder_credential_stops_every_role_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_exec(*args: object) -> None:
        raise AssertionError("a role was started with a placeholder credential")

    monkeypatch.setattr(os, "execv", no_exec)
    monkeypatch.setenv("DJANGO_SECRET_KEY", "change-me-to-50-random-characters")
    monkeypatch.setenv("REDIS_URL", "redis://:Change-Me@redis:6379/0")
    monkeypatch.setenv("DATABASE_URL", "postgres://batching:a-real-one@postgres:5432/batching")
    monkeypatch.delenv("REDIS_PASSWORD", raising=False)
    monkeypatch.delenv("POSTGRES_PASSWORD", raising=False)
    monkeypatch.delenv("FLOWER_BASIC_AUTH", raising=False)
    for role in (["migrate"], ["web"], ["collector"], ["device", "cuda:0"], ["flower", "--behind-proxy"]):
        with pytest.raises(SystemExit) as stopped:
            serve.main(role)
        message = str(stopped.value.code)
        assert message == "replace change-me in .env: DJANGO_SECRET_KEY, REDIS_PASSWORD (in REDIS_URL)"
        assert "Change-Me" not in message and "50-random" not in message


def test_real_credentials_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[list[str]] = []
    monkeypatch.setattr(os, "execv", lambda path, cmd: started.append(cmd))
    monkeypatch.setattr(os, "chdir", lambda path: None)
    monkeypatch.setenv("DJANGO_SECRET_KEY", "x" * 50)
    monkeypatch.setenv("REDIS_URL", "redis://:s3cret@redis:6379/0")
    for name in ("DATABASE_URL", "REDIS_PASSWORD", "POSTGRES_PASSWORD", "FLOWER_BASIC_AUTH"):
        monkeypatch.delenv(name, raising=False)
    serve.main(["collector"])
    assert started == [processes.collector_command()]
