"""A deterministic stand-in model for tests and benchmarks.

It behaves like a padded GPU batch without needing one:

* Tokens: ``len(text.split()) + 2`` (the +2 mimics [CLS]/[SEP]);
  ``max_tokens`` is 512. ``truncate`` keeps the first ``n - 2`` words.
* Cost: ``run_batch`` sleeps (releasing the GIL, as a GPU kernel would) for::

      slowdown * (overhead_s + padded_tokens * per_token_s)
      padded_tokens = len(texts) * max(cost(t) for t in texts)
      cost(t) = count_tokens(t) * (20 if "!slow" in t else 1)

  so one long text makes every batch-mate pay its length, as real padding does.
* Knobs (read from the environment at ``load()`` time, so one process can load
  runners that differ):

  ``SYNTHETIC_OVERHEAD_S``   fixed cost per batch, default 0.002
  ``SYNTHETIC_PER_TOKEN_S``  cost per padded token, default 0.0002
  ``SYNTHETIC_SLOWDOWN``     device speed factor applied to the whole time,
                             default 1.0 (e.g. 2.0 for a device half as fast)
  ``SYNTHETIC_BROKEN``       1 makes every batch raise :class:`DeviceFault`, like a
                             device with a CUDA error (for circuit-breaker tests)

* Markers in a text:

  ``!slow``  its cost counts 20x (a pathological input that dominates a batch)
  ``!fail``  the whole batch raises :class:`PoisonInput` before any sleeping,
             like an input that crashes the kernel; upstream must isolate it.
  ``!hang``  the call blocks inside a C function (libc ``sleep``) for an hour, like a
             kernel that never returns: no exception can interrupt it.
  ``!crash`` the worker process dies at once (SIGKILL to itself), like an input that
             segfaults the model or gets it killed for memory; only redelivery and
             splitting across worker restarts can isolate it.

* Output: 8 floats derived from sha256 of the text alone, L2-normalised, so a
  text's answer never depends on its batch-mates or device.

The sleep function is injectable (``SyntheticSpec(sleep=...)`` or
``SyntheticRunner(..., sleep=...)``) so tests can record costs without sleeping.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import signal
import struct
import threading
import time
from collections.abc import Callable, Sequence

from .base import BatchRunner, ModelSpec, check_device

__all__ = [
    "DEFAULT_OVERHEAD_S",
    "DEFAULT_PER_TOKEN_S",
    "CRASH_MARKER",
    "DIM",
    "DeviceFault",
    "FAIL_MARKER",
    "HANG_MARKER",
    "SLOW_FACTOR",
    "SLOW_MARKER",
    "PoisonInput",
    "SyntheticRunner",
    "SyntheticSpec",
    "embed",
]

DIM = 8
MAX_TOKENS = 512
DEFAULT_OVERHEAD_S = 0.002
DEFAULT_PER_TOKEN_S = 0.0002
SLOW_MARKER = "!slow"
FAIL_MARKER = "!fail"
CRASH_MARKER = "!crash"
HANG_MARKER = "!hang"
SLOW_FACTOR = 20
_SPECIAL_TOKENS = 2

Sleep = Callable[[float], object]


class DeviceFault(RuntimeError):
    """The (simulated) device itself is broken: every batch fails, whatever its inputs."""


class PoisonInput(ValueError):
    """Raised for a whole batch when one of its texts contains ``!fail``."""


def _count(text: str) -> int:
    return len(text.split()) + _SPECIAL_TOKENS


def cost(text: str) -> int:
    """Padded-token cost of one text: its token count, 20x if marked ``!slow``."""
    n = _count(text)
    return n * SLOW_FACTOR if SLOW_MARKER in text else n


def embed(text: str) -> list[float]:
    """The deterministic, unit-norm output for ``text``."""
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    # 8 signed 16-bit ints from the first 16 bytes, centred on zero.
    raw = [(v + 0.5) for v in struct.unpack(">8h", digest[: 2 * DIM])]
    # +0.5 keeps every component non-zero, so the norm can never be zero.
    norm = math.sqrt(sum(v * v for v in raw))
    return [v / norm for v in raw]


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    value = float(raw)
    if value < 0 or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number >= 0, got {raw!r}")
    return value


class SyntheticSpec(ModelSpec):
    name = "synthetic"
    max_tokens = MAX_TOKENS

    def __init__(self, sleep: Sleep = time.sleep) -> None:
        self._sleep = sleep

    def count_tokens(self, text: str) -> int:
        return _count(text)

    def truncate(self, text: str, max_tokens: int) -> tuple[str, int]:
        if max_tokens < _SPECIAL_TOKENS:
            raise ValueError(f"max_tokens must be >= {_SPECIAL_TOKENS}, got {max_tokens}")
        words = text.split()
        if len(words) + _SPECIAL_TOKENS <= max_tokens:
            return text, len(words) + _SPECIAL_TOKENS
        cut = " ".join(words[: max_tokens - _SPECIAL_TOKENS])
        return cut, _count(cut)

    def load(self, device: str) -> SyntheticRunner:
        return SyntheticRunner(
            device,
            overhead_s=_env_float("SYNTHETIC_OVERHEAD_S", DEFAULT_OVERHEAD_S),
            per_token_s=_env_float("SYNTHETIC_PER_TOKEN_S", DEFAULT_PER_TOKEN_S),
            slowdown=_env_float("SYNTHETIC_SLOWDOWN", 1.0),
            broken=os.environ.get("SYNTHETIC_BROKEN", "") == "1",
            sleep=self._sleep,
        )


#: Longest uninterrupted sleep inside one batch.
SLICE_S = 0.005


class SyntheticRunner(BatchRunner):
    def __init__(
        self,
        device: str,
        *,
        overhead_s: float = DEFAULT_OVERHEAD_S,
        per_token_s: float = DEFAULT_PER_TOKEN_S,
        slowdown: float = 1.0,
        broken: bool = False,
        sleep: Sleep = time.sleep,
    ) -> None:
        self.device = check_device(device)
        self.broken = broken
        self.overhead_s = overhead_s
        self.per_token_s = per_token_s
        self.slowdown = slowdown
        self._sleep = sleep
        self._closed = False
        # A real device runs one batch at a time; concurrent callers queue.
        self.device_lock = threading.RLock()

    def batch_seconds(self, texts: Sequence[str]) -> float:
        """How long ``run_batch(texts)`` sleeps."""
        if not texts:
            return 0.0
        padded_tokens = len(texts) * max(cost(t) for t in texts)
        return self.slowdown * (self.overhead_s + padded_tokens * self.per_token_s)

    def run_batch(self, texts: Sequence[str]) -> list[list[float]]:
        if self._closed:
            raise RuntimeError(f"synthetic runner on {self.device} is closed")
        if not texts:
            return []
        if self.broken:
            raise DeviceFault(f"simulated device failure on {self.device} (SYNTHETIC_BROKEN=1)")
        for text in texts:
            if CRASH_MARKER in text:
                os.kill(os.getpid(), signal.SIGKILL)
            if HANG_MARKER in text:
                ctypes.CDLL(None).sleep(3600)
            if FAIL_MARKER in text:
                raise PoisonInput(f"synthetic model refuses input containing {FAIL_MARKER}: {text[:40]!r}")
        total = seconds = self.batch_seconds(texts)
        with self.device_lock:
            # In slices, like a model running layer by layer: a watchdog that interrupts
            # a batch gets control back within one slice, as it would between layers, and
            # hears how far it has got.
            while seconds > 0:
                step = min(seconds, SLICE_S)
                self._sleep(step)
                seconds -= step
                if seconds > 0:
                    self.step(done=1 - seconds / total)
        return [embed(t) for t in texts]

    def close(self) -> None:
        self._closed = True

    def __repr__(self) -> str:
        return f"<SyntheticRunner {self.device} slowdown={self.slowdown}>"
