"""The deployment files: docker-compose.yml validates with Debian's docker-compose (no
engine needed), takes every credential from the env file, gives every long-running
service a health check and every GPU worker its own GPU, and publishes ports only at the
TLS front door; the GPU check script parses."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from batching_site import processes, serve

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
NO_COMPOSE = (
    "docker-compose is not installed (`make test` installs Debian's package; or apt-get install docker-compose)"
)


def compose(env_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip(NO_COMPOSE)
    # A clean environment: a variable exported in the shell would mask a missing one.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        [binary, "--env-file", str(env_file), "-f", str(COMPOSE), "--project-directory", str(ROOT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def required_vars() -> list[str]:
    return [
        line.split("=", 1)[0]
        for line in ENV_EXAMPLE.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def test_compose_file_validates_with_the_example_env() -> None:
    result = compose(ENV_EXAMPLE, "config", "-q")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("var", ["REDIS_PASSWORD", "POSTGRES_PASSWORD", "DJANGO_SECRET_KEY", "SITE_HOST"])
def test_a_missing_credential_stops_compose_and_names_it(var: str, tmp_path: Path) -> None:
    assert var in required_vars()
    env_file = tmp_path / "env"
    env_file.write_text(
        "".join(f"{line}\n" for line in ENV_EXAMPLE.read_text().splitlines() if not line.startswith(var))
    )
    result = compose(env_file, "config", "-q")
    assert result.returncode != 0
    assert f"set {var}" in result.stderr


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    result = compose(ENV_EXAMPLE, "config")
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_every_long_running_service_has_a_health_check(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    assert {"redis", "postgres", "web", "collector", "flower", "gpu-0", "gpu-1", "proxy"} <= set(services)
    for name, svc in services.items():
        if name != "migrate":  # a one-shot job
            assert svc.get("healthcheck", {}).get("test"), f"{name} has no health check"
    assert "/healthz" in " ".join(services["web"]["healthcheck"]["test"])
    assert "redis-cli ping" in " ".join(services["redis"]["healthcheck"]["test"])
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    for name in ("collector", "gpu-0", "gpu-1"):
        assert "inspect ping -d" in " ".join(services[name]["healthcheck"]["test"])


def test_each_gpu_worker_reserves_its_own_gpu_and_mounts_the_model_cache(resolved: dict[str, Any]) -> None:
    gpus = {n: s for n, s in resolved["services"].items() if n.startswith("gpu-")}
    seen: set[str] = set()
    for name, svc in gpus.items():
        (reservation,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert reservation["driver"] == "nvidia"
        assert "gpu" in reservation["capabilities"]
        (gpu,) = reservation["device_ids"]
        assert gpu not in seen, f"{name} shares GPU {gpu}"
        seen.add(gpu)
        assert any(v.startswith("model-cache:") for v in svc["volumes"])
        assert svc["command"][-2:] == ["device", "cuda:0"]  # the reserved GPU, as the container sees it


def test_services_run_the_tested_command_lines_and_persist_redis(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    assert services["web"]["command"][3] == "web"  # gunicorn, see processes.web_command
    assert services["collector"]["command"][-1] == "collector"
    redis_command = " ".join(services["redis"]["command"])
    assert '--appendonly yes --appendfsync "$$REDIS_APPENDFSYNC"' in redis_command
    assert services["redis"]["environment"]["REDIS_APPENDFSYNC"] == "everysec"  # unless .env says always
    assert services["flower"]["command"][-4:] == ["flower", "--behind-proxy", "--address", "0.0.0.0"]
    # Every secret-looking setting is interpolated from .env, never written here.
    for line in COMPOSE.read_text().splitlines():
        m = re.match(r"\s*(\w*(PASSWORD|SECRET|AUTH)\w*):\s*(\S+)", line)
        if m:
            assert m.group(3).startswith("${"), f"{m.group(1)} is hard-coded in docker-compose.yml"


def test_only_the_proxy_publishes_ports_and_redis_only_on_loopback(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    published = {name for name, svc in services.items() if svc.get("ports")}
    assert published == {"proxy", "redis"}
    assert {(p["published"], p["target"]) for p in services["proxy"]["ports"]} == {(80, 80), (443, 443)}
    (redis_port,) = services["redis"]["ports"]
    assert str(redis_port).startswith("127.0.0.1:"), redis_port


def test_the_proxy_runs_the_tested_caddyfile_and_the_app_trusts_it(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    proxy = services["proxy"]
    assert any(v.startswith(f"{ROOT}/batching_site/deploy/Caddyfile:/etc/caddy/Caddyfile") for v in proxy["volumes"])
    assert proxy["environment"]["SITE_ADDRESS"] == "localhost"
    assert (proxy["environment"]["WEB_UPSTREAM"], proxy["environment"]["FLOWER_UPSTREAM"]) == (
        "web:8000",
        "flower:5555",
    )
    for name in ("web", "migrate", "flower"):
        env = services[name]["environment"]
        assert env["DJANGO_BEHIND_TLS_PROXY"] == "1"
        assert env["DJANGO_HTTPS"] == "1"
        assert env["DJANGO_CSRF_TRUSTED_ORIGINS"] == "https://localhost"
    assert "FLOWER_BASIC_AUTH" not in services["flower"]["environment"]


def test_the_containers_settings_pass_check_deploy(tmp_path: Path) -> None:
    # An operator's .env: the example with every change-me replaced.
    env_file = tmp_path / "env"
    env_file.write_text(
        "".join(
            line.replace("change-me-to-50-random-characters", secrets.token_urlsafe(50)).replace(
                "change-me", secrets.token_urlsafe(16)
            )
            + "\n"
            for line in ENV_EXAMPLE.read_text().splitlines()
        )
    )
    yaml = pytest.importorskip("yaml")
    result = compose(env_file, "config")
    assert result.returncode == 0, result.stderr
    web = yaml.safe_load(result.stdout)["services"]["web"]["environment"]
    assert serve.placeholders(web) == []
    env = {"PATH": os.environ.get("PATH", ""), "DJANGO_READ_DOT_ENV": "0", **web}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path}/db.sqlite3"  # no postgres here; check --deploy reads none
    check = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_redis_refuses_the_placeholder_password(tmp_path: Path) -> None:
    # The same guard as the app services' (serve.placeholders), in Redis' own shell.
    yaml = pytest.importorskip("yaml")
    resolved = yaml.safe_load(compose(ENV_EXAMPLE, "config").stdout)
    script = (
        resolved["services"]["redis"]["command"][2].replace("$$", "$").replace("exec redis-server", "echo redis-server")
    )
    for password, refused in (("change-me", True), ("s3cret-value", False)):
        result = subprocess.run(
            ["sh", "-c", script],
            env={"REDIS_PASSWORD": password, "REDIS_MAXMEMORY": "1mb"},
            capture_output=True,
            text=True,
        )
        assert (result.returncode != 0) == refused, result
        if refused:
            assert result.stderr.strip() == "replace change-me in .env: REDIS_PASSWORD"


def test_redis_has_a_memory_limit_and_never_evicts(resolved: dict[str, Any], tmp_path: Path) -> None:
    # Evicting would drop queued requests or answers without a word; noeviction makes a
    # full Redis refuse writes instead, and /metrics exports how close it is.
    redis = resolved["services"]["redis"]
    command = " ".join(redis["command"])
    assert re.search(r'--maxmemory "\$+REDIS_MAXMEMORY"', command), command  # $$ escapes compose's interpolation
    assert "--maxmemory-policy noeviction" in command
    assert redis["environment"]["REDIS_MAXMEMORY"] == "2gb"

    env_file = tmp_path / "env"
    env_file.write_text(ENV_EXAMPLE.read_text() + "REDIS_MAXMEMORY=512mb\n")
    yaml = pytest.importorskip("yaml")
    result = compose(env_file, "config")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["services"]["redis"]["environment"]["REDIS_MAXMEMORY"] == "512mb"


def test_serve_roles_exec_the_same_commands_as_make_run_and_the_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    assert serve.command(["device", "cuda:1"]) == processes.device_command("cuda:1")
    assert serve.command(["device", "cuda:0", "--preload", "minilm"]) == processes.device_command(
        "cuda:0", preload="minilm"
    )
    assert serve.command(["collector"]) == processes.collector_command()
    web = serve.command(["web"])
    assert web[1:4] == ["-m", "gunicorn", "batching_site.asgi:application"]
    monkeypatch.delenv("FLOWER_BASIC_AUTH", raising=False)
    behind = serve.command(["flower", "--behind-proxy", "--address", "0.0.0.0"])
    assert behind == [*processes.flower_command(behind_proxy=True), "--address=0.0.0.0"]
    assert "--url_prefix=flower" in behind
    monkeypatch.setenv("FLOWER_BASIC_AUTH", "user:secret")
    assert serve.command(["flower", "--address", "0.0.0.0"])[-1] == "--address=0.0.0.0"


def test_web_and_flower_listen_on_loopback_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch, resolved: dict[str, Any]
) -> None:
    # Issue 42, finding 7: both bound 0.0.0.0, Flower with no login, and gunicorn
    # trusted X-Forwarded-* from anyone, all safe only inside compose.
    web = serve.command(["web"])
    assert web[web.index("--bind") + 1] == "127.0.0.1:8000"
    assert web[web.index("--forwarded-allow-ips") + 1] == "127.0.0.1,::1"
    monkeypatch.delenv("FLOWER_BASIC_AUTH", raising=False)
    assert serve.command(["flower"])[-1] == "--address=127.0.0.1"
    with pytest.raises(SystemExit):
        serve.command(["flower", "--address", "0.0.0.0"])  # open to the network, no login
    compose = {name: " ".join(svc["command"]) for name, svc in resolved["services"].items() if "command" in svc}
    assert "--bind 0.0.0.0:8000 --forwarded-allow-ips *" in compose["web"]
    assert "--behind-proxy --address 0.0.0.0" in compose["flower"]


def test_gpu_check_script_is_valid_bash() -> None:
    result = subprocess.run(["bash", "-n", str(ROOT / "bench" / "gpu_check.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
