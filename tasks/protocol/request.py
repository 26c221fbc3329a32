"""A request as it crosses processes: plain JSON-safe fields, no objects."""

from __future__ import annotations

from dataclasses import asdict, dataclass


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
