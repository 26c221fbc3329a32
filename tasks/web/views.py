"""Small views: the submit page, a request's status as JSON, and /healthz."""

from __future__ import annotations

import json

import redis
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render, resolve_url
from django.views.decorators.http import require_GET, require_POST

from dynamic_batching.conf import conf
from dynamic_batching.gpu_workers.models import get_spec, model_names
from dynamic_batching.models import BatchingPolicy
from dynamic_batching.protocol.app import get_app
from dynamic_batching.protocol.names import PRIORITIES
from dynamic_batching.store import clock, connection, redis_memory, shared_state

from ..reporting import timeline
from . import access
from .errors import refusal


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    """The submit page: for logged-in users, or anyone when BATCHING_OPEN_DEMO is on."""
    if not access.may_submit(request.user):
        return redirect_to_login(request.get_full_path())
    models = []
    for name in model_names():
        spec = get_spec(name)
        takes_text = spec.input_type is str
        models.append(
            {
                "name": name,
                "default": name == conf.DEFAULT_MODEL,
                "hint": spec.input_description + ("" if takes_text else " Type it as JSON."),
                "example": spec.input_example if takes_text else json.dumps(spec.input_example),
            }
        )
    # Only the tiers this caller's quota lets it ask for (a higher one is refused, 403).
    _, quota = access.spender(request, request.user)
    priorities = [p for p in PRIORITIES if quota.allows(p)]
    default = "normal" if "normal" in priorities else priorities[0]
    return render(
        request,
        "dynamic_batching/index.html",
        {"priorities": priorities, "default_priority": default, "models": models},
    )


def _refused(exc: Exception) -> JsonResponse:
    answer = refusal(exc, invalid_status=400)
    if answer is None:
        raise exc
    return answer.onto(JsonResponse({"detail": answer.detail}, status=answer.status))  # type: ignore[return-value]


@require_POST
def submit_form(request: HttpRequest) -> JsonResponse:
    """Accept one text from the page; answer 202 with its id, or a 4xx with the reason.
    The same submit path and error map as the API (access.submit_inputs, errors.refusal)."""
    if not access.may_submit(request.user):
        return _refused(access.NotLoggedIn(f"log in to submit: {resolve_url(settings.LOGIN_URL)}"))
    try:
        data = json.loads(request.body or b"{}") if request.content_type == "application/json" else request.POST
    except (ValueError, UnicodeDecodeError, RecursionError):
        return JsonResponse({"detail": "body is not valid JSON"}, status=400)
    if not hasattr(data, "get"):
        return JsonResponse({"detail": 'body must be a JSON object: {"text": "...", "priority": "normal"}'}, status=400)
    model = data.get("model") or None
    value = data.get("input") if "input" in data else data.get("text")
    if isinstance(value, str) and request.content_type != "application/json" and not _takes_text(model):
        # A form field is always a string; a model that takes a pair or a list gets JSON.
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return JsonResponse(
                {"detail": f"model {model!r} takes JSON input, e.g. a [query, passage] pair"}, status=400
            )
    try:
        (task_id,) = access.submit_inputs(
            request, request.user, [value], priority=data.get("priority") or "normal", model=model
        )
    except Exception as exc:  # noqa: BLE001 - errors.refusal decides; a bug re-raises
        return _refused(exc)
    return JsonResponse({"id": task_id, "status": "PENDING"}, status=202)


def _takes_text(model: object) -> bool:
    try:
        return get_spec(model if isinstance(model, str) else conf.DEFAULT_MODEL).input_type is str
    except (ValueError, TypeError):
        return True  # an unknown model: the submit path says so


