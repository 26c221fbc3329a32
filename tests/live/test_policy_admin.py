"""The batching policy in the admin: it validates through BatchPolicy with the error on
the right field, records who changed what, keeps its migrations in step, and a change
saved in the admin reaches a running collector (real processes) within a second."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest
from conftest import wait_for_collector_policy
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.urls import reverse

from dynamic_batching.core.policy import BatchPolicy
from dynamic_batching.edge.client import details, submit_many
from dynamic_batching.gpu_workers.models import synthetic
from dynamic_batching.models import BatchingPolicy, PolicyChange
from dynamic_batching.store import shared_state

INVALID = [
    ("max_batch_size", 0),
    ("max_batch_tokens", -3),
    ("max_wait_ms", -0.5),
    ("weight_high", 0),
    ("weight_low", -1),
    ("aging_ms", -1.0),
    ("queue_cap_normal", 0),
    ("default_deadline_s", 0.0),
]


def form_data(row: BatchingPolicy, **changes: Any) -> dict[str, Any]:
    data = {**row.policy_values(), **changes}
    return {k: "" if v is None else v for k, v in data.items()} | {"_save": "Save"}


def change_url(row: BatchingPolicy) -> str:
    return reverse("admin:dynamic_batching_batchingpolicy_change", args=[row.pk])


def test_no_migration_is_missing(db: None) -> None:
    out = io.StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit:
        pytest.fail(f"models changed without a migration; run `manage.py makemigrations tasks`:\n{out.getvalue()}")


def test_defaults_are_the_policy_defaults(db: None) -> None:
    assert BatchingPolicy.objects.active().to_policy() == BatchPolicy()


@pytest.mark.parametrize(("field", "value"), INVALID)
def test_clean_puts_the_policy_error_on_its_field(db: None, field: str, value: object) -> None:
    row = BatchingPolicy(**{field: value})
    with pytest.raises(ValidationError) as info:
        row.full_clean()
    errors = info.value.message_dict
    assert list(errors) == [field]
    assert f"got {value}" in errors[field][0]


@pytest.mark.parametrize(("field", "value"), INVALID[:6])
def test_admin_form_rejects_invalid_values(admin_client: Any, field: str, value: object) -> None:
    row = BatchingPolicy.objects.active()
    response = admin_client.post(change_url(row), form_data(row, **{field: value}))
    assert response.status_code == 200, "an invalid policy must re-render the form, not save"
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field]
    row.refresh_from_db()
    assert row.version == 0
    assert not PolicyChange.objects.exists()


def test_admin_save_records_who_and_version(
    admin_client: Any, admin_user: Any, django_capture_on_commit_callbacks: Any
) -> None:
    row = BatchingPolicy.objects.active()
    with django_capture_on_commit_callbacks() as published:
        response = admin_client.post(change_url(row), form_data(row, max_batch_size=4, queue_cap_low=50))
    assert response.status_code == 302, response.content[:2000]
    assert len(published) == 1, "the policy must be published to Redis once, after commit"

    row.refresh_from_db()
    assert (row.version, row.max_batch_size, row.queue_cap_low) == (1, 4, 50)
    change = PolicyChange.objects.get()
    assert change.changed_by == admin_user
    assert change.version == 1
    assert change.changes == {"max_batch_size": [32, 4], "queue_cap_low": [2000, 50]}
    assert BatchPolicy.from_dict(change.policy) == row.to_policy()

    # A second save bumps the version again, and the form shows the history.
    with django_capture_on_commit_callbacks():
        admin_client.post(change_url(row), form_data(row, oversized="truncate"))
    assert list(PolicyChange.objects.values_list("version", flat=True)) == [2, 1]
    page = admin_client.get(change_url(row)).content.decode()
    assert "oversized reject \u2192 truncate" in page
    assert "max_batch_size 32 \u2192 4" in page


def test_admin_has_one_policy_and_read_only_history(admin_client: Any) -> None:
    listing = admin_client.get(reverse("admin:dynamic_batching_batchingpolicy_changelist"))
    row = BatchingPolicy.objects.get()
    assert listing.status_code == 302 and listing.url == change_url(row)
    assert admin_client.get(reverse("admin:dynamic_batching_batchingpolicy_add")).status_code == 403
    assert admin_client.get(reverse("admin:dynamic_batching_batchingpolicy_delete", args=[row.pk])).status_code == 403

    row.max_wait_ms = 5.0
    change = BatchingPolicy.objects.save_change(row)
    assert change.changed_by is None
    assert admin_client.get(reverse("admin:dynamic_batching_policychange_changelist")).status_code == 200
    detail = admin_client.get(reverse("admin:dynamic_batching_policychange_change", args=[change.pk]))
    assert detail.status_code == 200 and b"max_wait_ms" in detail.content
    assert admin_client.post(reverse("admin:dynamic_batching_policychange_delete", args=[change.pk])).status_code == 403


def test_manager_refuses_invalid_policy_and_saves_nothing(db: None) -> None:
    row = BatchingPolicy.objects.active()
    row.weight_normal = 0
    with pytest.raises(ValidationError) as info:
        BatchingPolicy.objects.save_change(row)
    assert "weight_normal" in info.value.message_dict
    assert BatchingPolicy.objects.get().weight_normal == 3
    assert not PolicyChange.objects.exists()


# --- against the running system ----------------------------------------------------------


@pytest.mark.live
@pytest.mark.django_db(transaction=True)
def test_sync_policy_publishes_the_active_row(live_system: object, restore_policy: None) -> None:
    out = io.StringIO()
    call_command("sync_policy", stdout=out)
    assert BatchingPolicy.objects.get().version == 0
    assert shared_state.read_policy() == BatchPolicy()
    assert "version 0" in out.getvalue()


@pytest.mark.live
@pytest.mark.django_db(transaction=True)
def test_admin_change_reaches_the_running_collector(
    live_system: object, restore_policy: None, admin_client: Any
) -> None:
    row = BatchingPolicy.objects.active()
    assert (shared_state.read_collector() or {}).get("policy_version") == 0, "another test left its policy behind"

    response = admin_client.post(change_url(row), form_data(row, max_batch_size=2))
    # The admin's transaction has committed (and published) by the time it answers.
    committed = time.monotonic()
    assert response.status_code == 302
    applied = wait_for_collector_policy(1, timeout=5.0)
    lag = applied - committed
    # How fast is a measurement, printed (about 0.25 s: one housekeeping turn), not a
    # pass/fail bound that a loaded machine would break; that it arrives is the test.
    print(f"\ncollector applied policy v1 {lag * 1000:.0f} ms after the admin's commit")

    health = admin_client.get(reverse("batching-healthz")).json()
    assert health["policy"] == {"active_version": 1, "published_version": 1, "collector_version": 1, "in_sync": True}

    texts = [f"policy check {i} " + "word " * (i % 5) for i in range(20)]
    results = submit_many(texts, model="synthetic")
    assert [r.get(timeout=30) for r in results] == [synthetic.embed(t) for t in texts]
    sizes = [details(r)["batch_size"] for r in results]
    print(f"batch sizes under max_batch_size=2: {sorted(sizes)}")
    assert max(sizes) <= 2
