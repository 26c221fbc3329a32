"""Pages for people and Prometheus: /dashboard/, /requests/<id>, /metrics.

The dashboard is a static page that fetches /api/v1/stats once a second with its
session cookie, so it needs a login. /requests/<id> needs none: a request id is an
unguessable UUID handed to whoever submitted it, as for /requests/<id>.json, which the
submit page polls. /metrics is open like any Prometheus target and holds only
aggregates; put it behind the proxy's auth if that matters.
"""

from __future__ import annotations

import json
import logging

import redis
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from tasks import metrics
from tasks.protocol.names import PRIORITIES

from ..reporting import prometheus, timeline

log = logging.getLogger(__name__)


@require_GET
@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "dashboard.html",
        {"priorities": PRIORITIES, "flower_url": settings.FLOWER_URL, "series_len": metrics.SERIES_LEN},
    )


@require_GET
def request_detail(request: HttpRequest, request_id: object) -> HttpResponse:
    try:
        info = timeline.read(str(request_id))
    except redis.RedisError:
        log.warning("request page: Redis unreachable", exc_info=True)
        return HttpResponse(
            "The result store is unreachable; try again shortly.", status=503, content_type="text/plain"
        )
    result = info.get("result")
    preview = None
    if isinstance(result, list):
        preview = {"length": len(result), "head": [f"{x:.4f}" if isinstance(x, float) else x for x in result[:8]]}
    return render(
        request,
        "request_detail.html",
        {
            "info": info,
            "preview": preview,
            "details_json": json.dumps(info["details"], indent=2, sort_keys=True, default=str),
            "pending": info["status"] not in ("SUCCESS", "FAILURE"),
        },
    )


@require_GET
def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    try:
        snap = metrics.read(series=False)
    except redis.RedisError as exc:
        return HttpResponse(f"# broker unreachable: {exc}\n", status=503, content_type=prometheus.CONTENT_TYPE)
    return HttpResponse(prometheus.render(snap), content_type=prometheus.CONTENT_TYPE)
