"""An emulated accelerator: a device whose batches cost what a datacenter GPU's would,
to measure how busy the serving path keeps a fast device on a machine without one
(issue 40; docs/benchmarks.md, "What batching buys on an accelerator (emulated)").

    BATCHING["MODELS"]["minilm-gpu"] = {
        "spec": "dynamic_batching.gpu_workers.models.emulated.EmulatedAcceleratorSpec",
        "of": "minilm",
    }

Options:

- ``of``: a configured model whose token counting, input checks and answer shape it
  keeps, so the edge, the collector and the device do the real work: the edge counts
  the real tokens, the device counts them again for the batch (as the real runner
  tokenizes it), and every answer is ``dim`` floats (384 for MiniLM), unit length,
  derived from the input alone, rounded as MiniLM's are.
- ``overhead_ms`` and ``per_token_us``: a batch runs for ``overhead_ms + per_token_us
  x padded tokens`` (padded tokens: the batch's size times its longest input), a wait
  that releases the GIL, in slices between which the batch can yield
  (``BatchRunner.step``), one batch at a time per device (under its device lock), like
  one CUDA stream. The device's time runs on while the host's thread wakes late from a
  slice, so a batch takes its cost, not its cost plus every slice's oversleep. The
  host's share (counting the tokens, building the answers) is done in ``prepare``, off
  the device, as a real runner's tokenizing and collating would be.
- ``dim``: the answer's length, 384 by default.

**The defaults** (2 ms a batch, 4 us a padded token) are calibrated to a published
figure: sentence-transformers lists all-MiniLM-L6-v2 at 14,200 sentences a second on
one V100 GPU (https://www.sbert.net/docs/sentence_transformer/pretrained_models.html,
"Speed"). At batches of 32 sentences of about 16 padded tokens, 2 ms + 32 x 16 x 4 us
= 4.05 ms a batch, 7,900 sentences a second; at 128 of them, 10.2 ms, 12,500 a
second: the published figure's order, from a fixed cost per call and a cost per token.

**Busy time.** The runner adds up the time its device is busy (the waits), so the
device worker's heartbeat reports a duty cycle read from the device, not inferred
(`device_busy_s`).
"""

from __future__ import annotations

import hashlib
import math
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

from .base import BatchRunner, ModelSpec, check_device

__all__ = ["DEFAULT_OVERHEAD_MS", "DEFAULT_PER_TOKEN_US", "EmulatedAcceleratorRunner", "EmulatedAcceleratorSpec"]

DEFAULT_OVERHEAD_MS = 2.0
DEFAULT_PER_TOKEN_US = 4.0
DEFAULT_DIM = 384
#: Longest uninterrupted wait inside one batch: the batch may yield between slices.
SLICE_S = 0.005
#: Device time left under this is no time: what a clock's rounding leaves of a slice.
DONE_WITHIN_S = 1e-6
#: Inputs prepared and not yet run are forgotten past this many.
MAX_PREPARED = 4096
#: Decimals of each answer component (as MiniLM's answers).
DECIMALS = 8


def answer(value: Any, dim: int) -> list[float]:
    """A unit vector of `dim` floats from the input alone: the same input always gets
    the same answer, whatever its batch."""
    text = value if isinstance(value, str) else repr(value)
    raw = hashlib.shake_256(text.encode("utf-8", "surrogatepass")).digest(2 * dim)
    components = [v + 0.5 for v in struct.unpack(f">{dim}h", raw)]
    norm = math.sqrt(sum(c * c for c in components))
    return [round(c / norm, DECIMALS) for c in components]


