"""Model registry: ``get_spec(name)`` returns a shared, cheap ``ModelSpec``.

Importing this package (and counting tokens) never imports torch or
sentence-transformers; only ``ModelSpec.load`` does.
"""

from __future__ import annotations

import threading

from .base import BatchRunner, ModelSpec, check_device

__all__ = ["MODEL_NAMES", "TEST_MODELS", "BatchRunner", "ModelSpec", "check_device", "get_spec"]

MODEL_NAMES: tuple[str, ...] = ("minilm", "synthetic")
#: Models for tests and benchmarks only: the edge refuses them unless
#: BATCHING_TEST_MODELS is on (synthetic's directives can fail, stall or kill a device).
TEST_MODELS: frozenset[str] = frozenset({"synthetic"})

_specs: dict[str, ModelSpec] = {}
_lock = threading.Lock()


def _make(name: str) -> ModelSpec:
    # Imported here so a process that only ever uses one model does not pay for the other.
    if name == "minilm":
        from .minilm import MiniLMSpec

        return MiniLMSpec()
    from .synthetic import SyntheticSpec

    return SyntheticSpec()


def get_spec(name: str) -> ModelSpec:
    """The singleton spec for ``name``; shared so the tokenizer loads once per process."""
    if not isinstance(name, str) or name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODEL_NAMES)}")
    spec = _specs.get(name)
    if spec is None:
        with _lock:
            spec = _specs.get(name)
            if spec is None:
                spec = _specs[name] = _make(name)
    return spec
