"""The batching policy an operator edits in the admin, and the history of its changes.

One row is the active policy: its `singleton` column is unique and can only be True.
It validates through `dynamic_batching.core.policy.BatchPolicy`, the object the collector and the
edge build from Redis, so the admin can never save a policy that they would refuse.

Save changes with `BatchingPolicy.objects.save_change(row, user=...)`: it bumps the
version, records who changed what in `PolicyChange`, and publishes the policy to Redis
once the transaction commits. A plain `row.save()` does none of that.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import models, transaction
from django.utils import timezone

from dynamic_batching.conf import conf

from .core.policy import OVERSIZED_ACTIONS, PRIORITIES, BatchPolicy
from .core.quota import Quota
from .store import shared_state

log = logging.getLogger(__name__)

_DEFAULT = BatchPolicy()

OVERSIZED_CHOICES = [
    ("reject", "reject: submit raises RequestTooLarge"),
    ("truncate", "truncate: cut to the limit, run, and mark the result truncated"),
    ("run_alone", "run_alone: run it in a batch of its own"),
]
assert [c for c, _ in OVERSIZED_CHOICES] == list(OVERSIZED_ACTIONS), "oversized choices out of step with BatchPolicy"

#: The model fields that make up a policy, in form order (version is kept apart).
POLICY_FIELDS: tuple[str, ...] = (
    "max_batch_size",
    "max_batch_tokens",
    "max_wait_ms",
    *(f"weight_{p}" for p in PRIORITIES),
    "aging_ms",
    *(f"queue_cap_{p}" for p in PRIORITIES),
    "oversized",
    "default_deadline_s",
    "slow_lane",
    "slow_lane_share",
    "per_model",
)

# BatchPolicy's errors start with the name of its field: "weights[low] must be ...".
_ERROR_FIELD = re.compile(r"^(\w+)(?:\[(\w+)\])?")
_TIER_PREFIX = {"weights": "weight_", "queue_caps": "queue_cap_"}


def _error_field(message: str) -> str:
    """The model field a BatchPolicy ValueError is about, or NON_FIELD_ERRORS."""
    match = _ERROR_FIELD.match(message)
    if match is None:
        return NON_FIELD_ERRORS
    name, tier = match.groups()
    if name in _TIER_PREFIX:
        name = _TIER_PREFIX[name] + tier if tier in PRIORITIES else NON_FIELD_ERRORS
    return name if name in POLICY_FIELDS else NON_FIELD_ERRORS


def _tier_field(kind: str, priority: str) -> models.IntegerField:
    if kind == "weight":
        return models.IntegerField(
            f"{priority} weight",
            default=_DEFAULT.weights[priority],
            help_text=(
                f"Share of tokens the {priority} tier is guaranteed while it is backlogged: this weight over "
                "the sum of the three weights. An integer >= 1."
            ),
        )
    return models.IntegerField(
        f"{priority} queue cap",
        default=_DEFAULT.queue_caps[priority],
        help_text=(
            f"Most {priority} requests waiting (in the broker and the collector together). Past it, submit "
            "raises Overloaded and the web form answers 429 with Retry-After. An integer >= 1."
        ),
    )


class BatchingPolicyManager(models.Manager["BatchingPolicy"]):
    def active(self) -> BatchingPolicy:
        """The active policy row, created with the defaults if there is none yet."""
        row, _ = self.get_or_create(singleton=True)
        return row

    def save_change(self, row: BatchingPolicy, *, user: Any = None) -> PolicyChange:
        """Validate and save `row` as the active policy with the next version, record the
        change and who made it, and publish the policy to Redis after commit.

        Raises ValidationError (naming the field) and saves nothing if `row` is invalid.
        """
        with transaction.atomic(using=self.db):
            # Locked, so two saves at once get two versions and each diff is against
            # what was really there (a no-op on SQLite, which serialises writers anyway).
            current = self.select_for_update().filter(singleton=True).first()
            before = current.policy_values() if current is not None else BatchingPolicy().policy_values()
            row.singleton = True
            if current is not None:
                row.pk = current.pk
            row.version = (current.version if current is not None else 0) + 1
            row.full_clean(validate_unique=False)
            policy = row.to_policy()
            row.save()
            after = row.policy_values()
            changes = {k: [before[k], after[k]] for k in POLICY_FIELDS if before[k] != after[k]}
            change = PolicyChange.objects.using(self.db).create(
                version=row.version,
                changed_by=user if user is not None and user.is_authenticated else None,
                policy=policy.to_dict(),
                changes=changes,
                summary=PolicyChange.summarize(changes),
            )
            # Only a committed policy may reach the collector: a rolled-back save must
            # not be running anywhere.
            transaction.on_commit(lambda: _publish(policy), using=self.db)
        return change


def _publish(policy: BatchPolicy) -> None:
    try:
        shared_state.publish_policy(policy)
    except Exception:
        # The change is committed; failing the admin request now would only hide that.
        # /healthz shows the published version lagging, and sync_policy republishes.
        log.exception("batching policy version %d saved but not published; run `manage.py sync_policy`", policy.version)


class BatchingPolicy(models.Model):
    singleton = models.BooleanField(
        "singleton",
        default=True,
        unique=True,
        editable=False,
        help_text="Always true and unique, so the database holds at most one active policy.",
    )
    max_batch_size = models.IntegerField(
        "max batch size",
        default=_DEFAULT.max_batch_size,
        help_text="Most requests in one batch. An integer >= 1.",
    )
    max_batch_tokens = models.IntegerField(
        "max padded tokens per batch",
        default=_DEFAULT.max_batch_tokens,
        help_text=(
            "Most padded tokens in one batch: batch size x its longest request, which is what the device "
            "computes. A request that alone exceeds it is oversized. An integer >= 1."
        ),
    )
    max_wait_ms = models.FloatField(
        "max wait (ms)",
        default=_DEFAULT.max_wait_ms,
        help_text=(
            "How long the oldest request may wait for batch-mates while a device is free. 0 dispatches at "
            "once to a free device and batches only while all devices are busy."
        ),
    )
    weight_high = _tier_field("weight", "high")
    weight_normal = _tier_field("weight", "normal")
    weight_low = _tier_field("weight", "low")
    aging_ms = models.FloatField(
        "aging bound (ms)",
        default=_DEFAULT.aging_ms,
        help_text="A request that has waited this long is served before fresher requests of any tier. >= 1.",
    )
    queue_cap_high = _tier_field("cap", "high")
    queue_cap_normal = _tier_field("cap", "normal")
    queue_cap_low = _tier_field("cap", "low")
    oversized = models.CharField(
        "oversized requests",
        max_length=16,
        choices=OVERSIZED_CHOICES,
        default=_DEFAULT.oversized,
        help_text="What happens to a request longer than the model's limit or the padded-token budget.",
    )
    default_deadline_s = models.FloatField(
        "default deadline (s)",
        null=True,
        blank=True,
        default=_DEFAULT.default_deadline_s,
        help_text=(
            "Deadline for requests that set none: one not dispatched by then fails with DeadlineExceeded "
            "and never runs. Empty means no deadline: a caller waiting without a timeout may then wait as long "
            "as the backlog lasts."
        ),
    )
    slow_lane = models.CharField(
        "slow lane",
        max_length=8,
        choices=[
            ("share", "share: slow inputs also run while others wait, up to their share of device time"),
            ("idle", "idle: slow inputs run only while nobody else waits"),
        ],  # the same names as dynamic_batching.core.policy.SLOW_LANE_POLICIES (checked in tests)
        default=_DEFAULT.slow_lane,
        help_text=(
            "When inputs known to be slow may take a device. 'share' always moves them, and normal traffic "
            "gives up at most the share below; 'idle' never queues normal traffic behind them, but under "
            "sustained load they wait until their deadline."
        ),
    )
    slow_lane_share = models.FloatField(
        "slow lane's share",
        default=_DEFAULT.slow_lane_share,
        help_text="Under 'share': the most device time the slow lane takes over a minute while others wait, in (0, 1].",
    )
    per_model = models.JSONField(
        "per-model batch limits",
        default=dict,
        blank=True,
        help_text=(
            "A model's own batch limits over the ones above, by model name: "
            '{"minilm": {"max_batch_size": 64, "max_batch_tokens": 16384, "max_wait_ms": 2}}. '
            "Each of max_batch_size, max_batch_tokens and max_wait_ms is optional. A batch never mixes models."
        ),
    )
    version = models.PositiveIntegerField(
        "version",
        default=_DEFAULT.version,
        editable=False,
        help_text="Bumped on every saved change; /healthz shows whether the collector runs this version.",
    )
    updated_at = models.DateTimeField("updated at", auto_now=True, help_text="When this policy was last saved.")

    objects = BatchingPolicyManager()

    class Meta:
        verbose_name = "batching policy"
        verbose_name_plural = "batching policy"
        constraints = [
            models.CheckConstraint(condition=models.Q(singleton=True), name="tasks_batchingpolicy_singleton"),
        ]

    def __str__(self) -> str:
        return f"batching policy v{self.version}"

    def policy_values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in POLICY_FIELDS}

    def to_policy(self) -> BatchPolicy:
        """The BatchPolicy this row stands for; raises ValueError naming the bad field."""
        return BatchPolicy(
            max_batch_size=self.max_batch_size,
            max_batch_tokens=self.max_batch_tokens,
            max_wait_ms=self.max_wait_ms,
            weights={p: getattr(self, f"weight_{p}") for p in PRIORITIES},
            aging_ms=self.aging_ms,
            queue_caps={p: getattr(self, f"queue_cap_{p}") for p in PRIORITIES},
            oversized=self.oversized,
            default_deadline_s=self.default_deadline_s,
            slow_lane=self.slow_lane,
            slow_lane_share=self.slow_lane_share,
            per_model=self.per_model or {},
            version=self.version,
        )

    def set_policy(self, policy: BatchPolicy) -> None:
        """Copy every knob of `policy` onto this row (not its version: saving sets that)."""
        for name in (
            "max_batch_size",
            "max_batch_tokens",
            "max_wait_ms",
            "aging_ms",
            "oversized",
            "slow_lane",
            "slow_lane_share",
        ):
            setattr(self, name, getattr(policy, name))
        self.default_deadline_s = policy.default_deadline_s
        self.per_model = policy.per_model
        for p in PRIORITIES:
            setattr(self, f"weight_{p}", policy.weights[p])
            setattr(self, f"queue_cap_{p}", policy.queue_caps[p])

    def clean(self) -> None:
        try:
            self.to_policy()
        except ValueError as exc:
            raise ValidationError({_error_field(str(exc)): str(exc)}) from exc
        from dynamic_batching.gpu_workers.models import model_names

        unknown = sorted(set(self.per_model or {}) - set(model_names()))
        if unknown:
            raise ValidationError(
                {"per_model": f"no model named {', '.join(unknown)}; the models are: {', '.join(model_names())}"}
            )


class PolicyChange(models.Model):
    version = models.PositiveIntegerField("version", help_text="The policy version this change produced.")
    changed_at = models.DateTimeField("changed at", default=timezone.now, help_text="When the change was committed.")
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name="changed by",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Who saved it; empty for changes made by scripts and management commands.",
    )
    policy = models.JSONField("policy", help_text="The whole policy after the change, as published to the collector.")
    changes = models.JSONField(
        "changes",
        default=dict,
        blank=True,
        help_text='What changed: {"field": [before, after]} for each field that differs.',
    )
    summary = models.TextField("summary", blank=True, help_text="The changes in one line, for the history list.")

    class Meta:
        verbose_name = "policy change"
        verbose_name_plural = "policy history"
        ordering = ["-changed_at", "-id"]
        indexes = [
            models.Index(fields=["-changed_at"], name="tasks_polchg_changed_at_idx"),
            models.Index(fields=["version"], name="tasks_polchg_version_idx"),
        ]

    def __str__(self) -> str:
        return f"policy v{self.version}: {self.summary}"

    @staticmethod
    def summarize(changes: dict[str, list[Any]]) -> str:
        if not changes:
            return "saved without changes"
        return ", ".join(f"{name} {before} \u2192 {after}" for name, (before, after) in changes.items())


# --- API tokens ------------------------------------------------------------------------


class ClientQuotaManager(models.Manager["ClientQuota"]):
    #: Seconds a web process keeps a user's quota before reading it again: an admin
    #: change reaches every process within this, and a flood costs no query per call.
    CACHE_S = 5.0

    def __init__(self) -> None:
        super().__init__()
        self._cache: dict[tuple[Any, Any], tuple[float, Quota]] = {}

    def quota_for(self, user: Any, *, now: float | None = None) -> Quota:
        """The user's own row, else the most generous row among their groups, else
        conf.DEFAULT_QUOTA."""
        now = time.monotonic() if now is None else now
        # With date_joined, a test database's reused primary key is another user.
        key = (user.pk, getattr(user, "date_joined", None))
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.CACHE_S:
            return hit[1]
        rows = list(self.filter(models.Q(user=user) | models.Q(group__in=user.groups.all())))
        own = [r for r in rows if r.user_id == user.pk]
        if own:
            quota = own[0].to_quota()
        elif rows:
            quota = max((r.to_quota() for r in rows), key=lambda q: (q.max_in_flight, q.rate_per_s))
        else:
            quota = Quota.from_mapping(conf.DEFAULT_QUOTA)
        self._cache[key] = (now, quota)
        return quota

    def forget(self) -> None:
        """Read every quota afresh (after a save in this process)."""
        self._cache.clear()


_QUOTA = Quota()


class ClientQuota(models.Model):
    """What one user, or each member of a group, may spend (tasks/core/quota.py). A
    user's own row wins over their groups'; with neither, BATCHING_DEFAULT_QUOTA."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        verbose_name="user",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="batching_quota",
        help_text="This user's quota (set this or a group, not both).",
    )
    group = models.OneToOneField(
        "auth.Group",
        verbose_name="group",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="batching_quota",
        help_text="Each member's quota, unless the member has one of their own.",
    )
    rate_per_s = models.FloatField(
        "rate (requests/s)", default=_QUOTA.rate_per_s, help_text="Sustained requests a second. Past it: 429."
    )
    burst = models.PositiveIntegerField(
        "burst", default=_QUOTA.burst, help_text="Requests accepted at once after a quiet spell."
    )
    max_in_flight = models.PositiveIntegerField(
        "most in flight",
        default=_QUOTA.max_in_flight,
        help_text="Most requests accepted and not yet answered, all tiers together. Past it: 429.",
    )
    tier_share = models.FloatField(
        "share of a tier",
        default=_QUOTA.tier_share,
        help_text="Most of one tier's queue cap this client may hold, a fraction in (0, 1], so others still get in.",
    )

    max_priority = models.CharField(
        "highest priority",
        max_length=8,
        choices=[(p, p) for p in PRIORITIES],
        default=_QUOTA.max_priority,
        help_text="The most urgent tier this client may ask for. Above it: 403.",
    )

    objects = ClientQuotaManager()

    class Meta:
        verbose_name = "client quota"
        verbose_name_plural = "client quotas"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(user__isnull=False, group__isnull=True)
                | models.Q(user__isnull=True, group__isnull=False),
                name="tasks_clientquota_user_xor_group",
            )
        ]

    def __str__(self) -> str:
        who = f"user {self.user}" if self.user_id else f"group {self.group}"
        return f"{who}: {self.rate_per_s:g}/s, burst {self.burst}, {self.max_in_flight} in flight"

    def save(self, *args: Any, **kwargs: Any) -> None:
        super().save(*args, **kwargs)
        ClientQuota.objects.forget()

    def to_quota(self) -> Quota:
        return Quota(
            rate_per_s=self.rate_per_s,
            burst=self.burst,
            max_in_flight=self.max_in_flight,
            tier_share=self.tier_share,
            max_priority=self.max_priority,
        )

    def clean(self) -> None:
        if bool(self.user_id) == bool(self.group_id):
            raise ValidationError("set either a user or a group")
        try:
            self.to_quota()
        except ValueError as exc:
            field = str(exc).split(" ", 1)[0]
            raise ValidationError(
                {field if field in {f.name for f in self._meta.fields} else NON_FIELD_ERRORS: str(exc)}
            ) from None


