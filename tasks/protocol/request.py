"""A request as it crosses processes: plain JSON-safe fields, no objects."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class Request:
    """A request as it crosses processes: plain JSON-safe fields, no objects."""

    #: One input as its model takes it (ModelSpec.input_type): a text, a pair, ... any JSON.
    input: object
    tokens: int
    model: str
    priority: str
    #: When the edge accepted it, by Redis's clock (tasks/store/clock.py).
    submitted_at: float
    #: Wall-clock seconds after which it must not be dispatched; None for no deadline.
    deadline_at: float | None = None
    #: The edge cut the text to fit (the `truncate` oversized policy).
    truncated: bool = False
    #: It runs in a batch of its own (the `run_alone` oversized policy).
    alone: bool = False
    #: The Celery follow-ups it was sent with (`link`, a chain, a chord: tasks/protocol/
    #: canvas.py); left out of the message when there are none.
    celery: dict[str, object] | None = None

    def to_message(self) -> dict[str, object]:
        # Not dataclasses.asdict, which deep-copies the input only to have it serialized.
        out = {name: getattr(self, name) for name in _FIELDS}
        if self.celery is None:
            del out["celery"]
        return out

    @classmethod
    def from_message(cls, data: dict[str, object]) -> Request:
        """The request a message carries. Raises ValueError or TypeError naming the
        field when the message was not written by the edge."""
        request = cls(**data)  # type: ignore[arg-type]
        number = (int, float)
        checks = {
            "input": request.input is not None,
            "tokens": isinstance(request.tokens, int) and not isinstance(request.tokens, bool) and request.tokens > 0,
            "model": isinstance(request.model, str),
            "priority": isinstance(request.priority, str),
            "submitted_at": isinstance(request.submitted_at, number) and math.isfinite(request.submitted_at),
            "deadline_at": request.deadline_at is None
            or (isinstance(request.deadline_at, number) and math.isfinite(request.deadline_at)),
            "truncated": isinstance(request.truncated, bool),
            "alone": isinstance(request.alone, bool),
            "celery": request.celery is None or isinstance(request.celery, dict),
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"request field(s) of the wrong type or range: {', '.join(bad)}")
        return request


_FIELDS = tuple(f.name for f in fields(Request))
