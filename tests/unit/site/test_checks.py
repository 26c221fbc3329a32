"""Each miswiring a host project can make has its own system check id, and each error
names the setting and the fix (dynamic_batching/checks.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from dynamic_batching import checks

HOST_APP = """
from celery import Celery

from dynamic_batching.protocol.app import configure

marked = configure(Celery("host", set_as_current=False, broker="{url}", backend="{backend}"))
unmarked = Celery("host", set_as_current=False, broker="{url}", backend="{backend}")
"""


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


@pytest.fixture
def host_apps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batching_settings: Any) -> str:
    """A host module with a configured and an unconfigured app on one Redis URL."""
    url = "redis://10.9.8.7:6380/4"
    (tmp_path / "hostcelery_for_checks.py").write_text(HOST_APP.format(url=url, backend=url))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "hostcelery_for_checks", raising=False)
    batching_settings(REDIS_URL=url, CELERY_APP="hostcelery_for_checks.marked")
    return url


def test_the_repositorys_own_wiring_passes_every_check() -> None:
    from django.core.checks import run_checks

    assert [m for m in run_checks() if m.id.startswith("batching.E")] == []


def test_e003_a_setting_out_of_range(batching_settings: Any) -> None:
    batching_settings(COLLECTOR_WINDOW=0)
    [error] = checks.settings_valid()
    assert error.id == "batching.E003" and "BATCHING_COLLECTOR_WINDOW" in error.msg


def test_e001_a_quota_that_does_not_parse(batching_settings: Any) -> None:
    batching_settings(DEFAULT_QUOTA={"rate": 5})
    assert ids(checks.quotas_valid()) == ["batching.E001"]


def test_e011_a_model_that_does_not_build(batching_settings: Any) -> None:
    batching_settings(MODELS={"minilm": {"spec": "dynamic_batching.gpu_workers.models.nope.Spec"}}, TEST_MODELS=False)
    [error] = checks.models_build()
    assert error.id == "batching.E011" and "BATCHING['MODELS']['minilm']" in error.msg


def test_e012_a_default_model_that_is_not_configured(batching_settings: Any) -> None:
    batching_settings(DEFAULT_MODEL="gpt-99")
    [error] = checks.models_build()
    assert error.id == "batching.E012" and "'gpt-99'" in error.msg and "minilm" in error.msg


def test_e020_broker_and_backend_must_be_batchings_redis(host_apps: str, batching_settings: Any) -> None:
    assert checks.celery_wiring() == []
    batching_settings(REDIS_URL="redis://10.9.8.7:6380/5")  # another database, same server
    errors = checks.celery_wiring()
    assert ids(errors) == ["batching.E020", "batching.E020"]
    assert "CELERY_BROKER_URL" in errors[0].msg and "CELERY_RESULT_BACKEND" in errors[1].msg


def test_e020_compares_server_and_database_not_spelling() -> None:
    same = checks.redis_address("redis://:secret@127.0.0.1:6379/0")
    assert same == checks.redis_address("redis://127.0.0.1")
    assert same == checks.redis_address(
        "dynamic_batching.store.result_backend:RetryingRedisBackend+redis://127.0.0.1/0"
    )
    assert checks.redis_address("redis://127.0.0.1:6379/1") != same
    assert checks.redis_address("amqp://guest@localhost//") is None


def test_e021_the_app_was_never_passed_to_configure(host_apps: str, batching_settings: Any) -> None:
    batching_settings(CELERY_APP="hostcelery_for_checks.unmarked")
    [error] = checks.celery_wiring()
    assert error.id == "batching.E021" and "configure(app)" in error.hint


@pytest.mark.parametrize("path", ["", "no_such_module_here.app"])
def test_e022_no_celery_app_or_one_that_does_not_import(path: str, batching_settings: Any) -> None:
    batching_settings(CELERY_APP=path)
    [error] = checks.celery_wiring()
    assert error.id == "batching.E022" and "CELERY_APP" in error.msg


def test_e030_the_visibility_timeout_must_outlast_a_batch(batching_settings: Any) -> None:
    assert checks.time_limits() == []
    batching_settings(VISIBILITY_TIMEOUT_S=10, BATCH_HARD_LIMIT_S=9, HANG_GRACE_S=2)
    [error] = checks.time_limits()
    assert error.id == "batching.E030" and "VISIBILITY_TIMEOUT_S" in error.hint


@pytest.mark.django_db(transaction=True)
def test_e010_a_database_under_the_old_label_moves_with_every_row(django_user_model: Any) -> None:
    from django.apps import apps
    from django.core.management import call_command

    from dynamic_batching.models import ApiToken, BatchingPolicy
    from dynamic_batching.relabel import pending

    alice = django_user_model.objects.create_user("alice", password="x" * 12)
    _, raw = ApiToken.objects.issue(alice, name="kept")
    BatchingPolicy.objects.active()
    policies = BatchingPolicy.objects.count()
    tables = {m._meta.db_table for m in apps.get_app_config("dynamic_batching").get_models()}
    # As an earlier version left it: our tables, records and content types under `tasks`.
    with connection.schema_editor(atomic=True) as editor:
        for table in sorted(tables):
            editor.alter_db_table(None, table, "tasks" + table.removeprefix("dynamic_batching"))
        editor.execute("UPDATE django_migrations SET app = 'tasks' WHERE app = 'dynamic_batching'")
        editor.execute("UPDATE django_content_type SET app_label = 'tasks' WHERE app_label = 'dynamic_batching'")
    try:
        [error] = checks.old_label(databases=["default"])
        assert error.id == "batching.E010" and "batching_relabel" in error.hint
        call_command("batching_relabel", verbosity=0)
        assert pending() == [] and checks.old_label(databases=["default"]) == []
        assert BatchingPolicy.objects.count() == policies >= 1
        assert ApiToken.objects.user_for(raw) == alice
        with connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM django_migrations WHERE app = 'tasks'")
            assert cursor.fetchone() == (0,)
    finally:
        call_command("batching_relabel", verbosity=0)
