"""System checks: what must not be on in production (`manage.py check --deploy`), and
what must hold for the system to work at all (every `manage.py` command, `migrate`
included). Each error names the setting and the fix; each id has its own test
(tests/unit/site/test_checks.py).

| id | what it catches |
| --- | --- |
| batching.E001 | a quota that does not parse |
| batching.E002 | a Celery older than answers reach callers with |
| batching.E003 | a BATCHING key out of range, or unknown |
| batching.E010 | a database still under the app's old label `tasks` |
| batching.E011 | a configured model whose spec does not build |
| batching.E012 | DEFAULT_MODEL not among the configured models |
| batching.E020 | the broker, the result backend and batching's Redis on different servers or databases |
| batching.E021 | the Celery app batching uses was never passed to configure() |
| batching.E022 | CELERY_APP unset, or not importable |
| batching.E030 | a visibility timeout no longer than the batch hard limit plus its grace |
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .conf import conf


@checks.register(checks.Tags.security, deploy=True)
def test_models_off(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if _conf_errors():
        return []
    if conf.TEST_MODELS:
        return [
            checks.Warning(
                "the test model `synthetic` is on: anyone who may submit can fail, stall or kill a device "
                "with its !fail, !slow, !hang and !crash directives",
                hint="unset BATCHING_TEST_MODELS (it is for tests and benchmarks only)",
                id="batching.W001",
            )
        ]
    return []


@checks.register(checks.Tags.security, deploy=True)
def demo_quota(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if not _conf_errors() and conf.OPEN_DEMO:
        return [
            checks.Info(
                'BATCHING["OPEN_DEMO"] is on: visitors who are not logged in may submit, sharing ANONYMOUS_QUOTA',
                id="batching.I001",
            )
        ]
    return []


def _conf_errors() -> list[checks.CheckMessage]:
    try:
        conf.values()
    except ImproperlyConfigured as exc:
        return [
            checks.Error(
                str(exc), hint="see docs/configuration.md for every key, its variable and its range", id="batching.E003"
            )
        ]
    return []


@checks.register()
def settings_valid(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return _conf_errors()


@checks.register()
def quotas_valid(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from .core.quota import Quota

    if _conf_errors():
        return []
    errors = []
    for key in ("DEFAULT_QUOTA", "ANONYMOUS_QUOTA"):
        try:
            Quota.from_mapping(dict(getattr(conf, key)))
        except (TypeError, ValueError) as exc:
            errors.append(
                checks.Error(
                    f'BATCHING["{key}"] (BATCHING_{key}) is not a valid quota: {exc}',
                    hint='e.g. "rate_per_s=50,burst=200,max_in_flight=500,tier_share=0.5"',
                    id="batching.E001",
                )
            )
    return errors


#: The oldest Celery the answers reach callers with. pyproject.toml asks for it, but a
#: package pinning an older one can downgrade it (celery-batches 0.11 pulls 5.6.3 unless
#: installed with --no-deps), and under 5.6.3 beside kombu 5.7 a caller's `.get()` never
#: heard its answer: the answer was in Redis, the caller waited until its timeout.
MIN_CELERY = (5, 7)


@checks.register()
def celery_version(app_configs: Any = None, *, version: str | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    import celery

    found = version or celery.__version__
    if tuple(int(part) for part in re.findall(r"\d+", found)[:2]) >= MIN_CELERY:
        return []
    return [
        checks.Error(
            f"Celery {found} is installed, and this project needs {'.'.join(map(str, MIN_CELERY))} or newer: "
            "with an older one a caller's .get() may never hear its answer",
            hint="pip install 'celery[redis]>=5.7,<6' (make venv does); install a package that pins an older "
            "Celery with --no-deps, as make bench installs celery-batches",
            id="batching.E002",
        )
    ]


@checks.register(checks.Tags.database)
def old_label(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from .relabel import OLD_LABEL, pending

    errors = []
    for alias in databases or ():
        moved = pending(alias)
        if moved:
            errors.append(
                checks.Error(
                    f"database {alias!r} holds the batching tables under the app's old label {OLD_LABEL!r} "
                    f"({', '.join(old for old, _ in moved)}): migrate would create empty ones beside them",
                    hint=f"run `manage.py batching_relabel --database {alias}` once, before migrate; it keeps every row",
                    id="batching.E010",
                )
            )
    return errors


@checks.register()
def models_build(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from dynamic_batching.gpu_workers.models import build, configured

    if _conf_errors():
        return []
    errors = []
    models = configured()
    for name, config in models.items():
        try:
            build(name, config)
        except ImproperlyConfigured as exc:
            errors.append(
                checks.Error(str(exc), hint="docs/models.md lists the specs and their options", id="batching.E011")
            )
    if conf.DEFAULT_MODEL not in models:
        errors.append(
            checks.Error(
                f'BATCHING["DEFAULT_MODEL"] is {conf.DEFAULT_MODEL!r}, which is not a configured model '
                f"({', '.join(sorted(models)) or 'none'})",
                hint='name one of BATCHING["MODELS"], or declare it there',
                id="batching.E012",
            )
        )
    return errors


def redis_address(url: str | None) -> tuple[str, str, int, int] | None:
    """(scheme, host, port, db) of a Redis URL, or of a Celery result backend naming
    one (`redis://...`, `rediss://...`, or `module:Class+redis://...`); None for any
    other kind of URL."""
    if not url:
        return None
    url = url.rpartition("+")[2] if "+" in url.split("://", 1)[0] else url
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        return None
    db = parts.path.strip("/") or parse_qs(parts.query).get("db", ["0"])[0]
    try:
        return (parts.scheme, parts.hostname or "localhost", parts.port or 6379, int(db or 0))
    except ValueError:
        return None


def _app_or_error() -> tuple[Any, list[checks.CheckMessage]]:
    from .protocol.app import get_app

    if not conf.CELERY_APP:
        return None, [
            checks.Error(
                'BATCHING["CELERY_APP"] is not set: batching does not know which Celery app to send through',
                hint='set it to your app\'s dotted path, e.g. BATCHING = {"CELERY_APP": "mysite.celery.app"}',
                id="batching.E022",
            )
        ]
    try:
        return get_app(), []
    except Exception as exc:  # noqa: BLE001 - any import failure is the same miswiring
        return None, [
            checks.Error(
                f'BATCHING["CELERY_APP"] = {conf.CELERY_APP!r} cannot be imported: {type(exc).__name__}: {exc}',
                hint="name the Celery app object by its dotted path, e.g. mysite.celery.app",
                id="batching.E022",
            )
        ]


@checks.register()
def celery_wiring(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from .protocol.app import is_configured

    if _conf_errors():
        return []
    app, errors = _app_or_error()
    if app is None:
        return errors
    if not is_configured(app):
        errors.append(
            checks.Error(
                f"the Celery app {conf.CELERY_APP} was never passed to configure(): batching cannot tell it is "
                "the app you meant",
                hint="in that module, after config_from_object: "
                "from dynamic_batching.protocol.app import configure; configure(app)",
                id="batching.E021",
            )
        )
    ours = redis_address(conf.REDIS_URL)
    for what, setting, url in (
        ("broker", "CELERY_BROKER_URL", app.conf.broker_url),
        ("result backend", "CELERY_RESULT_BACKEND", app.conf.result_backend),
    ):
        if redis_address(url) != ours:
            errors.append(
                checks.Error(
                    f"the Celery {what} ({setting} = {_masked(url)}) is not batching's Redis "
                    f'(BATCHING["REDIS_URL"] = {_masked(conf.REDIS_URL)}): requests would be admitted in one place '
                    "and answered in another, and every .get() would time out",
                    hint=f'point {setting} and BATCHING["REDIS_URL"] at the same Redis server and database',
                    id="batching.E020",
                )
            )
    return errors


def _masked(url: Any) -> str:
    """A URL with any password replaced, for an error message."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", str(url))


@checks.register()
def time_limits(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if _conf_errors():
        return []
    hard, grace, visibility = conf.BATCH_HARD_LIMIT_S, conf.HANG_GRACE_S, conf.VISIBILITY_TIMEOUT_S
    if hard + grace < visibility:
        return []
    return [
        checks.Error(
            f"BATCH_HARD_LIMIT_S ({hard}) plus HANG_GRACE_S ({grace}) is not under VISIBILITY_TIMEOUT_S ({visibility}): "
            "a batch still running when the broker hands it to another device would run twice",
            hint='raise BATCHING["VISIBILITY_TIMEOUT_S"] (BATCHING_VISIBILITY_TIMEOUT_S) or lower the hard limit',
            id="batching.E030",
        )
    ]