#: Every token starts with this, so a leaked one is easy to recognise (and to grep for).
API_TOKEN_PREFIX = "bt_"

#: A token's last_used_at is written at most this often: a script calling in a loop
#: costs one UPDATE a minute, not one per request.
API_TOKEN_TOUCH_EVERY = timedelta(minutes=1)

#: What `ApiToken.state` can be, in the order the admin filter lists them.
API_TOKEN_STATES = ("active", "expired", "revoked")


def hash_api_token(raw: str) -> str:
    """SHA-256 of the token. Enough for 256 random bits: there is nothing to brute-force,
    so a slow password hash would only cost time on every API call."""
    import hashlib

    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def active(self, now: datetime | None = None) -> ApiTokenQuerySet:
        """Tokens that work: not revoked, and not expired at `now`."""
        now = now or timezone.now()
        return self.filter(revoked_at__isnull=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        )

    def expired(self, now: datetime | None = None) -> ApiTokenQuerySet:
        """Tokens past their expiry that nobody revoked (revoked wins, as in `state`)."""
        return self.filter(revoked_at__isnull=True, expires_at__lte=now or timezone.now())

    def revoked(self) -> ApiTokenQuerySet:
        return self.filter(revoked_at__isnull=False)

    def revoke(self, now: datetime | None = None) -> int:
        """Revoke every token here that is not revoked yet; how many that was. A token
        revoked before keeps its first revoked_at, so revoking twice changes nothing."""
        return self.filter(revoked_at__isnull=True).update(revoked_at=now or timezone.now())


