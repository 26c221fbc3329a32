"""The admin: one page for the active batching policy, and its read-only history.

Saving the policy goes through `BatchingPolicy.objects.save_change`, so every save
bumps the version, records the user, and reaches the collector within a second.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .core.policy import PRIORITIES
from .models import API_TOKEN_STATES, ApiToken, BatchingPolicy, ClientQuota, PolicyChange

#: How many recent changes the policy page lists; the rest are in the history.
RECENT_CHANGES = 5


@admin.register(BatchingPolicy)
class BatchingPolicyAdmin(admin.ModelAdmin):
    fieldsets = (
        ("Batches", {"fields": ("max_batch_size", "max_batch_tokens", "max_wait_ms")}),
        ("Fair shares", {"fields": (*(f"weight_{p}" for p in PRIORITIES), "aging_ms")}),
        ("Admission", {"fields": tuple(f"queue_cap_{p}" for p in PRIORITIES)}),
        ("Oversized requests and deadlines", {"fields": ("oversized", "default_deadline_s")}),
        ("Slow lane", {"fields": ("slow_lane", "slow_lane_share")}),
        ("Per model", {"fields": ("per_model",)}),
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
        return HttpResponseRedirect(reverse("admin:dynamic_batching_batchingpolicy_change", args=[row.pk]))

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
        link = reverse("admin:dynamic_batching_policychange_changelist")
        return format_html('<ul>{}</ul><a href="{}">All changes</a>', items or "none yet", link)


@admin.register(ClientQuota)
class ClientQuotaAdmin(admin.ModelAdmin):
    """Per-user and per-group quotas. A change reaches every web process within
    ClientQuotaManager.CACHE_S; the dashboard's "Clients" panel shows each client's use."""

    list_display = ("__str__", "user", "group", "rate_per_s", "burst", "max_in_flight", "tier_share", "max_priority")
    list_select_related = ("user", "group")
    search_fields = ("user__username", "group__name")
    fieldsets = (
        ("Who", {"fields": ("user", "group"), "description": "Either one user, or every member of one group."}),
        ("Limits", {"fields": ("rate_per_s", "burst", "max_in_flight", "tier_share", "max_priority")}),
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


class ApiTokenStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(state, state) for state in API_TOKEN_STATES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> QuerySet[ApiToken]:
        value = self.value()
        if value in API_TOKEN_STATES:
            return getattr(queryset, value)()
        return queryset


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are issued with `manage.py create_api_token USERNAME`, which shows the raw
    token once, so there is no "add" here. Rename a token, change its expiry, or revoke
    it; `manage.py api_tokens` does the same from a shell."""

    list_display = ("prefix", "user", "name", "created_at", "last_used_at", "expires_at", "state")
    list_filter = (ApiTokenStateFilter, "last_used_at", "expires_at")
    list_select_related = ("user",)
    search_fields = ("prefix", "user__username", "name")
    date_hierarchy = "created_at"
    # key_hash is left out: nobody needs to read it, and a credential's hash has no place on a screen.
    fields = ("prefix", "user", "name", "state", "created_at", "last_used_at", "expires_at", "revoked_at")
    readonly_fields = ("prefix", "user", "state", "created_at", "last_used_at", "revoked_at")
    actions = ("revoke_tokens",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # The class docstring, where operators look: the changelist has no add button.
        help_text = " ".join((self.__doc__ or "").split())
        return super().changelist_view(request, {"subtitle": help_text, **(extra_context or {})})

    @admin.display(description="state")
    def state(self, obj: ApiToken) -> str:
        return obj.state

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        selected = queryset.count()
        revoked = queryset.revoke()
        already = f"; {selected - revoked} were revoked already" if selected > revoked else ""
        self.message_user(request, f"Revoked {revoked} token{'s' if revoked != 1 else ''}{already}.", messages.SUCCESS)
