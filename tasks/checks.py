"""System checks for `manage.py check --deploy`: what must not be on in production."""

from __future__ import annotations

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
