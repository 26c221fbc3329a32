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

Once a web process knows an address is past its limit, LockedAddressGate, in front of
the whole site (batching_site/asgi.py), refuses that address's login POSTs on the event
loop: no thread, no body, no Django. A refused login cost the web 1.8-2.4 ms of CPU
through Django and 0.4-0.56 ms there (bench/login_flood.py), and a flood of them takes
that CPU from everybody else's submits. Each such refusal is held HOLD_S first, so a
client waiting for its answers floods at a few attempts a second: under 1,000 wrong
passwords from one client, a logged-in user's p99 went from 2.8-3.0x its quiet p99 to
1.0-1.3x (the same bench).
"""

from __future__ import annotations

import asyncio
import functools
import json
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
from dynamic_batching.web.access import address_of, client_address

from .middleware import SyncOrAsync

log = logging.getLogger(__name__)

#: Failed logins allowed in a window, per client address and per username.
PER_ADDRESS = 20
PER_USERNAME = 5
WINDOW_S = 300
#: LockedAddressGate answers a locked address's login POST after this long, so that a
#: client retrying without waiting its Retry-After sends a few a second, not hundreds.
#: Holding costs a sleeping coroutine; past HOLD_AT_MOST held at once in a process, the
#: rest are answered at once.
HOLD_S = 1.0
HOLD_AT_MOST = 256


def _address_key(request: HttpRequest) -> str:
    return _key_of_address(client_address(request))


def _key_of_address(address: str) -> str:
    return f"{LOGIN_FAILURES_PREFIX}addr:{address}"


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
    # The address's count, carried on here while this process refuses without Redis.
    _strikes.remember(keys[0][0], WINDOW_S, int(replies[0]))
    return {
        key: max(1, int(ttl))
        for (key, limit), count, ttl in zip(keys, replies[0::3], replies[2::3], strict=True)
        if int(count) > limit
    }


#: Addresses and usernames past their limit, and until when, in this process: a flood
#: is then refused before its body is read or Redis asked.
_locked = RefusalMemory()
#: Each address's count of login attempts as Redis last gave it, plus the attempts
#: this process refused from memory since (for a username it knows is locked), which
#: never reach Redis: past PER_ADDRESS the address is locked here too, and
#: LockedAddressGate refuses it before Django.
_strikes = RefusalMemory()


def _strike(address_key: str, wait: float) -> None:
    hit = _strikes.recall(address_key)
    count = (hit[0] if hit else 0) + 1
    _strikes.remember(address_key, WINDOW_S, count)
    if count > PER_ADDRESS:
        _locked.remember(address_key, wait, True)


@functools.cache
def _login_paths() -> frozenset[str]:
    """The site's login and the admin's: every password check."""
    return frozenset({reverse("login"), reverse("admin:login")})


def _refusal(wait: int) -> str:
    return f"too many failed logins: try again in {wait} s"


def _seconds_left(hit: tuple[Any, float]) -> int:
    """A remembered lock's Retry-After: whole seconds, at least one."""
    return max(1, int(hit[1]))


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
        self.follow(get_response)

    def _call(self, request: HttpRequest) -> Any:
        return self._refused(request) or self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        refused = await sync_to_async(self._refused)(request) if request.method == "POST" else None
        return refused or await self.get_response(request)

    def _refused(self, request: HttpRequest) -> HttpResponse | None:
        if request.method != "POST":
            return None
        if request.path not in _login_paths():
            return None
        wait = self._locked_for(request)
        if wait is None:
            return None
        response = JsonResponse({"detail": _refusal(wait)}, status=429)
        response["Retry-After"] = str(wait)
        return response

    @staticmethod
    def _locked_for(request: HttpRequest) -> int | None:
        """Seconds this login attempt must wait: from memory when its address (before
        its body is read) or its username is known to be locked, else counted."""
        address = _address_key(request)
        hit = _locked.recall(address)
        username = None
        if hit is None:
            username = request.POST.get("username")
            hit = _locked.recall(_username_key(username)) if username else None
            if hit is not None:
                _strike(address, hit[1])
        if hit is not None:
            return _seconds_left(hit)
        try:
            over = _count(request, username)
        except Exception:  # noqa: BLE001 - Redis away: the login itself still works
            return None
        for key, seconds in over.items():
            _locked.remember(key, seconds, True)
        return max(over.values()) if over else None


class LockedAddressGate:
    """The site's ASGI application behind a gate: a login POST from an address this
    process knows to be locked gets LoginThrottle's 429 here, on the event loop, before
    a thread, its body or Django are spent on it. Everything else passes through; an
    address not yet known here is counted by LoginThrottle as before."""

    def __init__(
        self, app: Callable[..., Any], *, hold_s: float = HOLD_S, sleep: Callable[[float], Any] = asyncio.sleep
    ) -> None:
        self.app = app
        self.hold_s = hold_s
        self.sleep = sleep
        self.held = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        wait = self._locked_for(scope) if scope["type"] == "http" and scope["method"] == "POST" else None
        if wait is None:
            await self.app(scope, receive, send)
            return
        if self.held < HOLD_AT_MOST:
            self.held += 1
            try:
                await self.sleep(self.hold_s)
            finally:
                self.held -= 1
        body = json.dumps({"detail": _refusal(wait)}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(wait).encode()),
            (b"x-content-type-options", b"nosniff"),
        ]
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    def _locked_for(scope: dict[str, Any]) -> int | None:
        if scope["path"] not in _login_paths():
            return None
        # Repeated headers joined as a Django request's META joins them.
        forwarded = ",".join(v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"x-forwarded-for")
        client = scope.get("client")
        hit = _locked.recall(_key_of_address(address_of(forwarded, client[0] if client else "")))
        return None if hit is None else _seconds_left(hit)
