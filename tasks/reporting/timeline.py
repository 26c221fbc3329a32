"""One request as the web sees it: status, result or error, and its timeline.

`read(request_id)` reads the request's Celery result meta (one Redis GET), where the
device worker or the collector stored the outcome and the "batching" details dict;
`timeline()` turns those details into events. The API's GET /requests/{id} and the
/requests/<id> page both show what this returns.

A request with no outcome yet reads as PENDING: it is in a queue, held by the
collector, or running. An id nobody ever submitted reads the same way, as it does in
Celery, because telling them apart would mean searching every queue.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from celery import states

from dynamic_batching.protocol.app import get_app


def _timestamp(value: Any) -> float | None:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return None


def _error_text(meta: dict[str, Any]) -> str:
    exc = meta.get("result")
    if isinstance(exc, BaseException):
        return f"{type(exc).__name__}: {exc}"
    if isinstance(exc, dict) and "exc_type" in exc:
        message = exc.get("exc_message")
        if isinstance(message, (list, tuple)):
            message = " ".join(str(m) for m in message)
        return f"{exc['exc_type']}: {message}"
    return str(exc)


def json_safe(answer: Any) -> Any:
    """A model's answer with each NaN and infinity as null, as JavaScript's
    JSON.stringify writes them: JSON has no such numbers, and a browser's JSON.parse
    refuses a whole response over one. A script's `.get()` still gets the float."""
    try:
        return _finite(answer)
    except RecursionError:  # nested deeper than a response can be written anyway
        return answer


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


#: What a request's record says about its batch-mates or the hardware: with its own
#: token count, a batch's size and padded tokens give away the lengths of other
#: tenants' inputs (issue 42, finding 6). Staff see them; a request's owner does not.
SHARED_FIELDS = ("batch_id", "batch_size", "real_tokens", "padded_tokens", "device")


def own_details(details: dict[str, Any], *, staff: bool) -> dict[str, Any]:
    """`details` as this caller may see them."""
    return dict(details) if staff else {k: v for k, v in details.items() if k not in SHARED_FIELDS}


def read(request_id: str, *, staff: bool) -> dict[str, Any]:
    """{"id", "status", "details", "timeline", and "result" or "error"}; the batch's
    shared fields only for `staff`."""
    meta = get_app().backend.get_task_meta(request_id)
    status = meta.get("status", states.PENDING)
    details = own_details(meta.get("batching") or {}, staff=staff)
    body: dict[str, Any] = {"id": request_id, "status": status, "details": details}
    if status == states.SUCCESS:
        body["result"] = json_safe(meta.get("result"))
    elif status in (states.FAILURE, states.REVOKED):
        body["error"] = _error_text(meta)
    body["timeline"] = timeline(status, details, done_at=_timestamp(meta.get("date_done")), error=body.get("error"))
    return body


def timeline(
    status: str, details: dict[str, Any], *, done_at: float | None, error: str | None = None
) -> list[dict[str, Any]]:
    """Events in order: {"event", "at" (epoch seconds or None), "text"}."""
    events: list[dict[str, Any]] = []
    submitted = details.get("submitted_at")
    if submitted is not None:
        events.append(
            {"event": "submitted", "at": submitted, "text": f"accepted at {details.get('priority')} priority"}
        )
    if details.get("expired"):
        events.append({"event": "expired", "at": done_at, "text": error or "deadline passed before dispatch"})
        return events
    dispatched = details.get("dispatched_at")
    if dispatched is not None:
        batch = ""
        if details.get("batch_id") is not None:
            fill = ""
            if details.get("padded_tokens"):
                fill = f", fill {details.get('real_tokens', 0) / details['padded_tokens']:.0%}"
            batch = f"in batch {details.get('batch_id')} of {details.get('batch_size')} request(s){fill}, "
        events.append(
            {"event": "dispatched", "at": dispatched, "text": f"{batch}after waiting {details.get('waited_ms')} ms"}
        )
    started = details.get("started_at")
    if started is not None:
        lane = " alone, isolated as too slow to share a batch" if details.get("isolated") else ""
        where = f"on device {details['device']}" if details.get("device") is not None else "on a device"
        events.append({"event": "started", "at": started, "text": f"{where}{lane}"})
    if status in states.READY_STATES:
        if status == states.SUCCESS:
            text = f"succeeded; the batch ran {details.get('run_ms')} ms"
            if details.get("truncated"):
                text += "; the text was truncated to fit the model"
        elif status == states.REVOKED:
            text = "cancelled (revoked) before it ran"
        else:
            text = f"failed: {error}"
        events.append({"event": "finished", "at": done_at, "text": text})
    else:
        events.append({"event": "pending", "at": None, "text": "queued, held by the collector, or running"})
    return events