class ApiTokenManager(models.Manager.from_queryset(ApiTokenQuerySet)):  # type: ignore[misc]
    def issue(
        self, user: Any, *, name: str = "", expires_in: timedelta | None = None, now: datetime | None = None
    ) -> tuple[ApiToken, str]:
        """A new token for `user`: the row, and the raw token, which is shown once and
        never stored. It stops working `expires_in` after `now`; None: never."""
        import secrets

        if expires_in is not None and expires_in <= timedelta(0):
            raise ValueError(f"expires_in must be positive or None, got {expires_in!r}")
        now = now or timezone.now()
        raw = API_TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = self.create(
            user=user,
            name=name,
            prefix=raw[: len(API_TOKEN_PREFIX) + 6],
            key_hash=hash_api_token(raw),
            created_at=now,
            expires_at=None if expires_in is None else now + expires_in,
        )
        return token, raw

    def user_for(self, raw: str | None, *, now: datetime | None = None) -> Any:
        """The active user a working raw token belongs to, or None (unknown, revoked or
        expired token, inactive user). One indexed read, and at most one write a minute
        per token, to record when it was last used."""
        if not raw or not raw.startswith(API_TOKEN_PREFIX) or len(raw) > 128:
            return None
        now = now or timezone.now()
        token = self.select_related("user").active(now).filter(key_hash=hash_api_token(raw)).first()
        if token is None or not token.user.is_active:
            return None
        cutoff = now - API_TOKEN_TOUCH_EVERY
        if token.last_used_at is None or token.last_used_at < cutoff:
            # Conditional, so that of the web processes that all read a stale
            # last_used_at in the same instant, one writes and the rest match no row.
            self.filter(pk=token.pk).filter(
                models.Q(last_used_at__isnull=True) | models.Q(last_used_at__lt=cutoff)
            ).update(last_used_at=now)
        return token.user


