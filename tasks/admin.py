"""The admin: one page for the active batching policy, and its read-only history.

Saving the policy goes through `BatchingPolicy.objects.save_change`, so every save
bumps the version, records the user, and reaches the collector within a second.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .core.policy import PRIORITIES
from .models import BatchingPolicy, ClientQuota, PolicyChange

#: How many recent changes the policy page lists; the rest are in the history.
RECENT_CHANGES = 5


@admin.register(BatchingPolicy)
class BatchingPolicyAdmin(admin.ModelAdmin):
    fieldsets = (
        ("Batches", {"fields": ("max_batch_size", "max_batch_tokens", "max_wait_ms")}),
        ("Fair shares", {"fields": (*(f"weight_{p}" for p in PRIORITIES), "aging_ms")}),
        ("Admission", {"fields": tuple(f"queue_cap_{p}" for p in PRIORITIES)}),
        ("Oversized requests and deadlines", {"fields": ("oversized", "default_deadline_s")}),
        ("Version", {"fields": ("version", "updated_at", "recent_changes")}),
    )
    readonly_fields = ("version", "updated_at", "recent_changes")

    # There is exactly one policy: the list redirects to it, and nobody adds or deletes.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        row = BatchingPolicy.objects.active()
        return HttpResponseRedirect(reverse("admin:tasks_batchingpolicy_change", args=[row.pk]))

    def save_model(self, request: HttpRequest, obj: BatchingPolicy, form: Any, change: bool) -> None:
        record = BatchingPolicy.objects.save_change(obj, user=request.user)
        self.message_user(
            request,
            f"Policy version {record.version} ({record.summary}) reaches the collector within a second; "
            "/healthz shows the version it runs.",
            messages.INFO,
        )

    @admin.display(description="recent changes")
    def recent_changes(self, obj: BatchingPolicy) -> SafeString:
        rows = PolicyChange.objects.select_related("changed_by")[:RECENT_CHANGES]
        items = format_html_join(
            "",
            "<li>v{} at {} by {}: {}</li>",
            (
                (c.version, c.changed_at.strftime("%Y-%m-%d %H:%M:%S"), c.changed_by or "a script", c.summary)
                for c in rows
            ),
        )
        link = reverse("admin:tasks_policychange_changelist")
        return format_html('<ul>{}</ul><a href="{}">All changes</a>', items or "none yet", link)


@admin.register(ClientQuota)
class ClientQuotaAdmin(admin.ModelAdmin):
    """Per-user and per-group quotas. A change reaches every web process within
    ClientQuotaManager.CACHE_S; the dashboard's "Clients" panel shows each client's use."""

    list_display = ("__str__", "user", "group", "rate_per_s", "burst", "max_in_flight", "tier_share")
    list_select_related = ("user", "group")
    search_fields = ("user__username", "group__name")
    fieldsets = (
        ("Who", {"fields": ("user", "group"), "description": "Either one user, or every member of one group."}),
        ("Limits", {"fields": ("rate_per_s", "burst", "max_in_flight", "tier_share")}),
    )


@admin.register(PolicyChange)
class PolicyChangeAdmin(admin.ModelAdmin):
    """Read-only: history is written by saving the policy, never edited."""

    list_display = ("version", "changed_at", "changed_by", "summary")
    list_select_related = ("changed_by",)
    date_hierarchy = "changed_at"
    fields = ("version", "changed_at", "changed_by", "summary", "policy_json")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="policy")
    def policy_json(self, obj: PolicyChange) -> SafeString:
        return format_html("<pre>{}</pre>", json.dumps(obj.policy, indent=2, sort_keys=True))
