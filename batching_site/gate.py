"""The staff gate the front door asks before it lets a request through to Flower
(batching_site/deploy/Caddyfile, `forward_auth`). Django's session decides, so Flower
needs no password of its own and every staff login is the admin's."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe


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