class EmulatedAcceleratorSpec(ModelSpec):
    output_description = "A unit vector of `dim` floats (an emulated device's answer)."

    def __init__(
        self,
        *,
        of: str,
        overhead_ms: float = DEFAULT_OVERHEAD_MS,
        per_token_us: float = DEFAULT_PER_TOKEN_US,
        dim: int = DEFAULT_DIM,
    ) -> None:
        for label, value in (("overhead_ms", overhead_ms), ("per_token_us", per_token_us)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{label} must be a finite number >= 0, got {value!r}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a whole number >= 1, got {dim!r}")
        if not isinstance(of, str) or not of:
            raise ValueError("of must name a configured model whose tokens and inputs this one keeps")
        self.of = of
        self.overhead_s = overhead_ms / 1000
        self.per_token_s = per_token_us / 1e6
        self.dim = dim

    @classmethod
    def from_config(cls, name: str, options: Mapping[str, Any]) -> Self:
        spec = super().from_config(name, options)
        if spec.of == name:
            raise ValueError("of must name another model, not this one")
        return spec

    @property
    def real(self) -> ModelSpec:
        from . import get_spec

        return get_spec(self.of)

    @property
    def max_tokens(self) -> int:  # type: ignore[override]
        return self.real.max_tokens

    def validate_input(self, value: object) -> Any:
        return self.real.validate_input(value)

    def count_tokens(self, value: Any) -> int:
        return self.real.count_tokens(value)

    def truncate(self, value: Any, max_tokens: int) -> tuple[Any, int]:
        return self.real.truncate(value, max_tokens)

    def describe(self, value: Any, limit: int = 60) -> str:
        return self.real.describe(value, limit)

    def runs_beside_the_host(self, device: str) -> bool:
        """An accelerator, whatever device name it is given."""
        return True

    def load(self, device: str) -> EmulatedAcceleratorRunner:
        return EmulatedAcceleratorRunner(
            device, self.real, overhead_s=self.overhead_s, per_token_s=self.per_token_s, dim=self.dim
        )


class EmulatedAcceleratorRunner(BatchRunner):
    def __init__(
        self,
        device: str,
        real: ModelSpec,
        *,
        overhead_s: float,
        per_token_s: float,
        dim: int = DEFAULT_DIM,
        wait: Callable[[float], object] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.device = check_device(device)
        self.real = real
        self.overhead_s = overhead_s
        self.per_token_s = per_token_s
        self.dim = dim
        self._wait = wait
        self._clock = clock
        #: Seconds this device has been busy running batches, ever.
        self.device_busy_s = 0.0
        self.device_lock = threading.RLock()
        self._closed = False
        #: id(input) -> (input, tokens, answer), from `prepare`.
        self._prepared: dict[int, tuple[Any, int, list[float]]] = {}

    @property
    def runs_beside_the_host(self) -> bool:
        """An accelerator, whatever device name it is given."""
        return True

    def batch_seconds(self, padded_tokens: int) -> float:
        """How long the device is busy with a batch of `padded_tokens`."""
        return self.overhead_s + padded_tokens * self.per_token_s if padded_tokens else 0.0

    def prepare(self, inputs: Sequence[Any]) -> None:
        """The host's share, off the device: tokenize each input (as the real runner
        does) and build its answer (as the real runner turns the device's output into
        floats). Kept per input object until `run_batch` uses it."""
        if len(self._prepared) > MAX_PREPARED:
            self._prepared.clear()  # prepared for batches that never ran (bounced, handed back)
        for x in inputs:
            self._prepared[id(x)] = (x, self.real.count_tokens(x), answer(x, self.dim))

    def _host_share(self, x: Any) -> tuple[int, list[float]]:
        kept = self._prepared.pop(id(x), None)
        if kept is not None and kept[0] is x:
            return kept[1], kept[2]
        return self.real.count_tokens(x), answer(x, self.dim)

    def run_batch(self, inputs: Sequence[Any]) -> list[list[float]]:
        if self._closed:
            raise RuntimeError(f"emulated runner on {self.device} is closed")
        if not inputs:
            return []
        shares = [self._host_share(x) for x in inputs]
        padded = len(inputs) * max(tokens for tokens, _ in shares)
        total = left = self.batch_seconds(padded)
        with self.device_lock:
            while left > DONE_WITHIN_S:
                began = self._clock()
                self._wait(min(left, SLICE_S))
                # The device worked all the while the host waited, however late the host
                # woke: a real device's batch does not take longer because the thread
                # waiting on it overslept (time.sleep overshoots 0.1 ms a slice idle).
                worked = min(self._clock() - began, left)
                self.device_busy_s += worked
                left -= worked
                if left > DONE_WITHIN_S:
                    self.step(done=1 - left / total)
        return [a for _, a in shares]

    def close(self) -> None:
        self._closed = True
