"""Every setting the batching app reads, in one namespace: `conf.NAME`.

A host project sets any of them in one dict, and leaves the rest to their defaults::

    BATCHING = {"REDIS_URL": "redis://10.0.0.5:6379/2", "DEFAULT_MODEL": "minilm"}

and each can be overridden, without touching code, by the environment variable of the
same name with `BATCHING_` in front (`BATCHING_VISIBILITY_TIMEOUT_S=60`), which wins
over the dict. Nothing here is written into the host's settings: a reusable app never
changes a setting that belongs to the host (Django REST framework's `api_settings`
reads `REST_FRAMEWORK` the same way). A value out of range stops the process, naming
the environment variable and the key. docs/configuration.md lists every key.

Why not django-environ's `Env` straight into module globals, as before: those globals
were meant for `import *` into the host's settings, and the names disagreed with the
variables (`REQUEST_EVENTS` was read into `BATCHING_REQUEST_EVENTS`).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

#: The host's settings dict, and the prefix of each key's environment variable.
SETTING = "BATCHING"
ENV_PREFIX = "BATCHING_"


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _bool_or_auto(text: str) -> bool | None:
    return None if text.strip().lower() == "auto" else _bool(text)


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _pairs(text: str) -> dict[str, float]:
    """ "rate_per_s=50,burst=200" -> {"rate_per_s": 50.0, "burst": 200.0}"""
    out = {}
    for part in _list(text):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"expected key=value, got {part!r}")
        out[key.strip()] = float(value)
    return out


@dataclass(frozen=True)
class Key:
    #: The value, or a function of the values read before it (a derived default).
    default: Any
    #: Reads the environment variable's text.
    parse: Callable[[str], Any]
    #: (is the value valid, given all values so far?, what it must be)
    rule: tuple[Callable[[Any, Mapping[str, Any]], bool], str] | None = None


def _positive(v: Any, _: Mapping[str, Any]) -> bool:
    return v > 0


def _at_least(n: float) -> Callable[[Any, Mapping[str, Any]], bool]:
    return lambda v, _: v >= n


#: Every key, in the order they are read (a derived default reads those above it).
#: The comments are the documentation: docs/configuration.md repeats them, and
#: tests/unit/conf/test_conf.py checks that it names every key.
KEYS: dict[str, Key] = {
    # --- Broker and results ----------------------------------------------------------
    #: The Redis (or Valkey) that holds the batching queues, answers and shared state.
    #: The host's Celery broker and result backend must be the same server and database
    #: (system check batching.E020).
    "REDIS_URL": Key("redis://127.0.0.1:6379/0", str),
    #: The host's Celery app, by dotted path: batching sends through it, and its result
    #: backend is where callers read answers. `configure(app)` must have been called on it.
    "CELERY_APP": Key("", str),
    #: Seconds an answer lives in Redis for its caller to fetch.
    "RESULT_EXPIRES_S": Key(3600, int, (_positive, "a positive number of seconds")),
    #: An unacked batch message (a batch a device runs) goes back to its queue this long
    #: after its device vanished (applied to the batching workers' own connections only).
    "VISIBILITY_TIMEOUT_S": Key(30, int, (_positive, "a positive number of seconds")),
    #: An accepted request untouched this long, waiting nowhere, is queued again.
    "LEDGER_GRACE_S": Key(
        lambda v: 2 * v["VISIBILITY_TIMEOUT_S"] + 10,
        float,
        (lambda g, v: g > v["VISIBILITY_TIMEOUT_S"], "more than VISIBILITY_TIMEOUT_S"),
    ),
    #: How often a lost request is queued again before it is answered with RequestLost.
    "LEDGER_ATTEMPTS": Key(3, int, (_at_least(1), "at least 1")),
    #: Flower shows a request as "sent" the moment it is queued.
    "TASK_SENT_EVENTS": Key(True, _bool),
    #: Flower shows every request as a task of its own; off, the batch tasks only.
    "REQUEST_EVENTS": Key(True, _bool),
    # --- Models ------------------------------------------------------------------------
    #: Devices one worker each: "cuda:0,cuda:1" or "cpu:0,cpu:1"; empty: every CUDA device.
    "DEVICES": Key([], _list),
    #: name -> {"spec": dotted path of a ModelSpec class, its options...} (JSON in the env).
    "MODELS": Key({"minilm": {"spec": "dynamic_batching.gpu_workers.models.minilm.MiniLMSpec"}}, json.loads),
    #: The model a request gets when it names none; one of MODELS (system check batching.E011).
    "DEFAULT_MODEL": Key("minilm", str),
    #: The test model `synthetic` and its directives: tests and benchmarks only.
    "TEST_MODELS": Key(False, _bool),
    # --- Who may submit, and how much ------------------------------------------------------
    #: Visitors who are not logged in may submit, ANONYMOUS_QUOTA per client address.
    "OPEN_DEMO": Key(False, _bool),
    #: A logged-in user's quota unless the admin sets one: "rate_per_s=50,burst=200,...".
    "DEFAULT_QUOTA": Key({}, _pairs),
    #: What anonymous demo visitors from one client address share (each address its own).
    "ANONYMOUS_QUOTA": Key(
        {"rate_per_s": 2.0, "burst": 10, "max_in_flight": 20, "tier_share": 0.05, "max_priority": "low"}, _pairs
    ),
    #: Days an API token works unless `create_api_token --expires-days` says otherwise; 0: never expires.
    "API_TOKEN_DEFAULT_EXPIRY_DAYS": Key(90, int, (_at_least(0), "0 or more")),
    # --- The dashboard and its SLO panel ---------------------------------------------------
    #: Where the dashboard links to Flower; empty: no link.
    "FLOWER_URL": Key("", str),
    #: p99 wait before dispatch per tier, in ms, over the last minute: "high=250,normal=1000,low=5000".
    "SLO_P99_WAIT_MS": Key({"high": 250.0, "normal": 1000.0, "low": 5000.0}, _pairs),
    #: Most (failed + expired) / finished requests.
    "SLO_ERROR_RATE": Key(0.01, float, (_at_least(0), "0 or more")),
    #: Most rejected (Overloaded) / offered requests.
    "SLO_REJECT_RATE": Key(0.05, float, (_at_least(0), "0 or more")),
    #: Fewest live device workers.
    "SLO_MIN_DEVICES": Key(1, int, (_at_least(0), "0 or more")),
    # --- The collector -------------------------------------------------------------------
    #: Weigh a request's padding against a second batch's learned fixed cost.
    "COST_PACKING": Key(True, _bool),
    #: Requests the collector holds per tier before it stops taking from that queue.
    "COLLECTOR_WINDOW": Key(256, int, (_at_least(1), "at least 1")),
    #: Batches queued per device beyond the one it runs, each sent as the device is about to free.
    #: On a fast accelerator, 2 (bench/accelerator.py's overlap-ahead2).
    "COLLECTOR_BATCHES_AHEAD": Key(1, int, (_at_least(0), "0 or more")),
    #: Off: a batch ahead leaves as soon as there is room for it (a benchmark's baseline).
    "COLLECTOR_AHEAD_TIMED": Key(True, _bool),
    #: "pull" (the design) or "push" (bench/devices_bench.py's baseline only).
    "COLLECTOR_DISPATCH": Key("pull", str, (lambda v, _: v in ("pull", "push"), '"pull" or "push"')),
    #: A standby collector takes over this long after the active one dies.
    "COLLECTOR_LEASE_S": Key(2.0, float, (_at_least(1), "at least 1 second")),
    #: Tests only: pretend this process's clock is off by this many seconds.
    "CLOCK_SKEW_S": Key(0.0, float),
    # --- Device workers --------------------------------------------------------------------
    #: A device worker holds the batch on its device and each batch sent ahead
    #: (COLLECTOR_BATCHES_AHEAD, at least one), in a thread each: those are prepared, or
    #: write their answers, while it runs. None ("auto"): on where the device runs beside
    #: the host (an accelerator), off on a CPU device (gpu_workers/worker.py::overlaps).
    "DEVICE_OVERLAP": Key(None, _bool_or_auto),
    #: With DEVICE_OVERLAP, how long a thread may hold the GIL while the other waits for
    #: it (sys.setswitchinterval): the batch taking the device waits at most this long
    #: for the one writing its answers.
    "DEVICE_SWITCH_INTERVAL_MS": Key(0.5, float, (_positive, "a positive number of milliseconds")),
    #: Device failures in a row that open a device's circuit, and how long it stays open.
    "CIRCUIT_THRESHOLD": Key(3, int, (_at_least(1), "at least 1")),
    "CIRCUIT_COOLDOWN_S": Key(30.0, float, (_positive, "a positive number of seconds")),
    #: A batch handed back this many times runs anyway.
    "MAX_BOUNCES": Key(8, int, (_at_least(0), "0 or more")),
    #: A lone request whose batch came back this many times is answered WorkerCrashed.
    "POISON_REDELIVERIES": Key(2, int, (_at_least(1), "at least 1")),
    #: Off: no learned time limit, no slow lane (a benchmark baseline).
    "SLOW_ISOLATION": Key(True, _bool),
    #: A batch is cut off after SLOW_FACTOR times its expected time, never before SLOW_FLOOR_S.
    "SLOW_FACTOR": Key(2.0, float, (lambda v, _: v > 1, "over 1")),
    #: A slow input is confirmed only if, alone, it is this many times slower than a batch-mate.
    "SLOW_CONFIRM_FACTOR": Key(4.0, float, (lambda v, _: v > 1, "over 1")),
    "SLOW_FLOOR_S": Key(0.02, float, (_positive, "a positive number of seconds")),
    #: Let waiting batches run between the layers of a slow one.
    "PREEMPTION": Key(True, _bool),
    "PREEMPT_AFTER": Key(2.0, float, (_at_least(0), "0 or more (times the expected batch time)")),
    #: One time bound for a whole batch; by default 20 s, or 2/3 of a shorter visibility timeout.
    "BATCH_HARD_LIMIT_S": Key(
        lambda v: min(20.0, v["VISIBILITY_TIMEOUT_S"] * 2 / 3), float, (_positive, "a positive number of seconds")
    ),
    #: A model call this long past its hard limit is hung: the worker hands back and exits.
    "HANG_GRACE_S": Key(
        lambda v: min(2.0, v["VISIBILITY_TIMEOUT_S"] / 6), float, (_positive, "a positive number of seconds")
    ),
}


def env_name(key: str) -> str:
    return ENV_PREFIX + key


def read(given: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Every key's value: the environment variable, else the dict, else the default.
    Raises ImproperlyConfigured naming the variable for a value out of range."""
    unknown = sorted(set(given) - set(KEYS))
    if unknown:
        raise ImproperlyConfigured(f"{SETTING} has unknown keys {unknown}: see docs/configuration.md for the names")
    values: dict[str, Any] = {}
    for name, key in KEYS.items():
        variable = env_name(name)
        if variable in environ:
            try:
                value = key.parse(environ[variable])
            except ValueError as exc:
                raise ImproperlyConfigured(f"{variable} cannot be read: {exc}") from None
        elif name in given:
            value = given[name]
        else:
            value = key.default(values) if callable(key.default) else key.default
        if key.rule is not None and not key.rule[0](value, values):
            raise ImproperlyConfigured(f"{variable} ({SETTING}[{name!r}]) must be {key.rule[1]}, got {value!r}")
        values[name] = value
    return values


