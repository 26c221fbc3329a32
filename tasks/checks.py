"""System checks: what must not be on in production (`manage.py check --deploy`), and
what must hold for the system to work at all (every `manage.py` command, `make run`'s
migrate included)."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.security, deploy=True)
def test_models_off(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if getattr(settings, "BATCHING_TEST_MODELS", False):
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
    if getattr(settings, "BATCHING_OPEN_DEMO", False):
        return [
            checks.Info(
                "BATCHING_OPEN_DEMO is on: visitors who are not logged in may submit, sharing BATCHING_ANONYMOUS_QUOTA",
                id="batching.I001",
            )
        ]
    return []


@checks.register()
def quotas_valid(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from .core.quota import Quota

    errors = []
    for setting, variable in (
        ("DEFAULT_QUOTA", "BATCHING_DEFAULT_QUOTA"),
        ("ANONYMOUS_QUOTA", "BATCHING_ANONYMOUS_QUOTA"),
    ):
        try:
            Quota.from_mapping(dict(getattr(settings, setting)))
        except (TypeError, ValueError) as exc:
            errors.append(
                checks.Error(
                    f"{variable} is not a valid quota: {exc}",
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
