"""The edge: what a request must be before it is accepted.

`accept()` is the one place that validates a request and counts its tokens. The client
API and the HTTP views both call it, so a bad request fails the same way everywhere,
with ValueError or TypeError, before anything is enqueued.
"""

from __future__ import annotations

import math

from celery import shared_task

from gpu_workers.models import TEST_MODELS, get_spec

from ..core.errors import RequestTooLarge
from ..core.policy import PRIORITIES, BatchPolicy
from ..protocol.names import REQUEST_TASK
from ..protocol.request import Request
from ..store import clock

#: Longer texts are refused before tokenizing: counting megabytes of text would let one
#: caller stall the edge. The model sees at most a few hundred tokens anyway.
MAX_TEXT_CHARS = 100_000


def accept(
    text: object,
    *,
    priority: object = "normal",
    model: object = None,
    deadline_s: object = None,
    policy: BatchPolicy,
    default_model: str,
    test_models: bool = False,
) -> Request:
    """Validate one request and count its tokens, or raise ValueError / TypeError.
    Test models (gpu_workers.models.TEST_MODELS) are refused unless `test_models`."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text.strip():
        raise ValueError("text is empty or only whitespace; send some words to embed")
    if len(text) > MAX_TEXT_CHARS:
        raise RequestTooLarge(len(text), MAX_TEXT_CHARS, "character limit")
    if priority not in PRIORITIES:
        raise ValueError(f"unknown priority {priority!r}; choose one of: {', '.join(PRIORITIES)}")
    model_name = default_model if model is None else model
    spec = get_spec(model_name)  # raises ValueError naming the known models
    if spec.name in TEST_MODELS and not test_models:
        raise ValueError(
            f"model {spec.name!r} is a test model and is off here; choose {default_model!r} "
            "(operators: BATCHING_TEST_MODELS=1 turns test models on, for tests and benchmarks only)"
        )
    if deadline_s is None:
        deadline_s = policy.default_deadline_s
    if deadline_s is not None and (
        isinstance(deadline_s, bool)
        or not isinstance(deadline_s, (int, float))
        or not math.isfinite(deadline_s)
        or deadline_s <= 0
    ):
        raise ValueError(f"deadline_s must be a positive number of seconds, got {deadline_s!r}")

    tokens = spec.count_tokens(text)
    truncated = alone = False
    limit, what = min((spec.max_tokens, "model's limit"), (policy.max_batch_tokens, "batch token budget"))
    if tokens > limit:
        if policy.oversized == "truncate":
            text, tokens = spec.truncate(text, limit)
            truncated = True
        elif policy.oversized == "run_alone":
            alone = True
            # Past the model's own limit the model truncates: say so in the result.
            truncated = tokens > spec.max_tokens
        else:
            raise RequestTooLarge(tokens, limit, what)

    now = clock.now()  # Redis's clock: the collector and devices judge the deadline
    return Request(
        text=text,
        tokens=tokens,
        model=spec.name,
        priority=str(priority),
        submitted_at=now,
        deadline_at=None if deadline_s is None else now + float(deadline_s),
        truncated=truncated,
        alone=alone,
    )


@shared_task(name=REQUEST_TASK)
def request(payload: dict[str, object]) -> None:
    """The name request messages carry. The collector consumes them itself; a plain
    worker that executes one was started on the wrong queues."""
    raise RuntimeError(
        "request messages are consumed by the batch collector; do not start an ordinary worker on the requests.* queues"
    )