class BatchingSettings:
    """`conf.NAME`, read once per process and again whenever Django's `BATCHING` setting
    changes (tests' `settings` fixture), with overrides of its own for a process that
    points itself at another system (`dynamic_batching.store.connection.connect`)."""

    def __init__(self) -> None:
        self._values: dict[str, Any] | None = None
        self._overrides: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _load(self) -> dict[str, Any]:
        values = self._values
        if values is None:
            from django.conf import settings

            with self._lock:
                values = self._values = read(getattr(settings, SETTING, {}) or {}, os.environ)
        return values

    def __getattr__(self, name: str) -> Any:
        if name not in KEYS:
            raise AttributeError(f"no batching setting {name!r}: see docs/configuration.md")
        if name in self._overrides:
            return self._overrides[name]
        return self._load()[name]

    def values(self) -> dict[str, Any]:
        """Every key as read from the settings and the environment (this process's own
        overrides aside), validated: ImproperlyConfigured for a value out of range."""
        return dict(self._load())

    def reload(self) -> None:
        self._values = None

    def set(self, **values: Any) -> None:
        """Override keys in this process, above the environment and the dict."""
        for name in values:
            if name not in KEYS:
                raise AttributeError(f"no batching setting {name!r}")
        self._overrides.update(values)

    @contextmanager
    def override(self, **values: Any) -> Iterator[None]:
        before = dict(self._overrides)
        self.set(**values)
        try:
            yield
        finally:
            self._overrides = before


conf = BatchingSettings()


def _changed(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING:
        conf.reload()


setting_changed.connect(_changed)
