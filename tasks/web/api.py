"""The JSON API at /api/v1/, with its OpenAPI schema at /api/v1/openapi.json and
interactive docs at /api/v1/docs.

Auth, on every operation:
- scripts send `Authorization: Bearer bt_...` (`manage.py create_api_token USERNAME`);
- pages send the Django session cookie, and a CSRF token (X-CSRFToken) on POST.
Without either: 401.

Errors are JSON `{"detail": ...}`, never a 500 for bad input:
400 unparseable body, 401/403 auth or CSRF, 404 a request that is not yours, 413 body
over DATA_UPLOAD_MAX_MEMORY_SIZE or a text over its limit, 422 invalid fields, 429 queue
full or your quota used up (with Retry-After), 503 broker unreachable.

Who reads what: a request is read by its owner (the user who submitted it, by session
or token) and by staff; tasks/web/access.py holds every rule.
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from typing import Annotated, Any, Literal

import redis
from asgiref.sync import sync_to_async
from celery import states
from celery.exceptions import TimeoutError as CeleryTimeoutError
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from kombu.exceptions import OperationalError
from ninja import Field, NinjaAPI, Query, Schema, Status
from ninja.errors import HttpError
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf
from pydantic import TypeAdapter, create_model, field_validator, model_validator

from dynamic_batching import metrics
from dynamic_batching.conf import conf
from dynamic_batching.core.errors import Overloaded, PriorityNotAllowed, QuotaExceeded
from dynamic_batching.edge.aio import AwaitableResult
from dynamic_batching.gpu_workers.models import get_spec, model_names
from dynamic_batching.gpu_workers.models.base import check_text
from dynamic_batching.models import ApiToken
from dynamic_batching.protocol.app import get_app
from dynamic_batching.protocol.names import PRIORITIES
from dynamic_batching.store import owners, shared_state

from ..reporting import stats, timeline
from . import access
from .errors import refusal

log = logging.getLogger(__name__)

#: Most texts in one POST /requests.
MAX_TEXTS = 256


class BearerToken(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Any:
        # A token refused for its rate or its requests in flight a moment ago is refused
        # again at once: no token lookup, no Redis, no body read (access.refusals).
        if request.method == "POST":
            hit = access.refusals.recall(token)
            if hit is not None:
                exc, left = hit
                raise QuotaExceeded(exc.owner, exc.limit, exc.tier, left)
        user = ApiToken.objects.user_for(token)
        if user is not None and request.method == "POST":
            access.recall_refusal(request, user)
        return user


class SessionWithCsrf(APIKeyCookie):
    """Django's session, for the pages. CSRF is checked only once a session user is
    found, so a request with no credentials gets 401, not a CSRF 403."""

    param_name = settings.SESSION_COOKIE_NAME

    def _get_key(self, request: HttpRequest) -> str | None:
        return request.COOKIES.get(self.param_name)

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        if not request.user.is_authenticated:
            return None
        if check_csrf(request) is not None:
            raise HttpError(403, "CSRF check failed: send the csrftoken cookie's value in the X-CSRFToken header")
        if request.method == "POST":
            access.recall_refusal(request, request.user)
        return request.user


api = NinjaAPI(
    title="Dynamic batching API",
    version="1",
    description=__doc__ or "",
    urls_namespace="batching-api-v1",
    auth=[BearerToken(), SessionWithCsrf()],
)


# --- schemas -----------------------------------------------------------------------------


class SubmitIn(Schema):
    """Exactly one of `text`, `texts`, `input` and `inputs`. Each model's own input
    schema is at POST /api/v1/models/{name}/requests and GET /api/v1/models."""

    text: str | None = Field(None, description="One text, for a model that takes texts.", examples=["a sentence"])
    texts: list[str] | None = Field(
        None, min_length=1, max_length=MAX_TEXTS, description=f"Up to {MAX_TEXTS} texts, answered in order."
    )
    input: Any = Field(
        None, description="One input as the model takes it: a text, a [query, passage] pair, ... (GET /models)."
    )
    inputs: list[Any] | None = Field(
        None, min_length=1, max_length=MAX_TEXTS, description=f"Up to {MAX_TEXTS} inputs, answered in order."
    )
    priority: Literal[PRIORITIES] = "normal"  # type: ignore[valid-type]
    model: str | None = Field(None, max_length=64, description="A registered model; the default model if omitted.")
    deadline_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Seconds from now; a request not dispatched by then fails with DeadlineExceeded.",
    )

    @field_validator("text")
    @classmethod
    def _text_utf8(cls, v: str | None) -> str | None:
        return None if v is None else check_text(v)

    @field_validator("texts")
    @classmethod
    def _texts_utf8(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else [check_text(t) for t in v]

    @model_validator(mode="after")
    def _one_of(self) -> SubmitIn:
        given = [f for f in ("text", "texts", "input", "inputs") if getattr(self, f) is not None]
        if len(given) != 1:
            raise ValueError(
                "send exactly one of `text` (a string), `texts` (a list of strings), `input` (one input for "
                "the model) and `inputs` (a list of them)"
            )
        return self

    def values(self) -> list[Any]:
        if self.text is not None:
            return [self.text]
        if self.input is not None:
            return [self.input]
        return list(self.texts if self.texts is not None else self.inputs or [])


class SubmitOut(Schema):
    ids: list[str] = Field(description="One request id per input, in input order.")
    status: str = "PENDING"


class Error(Schema):
    detail: Any = Field(description="What was wrong: a message, or a list of field errors (422).")


class Event(Schema):
    event: str
    at: float | None
    text: str


class RequestOut(Schema):
    id: str
    status: str = Field(description="PENDING until there is an outcome, then SUCCESS or FAILURE.")
    result: Any = Field(None, description="The model's answer, on SUCCESS (its schema: GET /api/v1/models).")
    error: str | None = Field(None, description="The request's own error, on FAILURE.")
    details: dict[str, Any] = Field(description="Batch, device, timings; empty while pending.")
    timeline: list[Event]


ERRORS: dict[int, type[Schema]] = {code: Error for code in (400, 401, 403, 413, 422, 429, 503)}


# --- operations ---------------------------------------------------------------------------


@api.post("/requests", response={202: SubmitOut, **ERRORS}, summary="Submit one input or many")
def create_requests(request: HttpRequest, payload: SubmitIn) -> Status:
    """Queue inputs for a model; answers 202 with their ids at once.

    Example: `{"texts": ["first", "second"], "priority": "normal", "model": "minilm",
    "deadline_s": 5}` → `202 {"ids": ["…", "…"], "status": "PENDING"}`. Poll each id
    with GET /api/v1/requests/{id}.
    """
    return _submit(request, payload.values(), payload.priority, payload.model, payload.deadline_s)


def _submit(
    request: HttpRequest, values: list[Any], priority: str, model: str | None, deadline_s: float | None
) -> Status:
    try:
        ids = access.submit_inputs(request, request.auth, values, priority=priority, model=model, deadline_s=deadline_s)
    except (ValueError, TypeError, PriorityNotAllowed) as exc:
        # The edge's own checks (tasks/edge/intake.py): an unknown model, an empty text;
        # a tier above the caller's quota (403).
        answer = refusal(exc)
        assert answer is not None
        raise HttpError(answer.status, answer.detail) from exc
    except QuotaExceeded as exc:
        token = access.bearer_token(request)
        if exc.limit in access.REMEMBERED and token:
            access.refusals.remember(token, exc.retry_after, exc)
        raise
    return Status(202, {"ids": ids, "status": "PENDING"})


class ModelOut(Schema):
    name: str
    default: bool = Field(description="Requests that name no model get this one.")
    max_tokens: int
    input: dict[str, Any] = Field(description="JSON schema of one input.")
    output: dict[str, Any] = Field(description="JSON schema of one answer.")
    input_description: str
    output_description: str
    example: Any


def _model_out(name: str) -> dict[str, Any]:
    spec = get_spec(name)
    return {
        "name": name,
        "default": name == conf.DEFAULT_MODEL,
        "max_tokens": spec.max_tokens,
        "input": TypeAdapter(spec.input_type).json_schema(),
        "output": TypeAdapter(spec.output_type).json_schema(),
        "input_description": spec.input_description,
        "output_description": spec.output_description,
        "example": spec.input_example,
    }


@api.get("/models", response={200: list[ModelOut], **ERRORS}, summary="The models served, with their schemas")
def list_models(request: HttpRequest) -> list[dict[str, Any]]:
    """Every model in BATCHING_MODELS: its input and output as JSON schemas, its token
    limit, and an example input."""
    return [_model_out(name) for name in model_names()]


def _typed_operation(name: str) -> None:
    """POST /models/{name}/requests: the same as POST /requests with "model": name, but
    its body's schema is the model's own, so the OpenAPI document shows it."""
    spec = get_spec(name)
    kind = spec.input_type
    body = create_model(
        f"{''.join(p.capitalize() for p in re.split(r'[^0-9A-Za-z]+', name))}Submit",
        __base__=Schema,
        input=(kind | None, Field(None, description=spec.input_description, examples=[spec.input_example])),
        inputs=(
            list[kind] | None,  # type: ignore[valid-type]
            Field(None, min_length=1, max_length=MAX_TEXTS, description=f"Up to {MAX_TEXTS} inputs, in order."),
        ),
        priority=(Literal[PRIORITIES], "normal"),  # type: ignore[valid-type]
        deadline_s=(float | None, Field(None, gt=0, allow_inf_nan=False, description="Seconds from now.")),
    )

    def submit_to_model(request: HttpRequest, payload: body) -> Status:  # type: ignore[valid-type]
        if (payload.input is None) == (payload.inputs is None):
            raise HttpError(422, "send exactly one of `input` and `inputs`")
        values = [payload.input] if payload.input is not None else list(payload.inputs)
        return _submit(request, values, payload.priority, name, payload.deadline_s)

    # Resolved here: with postponed annotations, "body" would name nothing ninja can find.
    submit_to_model.__annotations__.update({"request": HttpRequest, "payload": body, "return": Status})
    submit_to_model.__doc__ = (
        f"Queue inputs for `{name}`. One input: {spec.input_description} One answer: {spec.output_description}"
    )
    api.post(
        f"/models/{name}/requests",
        response={202: SubmitOut, **ERRORS},
        summary=f"Submit to {name}",
        operation_id=f"submit_{re.sub(r'[^0-9A-Za-z]+', '_', name)}",
    )(submit_to_model)


for _name in model_names():
    _typed_operation(_name)


#: The longest `?wait=` a status read may hold: under a proxy's and a client's timeouts.
MAX_WAIT_S = 30.0


@api.get(
    "/requests/{request_id}", response={200: RequestOut, 404: Error, **ERRORS}, summary="A request's status and result"
)
async def get_request(
    request: HttpRequest,
    request_id: uuid.UUID,
    wait: Annotated[
        float,
        Query(
            ge=0,
            le=MAX_WAIT_S,
            description="Seconds to wait for the request to end before answering (a long poll): "
            "the answer comes as soon as it is stored, else its state once `wait` has passed.",
        ),
    ] = 0.0,
) -> dict[str, Any]:
    """PENDING, or SUCCESS with `result`, or FAILURE with `error`; `details` and
    `timeline` say which batch and device ran it and when. Only its owner and staff
    read it: 404 for anybody else, as for an id that never existed. With `?wait=S` it
    answers once the request has ended or S seconds have passed, whichever is first; the
    wait is a coroutine on the web worker's event loop, not a thread."""
    task_id = str(request_id)
    if not await sync_to_async(access.may_read)(request, request.auth, task_id):
        raise HttpError(404, "no such request of yours")
    if wait > 0:
        with contextlib.suppress(CeleryTimeoutError):
            await AwaitableResult(task_id, app=get_app()).aget(timeout=wait, propagate=False)
    return await sync_to_async(timeline.read)(task_id, staff=access.is_staff(request.auth))