class ApiToken(models.Model):
    """A bearer token for scripts calling /api/v1/ (`Authorization: Bearer bt_...`).
    Create one with `manage.py create_api_token USERNAME`; only its hash is stored.
    List and revoke them with `manage.py api_tokens`, or in the admin."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name="user",
        on_delete=models.CASCADE,
        related_name="api_tokens",
        help_text="Requests made with this token act as this user.",
    )
    name = models.CharField("name", max_length=100, blank=True, help_text="What the token is for, e.g. 'load test'.")
    prefix = models.CharField(
        "prefix", max_length=16, editable=False, help_text="The token's first characters, to tell tokens apart."
    )
    key_hash = models.CharField(
        "key hash", max_length=64, unique=True, editable=False, help_text="SHA-256 of the token, hex."
    )
    created_at = models.DateTimeField("created at", default=timezone.now, help_text="When the token was issued.")
    expires_at = models.DateTimeField(
        "expires at",
        null=True,
        blank=True,
        help_text="The token stops working at this time. Empty: it never expires.",
    )
    last_used_at = models.DateTimeField(
        "last used at",
        null=True,
        blank=True,
        help_text="When a request last came with this token, to within a minute. Empty: never used.",
    )
    revoked_at = models.DateTimeField(
        "revoked at", null=True, blank=True, help_text="Set to revoke the token; it stops working at once."
    )

    objects = ApiTokenManager()

    class Meta:
        verbose_name = "API token"
        verbose_name_plural = "API tokens"
        indexes = [models.Index(fields=["user", "created_at"], name="tasks_apitoken_user_idx")]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'}) for {self.user}"

    def state_at(self, now: datetime) -> str:
        """The token's state at `now`: one of API_TOKEN_STATES; revoked wins over expired."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"

    @property
    def state(self) -> str:
        return self.state_at(timezone.now())

    def revoke(self, now: datetime | None = None) -> bool:
        """Stop the token working. True if this call revoked it, False if it already was
        (its revoked_at then stays as it was)."""
        revoked = ApiToken.objects.filter(pk=self.pk).revoke(now) == 1
        self.revoked_at = ApiToken.objects.values_list("revoked_at", flat=True).get(pk=self.pk)
        return revoked
