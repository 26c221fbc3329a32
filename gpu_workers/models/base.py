"""The model interface shared by the batching front end and the GPU workers.

A ``ModelSpec`` is cheap and import-safe: client processes use it at the edge to
count and truncate tokens, so nothing here (or in a spec's token methods) may
import torch. ``ModelSpec.load`` is the only place a heavy runtime is pulled in;
it returns a ``BatchRunner`` bound to one device.
"""

from __future__ import annotations

import abc
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Self

__all__ = ["BatchRunner", "ModelSpec", "beside_the_host", "check_device", "check_text"]

_DEVICE_RE = re.compile(r"^(cpu|cuda)(:\d+)?$")


def beside_the_host(device: str) -> bool:
    """An accelerator works while the host's threads do something else; a CPU device
    is the host's own cores."""
    return not device.startswith("cpu")


def check_device(device: str) -> str:
    """Return ``device`` unchanged if it looks like "cpu", "cpu:N", "cuda" or "cuda:N".

    Failing here, at load time, gives a clear error instead of an obscure one
    from deep inside torch after the model weights were already read.
    """
    if not isinstance(device, str) or not _DEVICE_RE.match(device):
        raise ValueError(f"bad device {device!r}; expected 'cpu', 'cpu:N', 'cuda' or 'cuda:N'")
    return device


def check_text(text: str) -> str:
    """`text`, or ValueError if it cannot be encoded as UTF-8 (a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text is not valid Unicode (unpaired surrogate at index {exc.start})") from None
    return text


class ModelSpec(abc.ABC):
    """What the batcher needs to know about a model without loading it.

    A spec is the extension point: declare one in BATCHING_MODELS (settings) by the
    dotted path of its class, with its options, and the system serves it (docs/models.md).

    One input is whatever `input_type` says, as JSON: a text, a (query, passage) pair, a
    list of texts. `validate_input` checks it at the edge, `count_tokens` prices it for
    the batch token budget, and the runner's answer for it is any JSON (`output_type`).
    """

    #: The name requests use ("model": "minilm"); set from the BATCHING_MODELS key.
    name: str
    #: The model's own input limit, special tokens included.
    max_tokens: int
    #: One input, as a type pydantic understands (the API's schema is built from it).
    input_type: ClassVar[Any] = str
    #: One answer, likewise.
    output_type: ClassVar[Any] = list[float]
    #: Shown in the API's schema and the submit page.
    input_description: ClassVar[str] = "A text."
    output_description: ClassVar[str] = "The model's answer for this input."
    input_example: ClassVar[Any] = "a sentence to embed"

    @classmethod
    def from_config(cls, name: str, options: Mapping[str, Any]) -> Self:
        """The spec BATCHING_MODELS[name] declares: its options are the constructor's
        keyword arguments. A wrong option raises TypeError naming it."""
        spec = cls(**dict(options))
        spec.name = name
        return spec

    def validate_input(self, value: object) -> Any:
        """The input as the model takes it, or TypeError/ValueError saying what is
        wrong. The default accepts one non-blank text."""
        if not isinstance(value, str):
            raise TypeError(f"{self.name} takes a text (a JSON string), got {type(value).__name__}")
        if not value.strip():
            raise ValueError("text is empty or only whitespace; send some words")
        check_text(value)
        return value

    @abc.abstractmethod
    def count_tokens(self, value: Any) -> int:
        """Token count of one (validated) input as the model sees it, special tokens
        included. Must be cheap and must not import torch."""

    @abc.abstractmethod
    def truncate(self, value: Any, max_tokens: int) -> tuple[Any, int]:
        """Cut one input so it counts at most ``max_tokens``; return ``(input, new_count)``."""

    def describe(self, value: Any, limit: int = 60) -> str:
        """A short human-readable form of one input (Flower's arguments, logs)."""
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return text if len(text) <= limit else text[: limit - 3] + "..."

    @abc.abstractmethod
    def load(self, device: str) -> BatchRunner:
        """Load the model onto ``device`` ("cpu", "cpu:0", "cuda:0", ...)."""

    def runs_beside_the_host(self, device: str) -> bool:
        """Whether this model's runner on `device` works beside the host's cores
        (BatchRunner.runs_beside_the_host), known before it loads."""
        return beside_the_host(device)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} max_tokens={self.max_tokens}>"


class BatchRunner(abc.ABC):
    """A model loaded on one device, running whole batches."""

    device: str
    #: Set by the device runner while a batch may be preempted (gpu_workers/preempt.py);
    #: a model calls it between its layers, where another batch may run first. A model
    #: that never calls it is simply never preempted.
    between_steps: Callable[[], object] | None = None
    #: Set by the device runner: hears what share of the batch running now is done, so
    #: one on course to run far past its time limit is cut off early
    #: (gpu_workers/watchdog.py). A model that never reports it is cut off at its limit.
    on_progress: Callable[[float], object] | None = None

    #: Held while the device runs a batch: one batch at a time, like one CUDA stream.
    #: Re-entrant (a batch that preempts another runs inside it). A device runner sets
    #: its own (gpu_workers/device_lock.py), which a batch may lend between its layers
    #: to a batch in another thread; a runner used alone keeps its own.
    device_lock: Any = None

    @property
    def runs_beside_the_host(self) -> bool:
        """The device works while the host's threads do something else (an accelerator),
        rather than with the host's own cores (a CPU device): then a batch waiting for
        the device should start before the one that ran writes its answers."""
        return beside_the_host(self.device)

    def step(self, done: float | None = None) -> None:
        """Between two layers: `done` is the share of the batch's work behind it (before
        layer k of n, k/n) when the model can tell. Then let preempting work run, if the
        runner wants it."""
        report = self.on_progress
        if done is not None and report is not None:
            report(done)
        hook = self.between_steps
        if hook is not None:
            hook()

    def prepare(self, inputs: Sequence[Any]) -> None:  # noqa: B027 - optional hook
        """The host's share of a batch that does not need the device (tokenizing,
        collating, pinning), done before the batch waits for the device, so that with
        DEVICE_OVERLAP it runs while another batch holds it. `run_batch` gets the same
        inputs later (or parts of them, if the batch is split) and may use what this
        kept; it must still work for inputs never prepared. Must not raise for an input
        that `run_batch` would answer with its own error."""

    @abc.abstractmethod
    def run_batch(self, inputs: Sequence[Any]) -> list[Any]:
        """Return one JSON-safe output per input, in the same order.

        May raise for the whole batch; the caller is responsible for isolating
        the offending input.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the model and its device memory. Idempotent."""

    def after_failure(self, exc: BaseException) -> None:  # noqa: B027 - optional hook
        """A batch just raised `exc`; free what it left behind (cached device memory
        after an out-of-memory error) before the halves are retried."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