class CancelOut(Schema):
    id: str
    status: str = Field(description="The request's state when the cancel was sent: PENDING or STARTED.")
    detail: str


@api.delete(
    "/requests/{request_id}",
    response={202: CancelOut, 404: Error, 409: Error, **ERRORS},
    summary="Cancel a request that has not run",
)
def cancel_request(request: HttpRequest, request_id: uuid.UUID) -> Status:
    """Revoke it, as Celery's `AsyncResult(id).revoke()` does: a request still queued
    or held never runs and ends REVOKED (within a collector turn, 0.25 s); one already
    in a running batch (STARTED) finishes. Its owner and staff only: 404 for anybody
    else; 409 once it has finished."""
    task_id = str(request_id)
    if not access.may_read(request, request.auth, task_id):
        raise HttpError(404, "no such request of yours")
    result = get_app().AsyncResult(task_id)
    state = result.state
    if state in states.READY_STATES:
        raise HttpError(409, f"request {task_id} has finished already ({state}): nothing to cancel")
    result.revoke()
    detail = "its batch is running: it finishes" if state == states.STARTED else "it will not run: it ends REVOKED"
    return Status(202, {"id": task_id, "status": state, "detail": detail})


@api.get("/stats", response={200: dict[str, Any], **ERRORS}, summary="The dashboard's numbers")
def get_stats(
    request: HttpRequest,
    since: Annotated[
        float | None, Query(None, allow_inf_nan=False, description="Only chart points newer than this epoch time.")
    ] = None,
) -> dict[str, Any]:
    """Queue depths, p50/p99 wait per priority, throughput, batch fill, devices, SLO
    checks, recent failed and isolated requests (only your own, unless you are staff),
    the chart series, and, for staff, each recent client's use of its quota. At most
    2 reads a second (10 at once) per caller: past that, 429 with Retry-After."""
    access.charge_stats_read(request.auth)
    body = stats.build(
        metrics.read(),
        slo=stats.Slo.from_settings(),
        flower_url=conf.FLOWER_URL,
        since=since,
    )
    recent = body["recent"]
    for kind in ("failed", "slow"):
        mine = access.readable(request, request.auth, [e.get("id") for e in recent[kind] if e.get("id")])
        recent[kind] = [e for e in recent[kind] if e.get("id") in mine]
    if access.is_staff(request.auth):
        body["clients"] = stats.clients(owners.recent_clients(shared_state.client()), metrics.refused_by_owner())
    return body


# --- errors ---------------------------------------------------------------------------------


def _error(request: HttpRequest, status: int, detail: Any) -> HttpResponse:
    return api.create_response(request, {"detail": detail}, status=status)


def _refused(request: HttpRequest, exc: Exception) -> HttpResponse:
    answer = refusal(exc)
    if answer is None:
        raise exc
    if answer.status == 503:
        log.warning("API call failed on Redis: %s", exc)
    return answer.onto(_error(request, answer.status, answer.detail))


@api.exception_handler(RequestDataTooBig)
def _body_too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return _error(request, 413, f"request body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")


for _kind in (Overloaded, redis.RedisError, OperationalError, ConnectionError):
    api.add_exception_handler(_kind, _refused)
