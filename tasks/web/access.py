"""Who may submit, who may read what, and what each may spend: every owner rule of the
web in one place. docs/security.md has the table of every URL and its rule, and
tests/live/test_authorization.py walks it.

- A logged-in user (by session or API token) owns what they submit: "user:<pk>". Only
  they and staff read it. Their quota is theirs (ClientQuota in the admin, else
  DEFAULT_QUOTA).
- Visitors who are not logged in may submit only when BATCHING_OPEN_DEMO is on. Each
  client address spends a quota of its own (ANONYMOUS_QUOTA), as owner "anon:<a hash
  of the address>", so one visitor cannot use up the demo for everyone; each reads
  only the requests its own browser session submitted.
- A request nobody may read is answered 404, exactly like an id that never existed, so
  nobody learns which ids are real.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import redis
from django.conf import settings
from django.http import HttpRequest
from django.shortcuts import resolve_url

from dynamic_batching import metrics
from dynamic_batching.conf import conf
from dynamic_batching.core.errors import BurstExceeded, QuotaExceeded
from dynamic_batching.core.quota import Quota, RefusalMemory
from dynamic_batching.edge.client import submit_many
from dynamic_batching.protocol.names import rate_key, stats_rate_key
from dynamic_batching.store import owners, request_queues, shared_state

#: How the owner of every anonymous demo request begins; the rest is its address's hash.
ANONYMOUS = "anon:"
#: Most request ids an anonymous session remembers as its own.
SESSION_IDS_KEPT = 200
_SESSION_KEY = "batching_request_ids"


def owner_name(user: Any) -> str:
    return f"user:{user.pk}"


def client_address(request: HttpRequest) -> str:
    """The caller's address: the front door's `X-Forwarded-For` (Caddy sets it and
    ignores one a client sent) when the request came through it, else REMOTE_ADDR."""
    return address_of(request.META.get("HTTP_X_FORWARDED_FOR", ""), str(request.META.get("REMOTE_ADDR", "")))


def address_of(forwarded_for: str, remote_addr: str) -> str:
    """client_address from the two values it reads, for a caller that has no Django
    request yet (batching_site/logins.py's gate on the event loop)."""
    if forwarded_for:
        return forwarded_for.split(",")[-1].strip()
    return remote_addr


def anonymous_owner(request: HttpRequest) -> str:
    """A demo visitor's owner: per client address, hashed, so no address is stored."""
    return ANONYMOUS + hashlib.sha256(client_address(request).encode()).hexdigest()[:16]


def may_submit(user: Any) -> bool:
    return bool(user and user.is_authenticated and user.is_active) or conf.OPEN_DEMO


def spender(request: HttpRequest, user: Any) -> tuple[str, Quota]:
    """(owner, quota) for a caller who may submit."""
    if user and user.is_authenticated:
        from dynamic_batching.models import ClientQuota

        return owner_name(user), ClientQuota.objects.quota_for(user)
    return anonymous_owner(request), Quota.from_mapping(conf.ANONYMOUS_QUOTA)


def remember(request: HttpRequest, user: Any, task_ids: Sequence[str]) -> None:
    """An anonymous session's requests, so it (and only it) can read them back."""
    if user and user.is_authenticated:
        return
    kept = list(request.session.get(_SESSION_KEY, []))
    kept.extend(task_ids)
    request.session[_SESSION_KEY] = kept[-SESSION_IDS_KEPT:]


def readable(request: HttpRequest, user: Any, task_ids: Iterable[str]) -> set[str]:
    """The ids among these that `user` (from this request's session) may read."""
    ids = list(task_ids)
    if not ids:
        return set()
    if is_staff(user):
        return set(ids)
    if user and user.is_authenticated and user.is_active:
        me = owner_name(user)
        return {t for t, o in owners.owners_of(shared_state.client(), ids).items() if o == me}
    if not conf.OPEN_DEMO:
        return set()
    mine = set(request.session.get(_SESSION_KEY, []))
    candidates = [t for t in ids if t in mine]
    return {t for t, o in owners.owners_of(shared_state.client(), candidates).items() if o and o.startswith(ANONYMOUS)}


def bearer_token(request: HttpRequest) -> str | None:
    """The raw token of an `Authorization: Bearer ...` header, or None."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


#: Callers just refused by their quota's rate or in-flight limit, and until when
#: (tasks/core/quota.py), by API token (checked before the token is even looked up,
#: tasks/web/api.py) and by owner (checked before any input is read): within that
#: window the same call would be refused again, so it is refused from memory.
refusals = RefusalMemory()
#: Limits whose refusals are remembered: waiting is what lifts them.
REMEMBERED = ("rate", "in_flight")

#: How often one caller may read the dashboard's numbers (GET /api/v1/stats, the
#: dashboard's poll): each read gathers every metric, so it is rate-limited per owner.
STATS_QUOTA = Quota(rate_per_s=2.0, burst=10)


def may_read(request: HttpRequest, user: Any, task_id: str) -> bool:
    return task_id in readable(request, user, [task_id])


def is_staff(user: Any) -> bool:
    return bool(user and user.is_authenticated and user.is_active and user.is_staff)


def submit_inputs(
    request: HttpRequest,
    user: Any,
    inputs: Sequence[object],
    *,
    priority: object = "normal",
    model: str | None = None,
    deadline_s: float | None = None,
) -> list[str]:
    """The one submit path of the web: the form and the API both come here. Returns the
    new ids in order, or raises what tasks/web/errors.py maps to HTTP."""
    if not may_submit(user):
        raise NotLoggedIn(f"log in to submit: {resolve_url(settings.LOGIN_URL)} (or send an API token)")
    owner, quota = spender(request, user)
    recall_refusal(request, user)
    try:
        results = submit_many(
            inputs,  # type: ignore[arg-type]
            priority=priority,  # type: ignore[arg-type]
            model=model,
            deadline_s=deadline_s,
            owner=owner,
            quota=quota,
            reply=False,  # read later by id (GET /api/v1/requests/<id>): nobody waits here
        )
    except BurstExceeded:
        raise  # refused before any input was read: nothing to charge
    except (ValueError, TypeError):
        charge_refused(owner, quota, len(inputs), str(priority))
        raise
    except QuotaExceeded as exc:
        if exc.limit in REMEMBERED:
            refusals.remember(owner, exc.retry_after, exc)
        raise
    ids = [r.id for r in results]
    remember(request, user, ids)
    return ids


def recall_refusal(request: HttpRequest, user: Any) -> None:
    """Raise the QuotaExceeded this caller got a moment ago, while it still holds: before
    its body is read (the API checks at authentication) or its inputs parsed."""
    owner = owner_name(user) if user and user.is_authenticated else anonymous_owner(request)
    hit = refusals.recall(owner)
    if hit is not None:
        refused, left = hit
        raise QuotaExceeded(owner, refused.limit, refused.tier, left)


def charge_refused(owner: str, quota: Quota, n: int, tier: str) -> None:
    """Inputs refused as invalid after they were read, parsed and tokenized cost their
    caller's rate as accepted ones do (issue 42, finding 3: refused work was free), and
    are counted. A caller whose bucket this empties is refused from memory until it
    refills."""
    try:
        wait = request_queues.charge(shared_state.client(), rate_key(owner), quota, n, take=False)
    except redis.RedisError:
        return  # the caller gets its 422 all the same
    metrics.record_invalid(n, owner=owner)
    if wait > 0:
        refusals.remember(owner, wait, QuotaExceeded(owner, "rate", tier, wait))


def charge_stats_read(user: Any) -> None:
    """Raise QuotaExceeded (429) when `user` reads the dashboard's numbers faster than
    STATS_QUOTA allows."""
    owner = owner_name(user) if user and user.is_authenticated else ANONYMOUS
    wait = request_queues.charge(shared_state.client(), stats_rate_key(owner), STATS_QUOTA, 1, take=True)
    if wait > 0:
        raise QuotaExceeded(owner, "stats", "", wait)


class NotLoggedIn(Exception):
    """Submitting needs a login here (BATCHING_OPEN_DEMO is off)."""
