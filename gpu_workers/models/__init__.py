"""Model registry: the models this system serves come from configuration.

``BATCHING_MODELS`` (settings, or the environment as JSON) maps each model's name to
the dotted path of its ``ModelSpec`` class and that class's options::

    BATCHING_MODELS = {
        "minilm": {"spec": "dynamic_batching.gpu_workers.models.minilm.MiniLMSpec"},
        "sentiment": {
            "spec": "dynamic_batching.gpu_workers.models.adapters.SequenceClassifierSpec",
            "path": "/models/sentiment",
            "max_tokens": 512,
        },
    }

``get_spec(name)`` returns a shared, cheap spec: importing this package, and counting
tokens, never imports torch; only ``ModelSpec.load`` does. The test models
(``TEST_MODELS``) join the configured ones only while ``BATCHING_TEST_MODELS`` is on.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from dynamic_batching.conf import conf

from .base import BatchRunner, ModelSpec, check_device

__all__ = ["TEST_MODELS", "BatchRunner", "ModelSpec", "check_device", "configured", "get_spec", "model_names"]

#: Models for tests and benchmarks only, refused unless BATCHING_TEST_MODELS is on:
#: synthetic's directives can fail, stall or kill a device.
TEST_MODELS: Mapping[str, Mapping[str, Any]] = {
    "synthetic": {"spec": "dynamic_batching.gpu_workers.models.synthetic.SyntheticSpec"}
}

_specs: dict[tuple[str, str], ModelSpec] = {}
_lock = threading.Lock()
#: The specs built for one value of the settings, so the edge's per-request lookup is a
#: dict read: (BATCHING_MODELS as it was, BATCHING_TEST_MODELS, name -> spec). Held by
#: identity: a test's settings override is another object and starts afresh.
_current: tuple[object, bool, dict[str, ModelSpec]] = (None, False, {})


def configured() -> dict[str, Mapping[str, Any]]:
    """Every model this process may serve: name -> {"spec": dotted path, **options}."""
    models = dict(conf.MODELS)
    if conf.TEST_MODELS:
        for name, config in TEST_MODELS.items():
            models.setdefault(name, config)
    return models


def model_names() -> list[str]:
    return sorted(configured())


def build(name: str, config: Mapping[str, Any]) -> ModelSpec:
    """A spec from its configuration, or ImproperlyConfigured naming the setting."""
    where = f"BATCHING['MODELS'][{name!r}]"
    if not isinstance(config, Mapping) or not isinstance(config.get("spec"), str):
        raise ImproperlyConfigured(f'{where} must be a mapping with "spec": the dotted path of a ModelSpec class')
    options = {k: v for k, v in config.items() if k != "spec"}
    try:
        cls = import_string(config["spec"])
    except ImportError as exc:
        raise ImproperlyConfigured(f"{where}: cannot import spec {config['spec']!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, ModelSpec)):
        raise ImproperlyConfigured(f"{where}: {config['spec']!r} is not a ModelSpec subclass")
    try:
        return cls.from_config(name, options)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"{where}: {type(exc).__name__}: {exc}") from exc


def get_spec(name: str) -> ModelSpec:
    """The shared spec for ``name``, so a tokenizer loads once per process. Raises
    ValueError naming the models there are (test models say how to turn them on)."""
    declared, test_models, built = _current
    if declared is conf.MODELS and test_models == conf.TEST_MODELS:
        spec = built.get(name) if isinstance(name, str) else None
        if spec is not None:
            return spec
    else:
        built = {}
    spec = _get_spec(name)
    _set_current(built, name, spec)
    return spec


def _set_current(built: dict[str, ModelSpec], name: str, spec: ModelSpec) -> None:
    global _current
    _current = (conf.MODELS, conf.TEST_MODELS, {**built, name: spec})


def _get_spec(name: str) -> ModelSpec:
    models = configured()
    config = models.get(name) if isinstance(name, str) else None
    if config is None:
        if isinstance(name, str) and name in TEST_MODELS:
            raise ValueError(
                f"model {name!r} is a test model and is off here; choose one of: {', '.join(sorted(models))} "
                "(operators: BATCHING_TEST_MODELS=1 turns test models on, for tests and benchmarks only)"
            )
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(sorted(models))}")
    key = (name, json.dumps(config, sort_keys=True, default=str))
    spec = _specs.get(key)
    if spec is None:
        with _lock:
            spec = _specs.get(key)
            if spec is None:
                spec = _specs[key] = build(name, config)
    return spec
