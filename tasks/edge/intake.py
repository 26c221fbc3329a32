"""The edge: what a request must be before it is accepted.

`accept()` is the one place that validates a request and counts its tokens. The client
API and the HTTP views both call it, so a bad request fails the same way everywhere,
with ValueError or TypeError, before anything is enqueued.
"""

from __future__ import annotations

import json
import math

from celery import shared_task

from dynamic_batching.gpu_workers.models import get_spec

from ..core.errors import RequestTooLarge
from ..core.policy import PRIORITIES, BatchPolicy
from ..protocol.names import REQUEST_TASK
from ..protocol.request import Request
from ..store import clock

#: Longer inputs (as JSON) are refused before tokenizing: counting megabytes would let
#: one caller stall the edge. A model sees at most a few thousand tokens anyway.
MAX_INPUT_CHARS = 100_000


def accept(
    value: object,
    *,
    priority: object = "normal",
    model: object = None,
    deadline_s: object = None,
    policy: BatchPolicy,
    default_model: str,
) -> Request:
    """Validate one request's input for its model and count its tokens, or raise
    ValueError / TypeError (RequestTooLarge is a ValueError)."""
    size = len(value) if isinstance(value, str) else _json_size(value)
    if size > MAX_INPUT_CHARS:
        raise RequestTooLarge(size, MAX_INPUT_CHARS, "character limit")
    if priority not in PRIORITIES:
        raise ValueError(f"unknown priority {priority!r}; choose one of: {', '.join(PRIORITIES)}")
    model_name = default_model if model is None else model
    spec = get_spec(model_name)  # type: ignore[arg-type]  # raises ValueError naming the known models
    valid = spec.validate_input(value)
    policy = policy.for_model(spec.name)
    if deadline_s is None:
        deadline_s = policy.default_deadline_s
    if deadline_s is not None and (
        isinstance(deadline_s, bool)
        or not isinstance(deadline_s, (int, float))
        or not math.isfinite(deadline_s)
        or deadline_s <= 0
    ):
        raise ValueError(f"deadline_s must be a positive number of seconds, got {deadline_s!r}")

    tokens = spec.count_tokens(valid)
    truncated = alone = False
    limit, what = min((spec.max_tokens, "model's limit"), (policy.max_batch_tokens, "batch token budget"))
    if tokens > limit:
        if policy.oversized == "truncate":
            valid, tokens = spec.truncate(valid, limit)
            truncated = True
        elif policy.oversized == "run_alone":
            alone = True
            # Past the model's own limit the model truncates: say so in the result.
            truncated = tokens > spec.max_tokens
        else:
            raise RequestTooLarge(tokens, limit, what)

    now = clock.now()  # Redis's clock: the collector and devices judge the deadline
    return Request(
        input=valid,
        tokens=tokens,
        model=spec.name,
        priority=str(priority),
        submitted_at=now,
        deadline_at=None if deadline_s is None else now + float(deadline_s),
        truncated=truncated,
        alone=alone,
    )


def _json_size(value: object) -> int:
    try:
        # allow_nan=False: NaN and Infinity are not JSON, and messages are written by a
        # library that would turn them into null (tasks/protocol/wire.py::dumps).
        return len(json.dumps(value, ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as exc:
        raise TypeError(f"input must be JSON (a text, a list, an object; no NaN or Infinity): {exc}") from None


@shared_task(name=REQUEST_TASK)
def request(payload: dict[str, object]) -> None:
    """The name request messages carry. The collector consumes them itself; a plain
    worker that executes one was started on the wrong queues."""
    raise RuntimeError(
        "request messages are consumed by the batch collector; do not start an ordinary worker on the requests.* queues"
    )
