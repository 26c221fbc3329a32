"""The batching policy: every knob in one frozen, validated object.

The Django admin, the collector and the in-process batcher all build a `BatchPolicy`,
so they can never disagree about what a valid policy is. Errors name the field and
the offending value, the way Ray Serve's `@serve.batch` does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

PRIORITIES: tuple[str, ...] = ("high", "normal", "low")
OVERSIZED_ACTIONS: tuple[str, ...] = ("reject", "truncate", "run_alone")
#: How the slow lane takes devices (tasks/core/slowlane.py).
SLOW_LANE_POLICIES: tuple[str, ...] = ("share", "idle")
#: The limits a model may set for itself (BatchPolicy.per_model).
MODEL_LIMITS: tuple[str, ...] = ("max_batch_size", "max_batch_tokens", "max_wait_ms")


def _default_weights() -> dict[str, int]:
    return {"high": 6, "normal": 3, "low": 1}


def _default_caps() -> dict[str, int]:
    return {"high": 2000, "normal": 2000, "low": 2000}


@dataclass(frozen=True)
class BatchPolicy:
    #: Most requests in one batch.
    max_batch_size: int = 32
    #: Most *padded* tokens in one batch: batch size x its longest request, because that
    #: is what the device computes. A request that alone exceeds it is oversized.
    max_batch_tokens: int = 8192
    #: How long the oldest request may wait for batch-mates while a device is free.
    #: 0 dispatches at once to a free device and batches only while devices are busy.
    max_wait_ms: float = 0.0
    #: Token shares under overload: each backlogged tier is guaranteed
    #: weight / sum(weights) of the tokens served.
    weights: dict[str, int] = field(default_factory=_default_weights)
    #: A request that has waited this long is served before fresher requests of any tier.
    aging_ms: float = 2000.0
    #: Most requests waiting per tier (broker and collector together); past it, submit
    #: raises Overloaded.
    queue_caps: dict[str, int] = field(default_factory=_default_caps)
    #: What happens to a request longer than the model's limit or the token budget.
    oversized: str = "reject"
    #: Deadline for requests that set none, in seconds; None means no deadline. Finite
    #: by default, so a caller blocked on `.get()` with no timeout is always answered.
    default_deadline_s: float | None = 300.0
    #: When inputs known to be slow may take a device (tasks/core/slowlane.py): "idle",
    #: only while nobody else waits; "share", also while others wait, up to
    #: `slow_lane_share` of the device time.
    slow_lane: str = "share"
    #: The most device time the slow lane takes while other requests wait, (0, 1].
    slow_lane_share: float = 0.2
    #: Per-model batch limits over the ones above: model name -> any of
    #: max_batch_size, max_batch_tokens, max_wait_ms. A 7B classifier and MiniLM need
    #: different batches; a batch never mixes models.
    per_model: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Bumped on every saved change, so a running collector can tell it is behind.
    version: int = 0

    def __post_init__(self) -> None:
        _check_int("max_batch_size", self.max_batch_size, 1)
        _check_int("max_batch_tokens", self.max_batch_tokens, 1)
        _check_number("max_wait_ms", self.max_wait_ms, 0.0)
        _check_number("aging_ms", self.aging_ms, 1.0)
        _check_tiers("weights", self.weights, 1)
        _check_tiers("queue_caps", self.queue_caps, 1)
        if self.oversized not in OVERSIZED_ACTIONS:
            raise ValueError(f"oversized must be one of {', '.join(OVERSIZED_ACTIONS)}, got {self.oversized!r}")
        if self.default_deadline_s is not None:
            _check_number("default_deadline_s", self.default_deadline_s, 0.001)
        _check_int("version", self.version, 0)
        if self.slow_lane not in SLOW_LANE_POLICIES:
            raise ValueError(f"slow_lane must be one of {', '.join(SLOW_LANE_POLICIES)}, got {self.slow_lane!r}")
        _check_number("slow_lane_share", self.slow_lane_share, 0.01)
        if self.slow_lane_share > 1:
            raise ValueError(f"slow_lane_share must be a fraction in (0, 1], got {self.slow_lane_share}")
        if not isinstance(self.per_model, dict):
            raise ValueError(f"per_model must map model names to limits, got {self.per_model!r}")
        for model, limits in self.per_model.items():
            if not isinstance(limits, dict) or set(limits) - set(MODEL_LIMITS):
                raise ValueError(f"per_model[{model}] must set only {', '.join(MODEL_LIMITS)}, got {limits!r}")
            try:
                replace(self, per_model={}, **limits)  # the same checks as the policy's own
            except ValueError as exc:
                raise ValueError(f"per_model[{model}]: {exc}") from None
        # Copies, so a caller's dict mutated later cannot change a frozen policy.
        object.__setattr__(self, "weights", dict(self.weights))
        object.__setattr__(self, "queue_caps", dict(self.queue_caps))
        object.__setattr__(self, "per_model", {m: dict(v) for m, v in self.per_model.items()})

    @property
    def max_wait_s(self) -> float:
        return self.max_wait_ms / 1000.0

    @property
    def aging_s(self) -> float:
        return self.aging_ms / 1000.0

    def for_model(self, model: str) -> BatchPolicy:
        """This policy with `model`'s own batch limits, if it has any."""
        limits = self.per_model.get(model)
        return replace(self, **limits) if limits else self

    def share(self, priority: str) -> float:
        """The fraction of served tokens this tier is guaranteed while it is backlogged."""
        return self.weights[priority] / sum(self.weights.values())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchPolicy:
        """Build from JSON-safe data, ignoring keys this version does not know."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def evolve(self, **changes: Any) -> BatchPolicy:
        return replace(self, **changes)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")


def _check_number(name: str, value: object, minimum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be a finite number >= {minimum}, got {value}")


def _check_tiers(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, dict) or set(value) != set(PRIORITIES):
        raise ValueError(f"{name} must give a value for each of {', '.join(PRIORITIES)}, got {value!r}")
    for tier, v in value.items():
        _check_int(f"{name}[{tier}]", v, minimum)
