"""The edge: what a request must be before it is accepted, and the message it becomes.

`accept()` is the one place that validates a request and counts its tokens. The client
API and the HTTP views both call it, so a bad request fails the same way everywhere,
with ValueError or TypeError, before anything is enqueued.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

from batching_site.celery import REQUEST_TASK, app
from gpu_workers.models import get_spec

from .core.policy import PRIORITIES, BatchPolicy
from .errors import RequestTooLarge

#: Longer texts are refused before tokenizing: counting megabytes of text would let one
#: caller stall the edge. The model sees at most a few hundred tokens anyway.
MAX_TEXT_CHARS = 100_000


@dataclass(frozen=True, slots=True)
class Request:
    """A request as it crosses processes: plain JSON-safe fields, no objects."""

    text: str
    tokens: int
    model: str
    priority: str
    #: Wall-clock seconds (time.time()) when the edge accepted it.
    submitted_at: float
    #: Wall-clock seconds after which it must not be dispatched; None for no deadline.
    deadline_at: float | None = None
    #: The edge cut the text to fit (the `truncate` oversized policy).
    truncated: bool = False
    #: It runs in a batch of its own (the `run_alone` oversized policy).
    alone: bool = False

    def to_message(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_message(cls, data: dict[str, object]) -> Request:
        return cls(**data)  # type: ignore[arg-type]


def accept(
    text: object,
    *,
    priority: object = "normal",
    model: object = None,
    deadline_s: object = None,
    policy: BatchPolicy,
    default_model: str,
) -> Request:
    """Validate one request and count its tokens, or raise ValueError / TypeError."""
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

    now = time.time()
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


@app.task(name=REQUEST_TASK)
def request(payload: dict[str, object]) -> None:
    """The name request messages carry. The collector consumes them itself; a plain
    worker that executes one was started on the wrong queues."""
    raise RuntimeError(
        "request messages are consumed by the batch collector; do not start an ordinary worker on the requests.* queues"
    )
