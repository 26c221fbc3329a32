"""Failed logins are limited per client address and per username (issue 42, finding 1).

Every login check runs PBKDF2 (a million iterations), even for an unknown user, so an
unlimited `/login/` or `/admin/login/` was both online password guessing against staff
and a CPU flood of the web threads everybody's submits and polls share. Here every
login attempt counts against its client's address and against the username tried, in
Redis, for WINDOW_S, before its password is checked (the middleware runs before the
view); past either limit, a login POST is refused with 429 and Retry-After and no
password is checked at all. A successful login clears its username's count and takes
itself off its address's. Written here, not with django-axes,
because the counters belong in the Redis every web process already shares, next to the
quotas, with no database writes per attempt.

The client's address is dynamic_batching.web.access.client_address.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.signals import user_logged_in
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse

from dynamic_batching.core.quota import RefusalMemory
from dynamic_batching.protocol.names import LOGIN_FAILURES_PREFIX
from dynamic_batching.store import connection
from dynamic_batching.web.access import client_address

from .middleware import SyncOrAsync

log = logging.getLogger(__name__)

#: Failed logins allowed in a window, per client address and per username.
PER_ADDRESS = 20
PER_USERNAME = 5
WINDOW_S = 300


def _address_key(request: HttpRequest) -> str:
    return f"{LOGIN_FAILURES_PREFIX}addr:{client_address(request)}"


def _username_key(username: str) -> str:
    return f"{LOGIN_FAILURES_PREFIX}user:{username.strip().lower()[:150]}"


def _keys(request: HttpRequest, username: str | None) -> list[tuple[str, int]]:
    keys = [(_address_key(request), PER_ADDRESS)]
    if username:
        keys.append((_username_key(username), PER_USERNAME))
    return keys


def refused_for(request: HttpRequest, username: str | None) -> int | None:
    """Count this login attempt against its client's address and its username, before
    the password is checked; return the seconds until either count falls out of its
    window if this attempt takes it past its limit (the attempt is then refused), else
    None. Counting first, in one atomic step, lets exactly `limit` attempts through
    however many arrive at once: counting failures after the check let concurrent
    guesses slip past (8 of a flood from 4 threads got a password check, not 5)."""
    # The probe client: with Redis away, a login must not wait out the shared client's
    # retries (about 20 s); it goes on unthrottled.
    over = _count(request, username)
    return max(over.values()) if over else None


def _count(request: HttpRequest, username: str | None) -> dict[str, int]:
    """Count the attempt; each of its keys now past its limit, with its seconds left."""
    pipe = connection.probe().pipeline(transaction=True)
    keys = _keys(request, username)
    for key, _ in keys:
        pipe.incr(key)
        pipe.expire(key, WINDOW_S, nx=True)
        pipe.ttl(key)
    replies = pipe.execute()
    return {
        key: max(1, int(ttl))
        for (key, limit), count, ttl in zip(keys, replies[0::3], replies[2::3], strict=True)
        if int(count) > limit
    }


#: Addresses and usernames past their limit, and until when, in this process: a flood
#: is then refused before its body is read or Redis asked.
_locked = RefusalMemory()


def _succeeded(sender: Any, request: HttpRequest | None = None, user: Any = None, **_: Any) -> None:
    """A login that succeeds clears its username's count and takes itself back off its
    address's: only failures are held against an address."""
    if request is None or user is None:
        return
    try:
        pipe = connection.probe().pipeline(transaction=False)
        pipe.delete(_username_key(user.get_username()))
        pipe.decr(_address_key(request))
        pipe.execute()
    except Exception:  # noqa: BLE001
        log.warning("could not clear a login's failures", exc_info=True)


user_logged_in.connect(_succeeded, dispatch_uid="batching-login-succeeded")


class LoginThrottle(SyncOrAsync):
    """Refuse a login POST (the site's /login/ and the admin's) from an address or for a
    username past its failed-login limit: 429 with Retry-After, no password check.
    Sync and async alike (batching_site/middleware.py)."""

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self._paths: set[str] | None = None
        self.follow(get_response)

    def _call(self, request: HttpRequest) -> Any:
        return self._refused(request) or self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        refused = await sync_to_async(self._refused)(request) if request.method == "POST" else None
        return refused or await self.get_response(request)

    def _refused(self, request: HttpRequest) -> HttpResponse | None:
        if request.method != "POST":
            return None
        if self._paths is None:
            self._paths = {reverse("login"), reverse("admin:login")}
        if request.path not in self._paths:
            return None
        wait = self._locked_for(request)
        if wait is None:
            return None
        response = JsonResponse({"detail": f"too many failed logins: try again in {wait} s"}, status=429)
        response["Retry-After"] = str(wait)
        return response

    @staticmethod
    def _locked_for(request: HttpRequest) -> int | None:
        """Seconds this login attempt must wait: from memory when its address (before
        its body is read) or its username is known to be locked, else counted."""
        hit = _locked.recall(_address_key(request))
        username = None
        if hit is None:
            username = request.POST.get("username")
            hit = _locked.recall(_username_key(username)) if username else None
        if hit is not None:
            return max(1, int(hit[1]))
        try:
            over = _count(request, username)
        except Exception:  # noqa: BLE001 - Redis away: the login itself still works
            return None
        for key, seconds in over.items():
            _locked.remember(key, seconds, True)
        return max(over.values()) if over else None
