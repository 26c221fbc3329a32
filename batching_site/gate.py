"""The staff gate the front door asks before it lets a request through to Flower
(batching_site/deploy/Caddyfile, `forward_auth`). Django's session decides, so Flower
needs no password of its own and every staff login is the admin's.

Flower has a host name of its own (FLOWER_URL's, `flower.SITE_HOST` in compose), so that
a script that ever ran in Flower's pages could not read the site's (issue 42, finding
10). The site's session cookie is not sent there, so staff carry their login across
once: Flower's host name sends a visitor with no session of its own to `/auth/flower`
on the site's, which, for logged-in staff, sends them back to `/_staff/enter` on
Flower's with a ticket good for one use within a minute; that logs them in there, in a
session of Flower's host name alone. The gate then reads that session.
"""

from __future__ import annotations

import secrets
from urllib.parse import urlencode, urlsplit

import redis
from django.contrib.auth import get_user_model, login
from django.contrib.auth.views import redirect_to_login
from django.core import signing
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.crypto import constant_time_compare
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from dynamic_batching.conf import conf
from dynamic_batching.protocol.names import FLOWER_TICKETS_PREFIX
from dynamic_batching.store import connection

#: A ticket is good this long, and once.
TICKET_S = 60
_SALT = "batching_site.gate.flower-ticket"


@never_cache
@require_safe
def staff_gate(request: HttpRequest) -> HttpResponse:
    """`GET /auth/staff`, with the visitor's cookies, as the proxy forwards them.

    204: an active staff user's session; the proxy passes the request on.
    401: no session (the proxy sends the visitor to the admin's login form).
    403: logged in, but not staff.
    No body either way: the proxy reads the status only.
    """
    user = request.user
    if not user.is_authenticated:
        return HttpResponse(status=401)
    if not (user.is_active and user.is_staff):
        return HttpResponse(status=403)
    return HttpResponse(status=204)


def flower_origin() -> tuple[str, str] | None:
    """FLOWER_URL's scheme and host (with any port), or None when it has none."""
    parts = urlsplit(conf.FLOWER_URL)
    return (parts.scheme, parts.netloc) if parts.scheme in ("http", "https") and parts.netloc else None


def _flower_path(value: str | None) -> str:
    """Where on Flower's host name to land: a path under Flower's own, else its start."""
    start = urlsplit(conf.FLOWER_URL).path or "/"
    if value and value.startswith(start) and not value.startswith("//") and "\\" not in value:
        return value
    return start


@never_cache
@require_safe
def flower_ticket(request: HttpRequest) -> HttpResponse:
    """`GET /auth/flower?next=PATH`, on the site's host name: staff go on to Flower's,
    with a ticket for `/_staff/enter` there. Anybody else logs in first (302 to the
    admin's login form) or is refused (403)."""
    origin = flower_origin()
    if origin is None:
        raise Http404("FLOWER_URL names no host")
    user = request.user
    if not user.is_authenticated:
        return redirect_to_login(request.get_full_path(), reverse("admin:login"))
    if not (user.is_active and user.is_staff):
        return HttpResponse("Flower is for staff only.", status=403, content_type="text/plain")
    ticket = signing.dumps(
        {"u": user.pk, "h": user.get_session_auth_hash(), "n": secrets.token_urlsafe(16)}, salt=_SALT
    )
    query = urlencode({"ticket": ticket, "next": _flower_path(request.GET.get("next"))})
    return HttpResponseRedirect(f"{origin[0]}://{origin[1]}{reverse('flower-enter')}?{query}")


@never_cache
@require_safe
def flower_enter(request: HttpRequest) -> HttpResponse:
    """`GET /_staff/enter?ticket=...&next=PATH`, on Flower's host name only: a ticket
    from `/auth/flower`, unused, under a minute old, for a user who is still active
    staff with the same password, logs that user in on Flower's host name (403
    otherwise), then goes on to `next`."""
    origin = flower_origin()
    if origin is None or request.get_host() != origin[1]:
        raise Http404("only on Flower's host name")
    refused = HttpResponse(
        "This link to Flower has expired or was used: open Flower again from the site.",
        status=403,
        content_type="text/plain",
    )
    try:
        ticket = signing.loads(request.GET.get("ticket", ""), salt=_SALT, max_age=TICKET_S)
        user_id, password_hash, nonce = ticket["u"], str(ticket["h"]), str(ticket["n"])
    except (signing.BadSignature, KeyError, TypeError):
        return refused
    # Once: a ticket seen in a log, a history or a Referer opens nothing.
    try:
        first_use = connection.probe().set(f"{FLOWER_TICKETS_PREFIX}{nonce}", 1, nx=True, ex=TICKET_S + 5)
    except redis.RedisError:
        # Not a 500: unchecked, the ticket opens nothing, and it is still good to retry.
        return HttpResponse(
            "Cannot check this link to Flower right now (Redis is away): reload in a moment.",
            status=503,
            headers={"Retry-After": "5"},
            content_type="text/plain",
        )
    if not first_use:
        return refused
    user = get_user_model().objects.filter(pk=user_id, is_active=True, is_staff=True).first()
    if user is None or not constant_time_compare(password_hash, user.get_session_auth_hash()):
        return refused
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return HttpResponseRedirect(_flower_path(request.GET.get("next")))
