"""Pages for people and Prometheus: /dashboard/, /requests/<id>, /metrics.

The dashboard is a static page that fetches /api/v1/stats once a second with its
session cookie, so it needs a login. /requests/<id> shows a request only to its owner
and staff (tasks/web/access.py); anybody else gets 404. /metrics holds only
aggregates, for staff: a browser session, or Prometheus with a staff user's API token
(`authorization: {type: Bearer, credentials: bt_...}` in its scrape config).
"""

from __future__ import annotations

import json
import logging

import redis
from celery import states
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render, resolve_url
from django.urls import reverse
from django.views.decorators.http import require_GET

from dynamic_batching import metrics
from dynamic_batching.conf import conf
from dynamic_batching.models import ApiToken
from dynamic_batching.protocol.names import PRIORITIES

from ..reporting import prometheus, timeline
from . import access

log = logging.getLogger(__name__)


@require_GET
@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "dynamic_batching/dashboard.html",
        {
            "priorities": PRIORITIES,
            "flower_url": conf.FLOWER_URL,
            "series_len": metrics.SERIES_LEN,
            "login_url": resolve_url(settings.LOGIN_URL),
        },
    )


@require_GET
def request_detail(request: HttpRequest, request_id: object) -> HttpResponse:
    if not request.user.is_authenticated and not conf.OPEN_DEMO:
        return redirect_to_login(request.get_full_path())
    try:
        if not access.may_read(request, request.user, str(request_id)):
            raise Http404("no such request of yours")
        info = timeline.read(str(request_id), staff=access.is_staff(request.user))
    except redis.RedisError:
        log.warning("request page: Redis unreachable", exc_info=True)
        return HttpResponse(
            "The result store is unreachable; try again shortly.", status=503, content_type="text/plain"
        )
    result = info.get("result")
    preview = None
    if isinstance(result, list) and all(isinstance(x, (int, float)) for x in result):
        preview = {"length": len(result), "head": [f"{x:.4f}" if isinstance(x, float) else x for x in result[:8]]}
    return render(
        request,
        "dynamic_batching/request_detail.html",
        {
            "info": info,
            "preview": preview,
            "details_json": json.dumps(info["details"], indent=2, sort_keys=True, default=str),
            "result_json": json.dumps(result, indent=2, default=str)[:20_000],
            "pending": info["status"] not in states.READY_STATES,
            # Its owner (or staff) may cancel it while it waits (DELETE on the API).
            "cancel_url": reverse("batching-api-v1:cancel_request", args=[info["id"]])
            if info["status"] == states.PENDING
            else None,
        },
    )


@require_GET
def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    user = request.user
    if not user.is_authenticated:
        user = ApiToken.objects.user_for(access.bearer_token(request))
    if user is None:
        return HttpResponse(
            "# log in as staff, or send a staff user's API token\n", status=401, content_type="text/plain"
        )
    if not access.is_staff(user):
        return HttpResponse("# staff only\n", status=403, content_type="text/plain")
    try:
        snap = metrics.read(series=False)
    except redis.RedisError as exc:
        return HttpResponse(f"# broker unreachable: {exc}\n", status=503, content_type=prometheus.CONTENT_TYPE)
    return HttpResponse(prometheus.render(snap), content_type=prometheus.CONTENT_TYPE)
