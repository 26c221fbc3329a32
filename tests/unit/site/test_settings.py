"""Production settings: `check --deploy` is clean with a production environment, HTTPS
protections are on whenever DEBUG is off, and no credential has a default."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

#: Every variable the settings read that a production deployment might set; each test
#: starts from none of them, so a developer's .env or shell cannot change the answer
#: (values set here win over .env, which never overwrites).
KNOBS = (
    "DJANGO_DEBUG",
    "DJANGO_SECRET_KEY",
    "DJANGO_ALLOWED_HOSTS",
    "DJANGO_HTTPS",
    "DJANGO_SECURE_SSL_REDIRECT",
    "DJANGO_HSTS_SECONDS",
    "DJANGO_HSTS_INCLUDE_SUBDOMAINS",
    "DJANGO_HSTS_PRELOAD",
    "BATCHING_TEST_MODELS",
)


def production_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KNOBS and k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "batching_site.settings",
            "DJANGO_READ_DOT_ENV": "0",
            "DJANGO_DEBUG": "0",
            "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
            "DJANGO_ALLOWED_HOSTS": "batching.example.com",
            "DJANGO_SECURE_SSL_REDIRECT": "1",
            "DJANGO_HTTPS": "1",
        }
    )
    env.update(extra)
    return env


def settings_in(env: dict[str, str], *names: str) -> dict[str, object]:
    code = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        f"print(json.dumps({{n: getattr(s, n, None) for n in {list(names)!r}}}, default=str))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_check_deploy_is_clean_with_a_production_environment() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=production_env(),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_warns_while_the_test_model_is_on() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=production_env(BATCHING_TEST_MODELS="1"),
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and "batching.W001" in result.stderr + result.stdout


def test_https_protections_default_on_when_debug_is_off() -> None:
    env = production_env()
    del env["DJANGO_HTTPS"], env["DJANGO_SECURE_SSL_REDIRECT"]
    got = settings_in(
        env, "DEBUG", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_HSTS_SECONDS", "SECURE_HSTS_PRELOAD"
    )
    assert got == {
        "DEBUG": False,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_HSTS_SECONDS": 31_536_000,
        "SECURE_HSTS_PRELOAD": True,
    }


def test_no_secret_has_a_default() -> None:
    env = production_env()
    del env["DJANGO_SECRET_KEY"]
    # Without DJANGO_SECRET_KEY every process makes up its own key: none is shipped.
    first, second = (settings_in(env, "SECRET_KEY")["SECRET_KEY"] for _ in range(2))
    assert first != second and len(str(first)) >= 50


def test_a_bad_quota_setting_stops_manage_py_naming_it() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=production_env(BATCHING_DEFAULT_QUOTA="rate=5"),
        capture_output=True,
        text=True,
    )
    assert (
        result.returncode != 0
        and "(BATCHING_DEFAULT_QUOTA) is not a valid quota: unknown quota field(s) rate" in result.stderr
    )


def test_an_older_celery_is_an_error_that_says_what_to_do() -> None:
    from dynamic_batching.checks import celery_version

    assert celery_version() == [], "the installed Celery is new enough"
    [error] = celery_version(version="5.6.3")
    assert error.id == "batching.E002" and "5.6.3" in error.msg and "--no-deps" in error.hint
    assert celery_version(version="5.7.0rc1") == [] and celery_version(version="6.0.0") == []