@require_GET
def request_status(request: HttpRequest, request_id: object) -> JsonResponse:
    """The page's poll: the owner's (or staff's) request; 404 for anybody else."""
    if not request.user.is_authenticated and not conf.OPEN_DEMO:
        return JsonResponse({"detail": "log in to read requests"}, status=401)
    try:
        allowed = access.may_read(request, request.user, str(request_id))
    except redis.RedisError:
        return JsonResponse({"detail": "the result store is unreachable; try again shortly"}, status=503)
    if not allowed:
        return JsonResponse({"detail": "no such request of yours"}, status=404)
    meta = get_app().backend.get_task_meta(str(request_id))
    details = timeline.own_details(meta.get("batching") or {}, staff=access.is_staff(request.user))
    body: dict[str, object] = {"id": str(request_id), "status": meta["status"], "details": details}
    if meta["status"] == "SUCCESS":
        body["result"] = timeline.json_safe(meta["result"])
    elif meta["status"] in ("FAILURE", "REVOKED"):
        exc = meta["result"]
        body["error"] = f"{type(exc).__name__}: {exc}"
    return JsonResponse(body)


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 once web, broker, collector and at least one device worker answer; else 503
    naming what is missing. The detail (each part's state, error texts, devices, models,
    policy versions) goes to staff and to a probe on this host's loopback; anybody else
    gets `status`, `missing` and `warnings` only. Redis memory at WARN_FRACTION of maxmemory or more is named
    under "warnings" and keeps the 200: until it is full Redis still takes every write,
    and a full one refuses writes by itself while reads (answers) still work, which an
    unhealthy web process would stop serving too."""
    parts: dict[str, object] = {"web": "ok"}
    missing = []
    warnings = []
    try:
        connection.probe().ping()  # answers within a second while Redis is away
        r = shared_state.client()
        parts["broker"] = "ok"
        collector = shared_state.read_collector(r)
        devices = shared_state.live_devices(r)
        published: int | None = shared_state.read_policy(r).version
    except Exception as exc:  # noqa: BLE001 - any broker failure is "broker missing"
        parts["broker"] = f"unreachable: {exc}"
        missing.append("broker")
        collector, devices, published = None, {}, None
    if "broker" not in missing:
        try:
            memory = redis_memory.read(r)
        except Exception as exc:  # noqa: BLE001 - an unreadable INFO is reported, not a missing broker
            parts["redis_memory"] = f"unreadable: {exc}"
        else:
            parts["redis_memory"] = memory.to_dict() if memory else "not reported by the server"
            if memory and memory.state == "warning":
                warnings.append("redis_memory")
    if collector and clock.now() - collector.get("at", 0) < shared_state.HEARTBEAT_TTL_S:
        parts["collector"] = {"hostname": collector.get("hostname"), "policy_version": collector.get("policy_version")}
    else:
        missing.append("collector")
    if devices:
        parts["devices"] = sorted(devices)
    else:
        missing.append("device worker")
    # Per model: the live devices that hold it loaded. A model loaded nowhere is still
    # served (a device loads it on its first batch, which then waits for the load).
    parts["models"] = {
        name: {"loaded_on": sorted(d for d, info in devices.items() if name in info.get("models", ()))}
        for name in model_names()
    }
    # Saved in the admin, published to Redis (what the edge and collector read), and
    # applied by the collector: whichever lags shows where a policy change is stuck.
    # No row yet (sync_policy not run) means the defaults, version 0.
    active: object
    try:
        active = BatchingPolicy.objects.filter(singleton=True).values_list("version", flat=True).first() or 0
    except Exception as exc:  # noqa: BLE001 - /healthz reports a broken database, never 500s
        active = f"unreadable: {exc}"
    applied = collector.get("policy_version") if collector else None
    parts["policy"] = {
        "active_version": active,
        "published_version": published,
        "collector_version": applied,
        "in_sync": active == published == applied,
    }
    if missing:
        parts["missing"] = missing
    if warnings:
        parts["warnings"] = warnings
    status = 503 if missing else 200
    parts["status"] = "unavailable" if missing else "ok"
    if not (access.is_staff(request.user) or _direct_from_loopback(request)):
        # Anybody else gets the verdict and the names of what is missing: no error
        # texts, hosts, ports or device ids (issue 42, finding 5).
        return JsonResponse({k: parts[k] for k in ("status", "missing", "warnings") if k in parts}, status=status)
    return JsonResponse(parts, status=status)


def _direct_from_loopback(request: HttpRequest) -> bool:
    """A health check on this host that did not come through the front door (which
    always adds X-Forwarded-For): a container's or supervisor's own probe."""
    return request.META.get("REMOTE_ADDR") in ("127.0.0.1", "::1") and "HTTP_X_FORWARDED_FOR" not in request.META
