"""The model interface shared by the batching front end and the GPU workers.

A ``ModelSpec`` is cheap and import-safe: client processes use it at the edge to
count and truncate tokens, so nothing here (or in a spec's token methods) may
import torch. ``ModelSpec.load`` is the only place a heavy runtime is pulled in;
it returns a ``BatchRunner`` bound to one device.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Sequence
from typing import Self

__all__ = ["BatchRunner", "ModelSpec", "check_device"]

_DEVICE_RE = re.compile(r"^(cpu|cuda)(:\d+)?$")


def check_device(device: str) -> str:
    """Return ``device`` unchanged if it looks like "cpu", "cpu:N", "cuda" or "cuda:N".

    Failing here, at load time, gives a clear error instead of an obscure one
    from deep inside torch after the model weights were already read.
    """
    if not isinstance(device, str) or not _DEVICE_RE.match(device):
        raise ValueError(f"bad device {device!r}; expected 'cpu', 'cpu:N', 'cuda' or 'cuda:N'")
    return device


class ModelSpec(abc.ABC):
    """What the batcher needs to know about a model without loading it."""

    name: str
    # The model's own input limit, special tokens included.
    max_tokens: int

    @abc.abstractmethod
    def count_tokens(self, text: str) -> int:
        """Token count of ``text`` as the model sees it, special tokens included.

        Must be cheap and must not import torch.
        """

    @abc.abstractmethod
    def truncate(self, text: str, max_tokens: int) -> tuple[str, int]:
        """Cut ``text`` so it counts at most ``max_tokens``; return ``(text, new_count)``."""

    @abc.abstractmethod
    def load(self, device: str) -> BatchRunner:
        """Load the model onto ``device`` ("cpu", "cpu:0", "cuda:0", ...)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} max_tokens={self.max_tokens}>"


class BatchRunner(abc.ABC):
    """A model loaded on one device, running whole batches."""

    device: str

    @abc.abstractmethod
    def run_batch(self, texts: Sequence[str]) -> list[list[float]]:
        """Return one output per input, in the same order.

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
