"""How every built-in adapter runs a batch on its device, whatever the model.

A subclass says how to load its model and how to turn a batch of inputs into one
tensor with a row per input; this class does the rest the same way for all of them:
inference mode, half precision on CUDA when configured, one copy of the output to the
host per batch, the cache given back after an out-of-memory error, and the probe for
the largest padded-token budget that fits the device.

A subclass that splits that turn into the host's share (`collate`: tokenize and pad
into tensors) and the device's (`forward_features`) gets its batches prepared off the
device: `prepare` collates a batch before it waits for the device lock, so with
DEVICE_OVERLAP the tokenizing happens while another batch holds the device, and on CUDA
it also copies the tensors to the device from pinned memory without waiting for the
copy (queued on the device's stream behind the batch that runs). The built-in adapters
all do; a subclass that overrides `forward` alone works as before, collating under the
device lock.
"""

from __future__ import annotations

import abc
import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..base import BatchRunner
from .common import torch_device_for, torch_threads_for
from .probe import largest_fitting

__all__ = ["PROBE_HEADROOM", "PROBE_MAX_BATCH", "TorchRunner", "is_out_of_memory"]

log = logging.getLogger(__name__)

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}

#: Most rows of longest inputs the probe tries in one batch.
PROBE_MAX_BATCH = 512
#: Batches prepared and not yet run are forgotten past this many (a batch split,
#: bounced or handed back after `prepare` never runs as it was prepared).
MAX_PREPARED = 8
#: Part of the probed budget kept back: the probe's trial batches ran on a device with
#: nothing else on it, and the allocator fragments as batches of other shapes come.
PROBE_HEADROOM = 0.1


def _key(batch: list[Any]) -> tuple[int, ...]:
    return tuple(id(x) for x in batch)


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError))


class TorchRunner(BatchRunner):
    def __init__(
        self,
        device: str,
        *,
        max_tokens: int,
        dtype: str | None = None,
        decimals: int = 8,
        warm_up: Any = None,
        longest: Any = None,
    ) -> None:
        self.device = device
        self.torch_device = torch.device(torch_device_for(device))
        self.cuda = self.torch_device.type == "cuda"
        self.max_tokens = max_tokens
        self.decimals = decimals
        self._longest = longest
        self.dtype: torch.dtype | None = None
        if self.cuda:
            self.dtype = _DTYPES[dtype] if dtype else None
        else:
            # Process-wide; only CPU workers set it, so a GPU worker keeps torch's
            # default for its small host-side work.
            torch.set_num_threads(torch_threads_for())
            if dtype:
                log.info("%s on %s: dtype %s is for CUDA devices; running float32", type(self).__name__, device, dtype)
        # A model is not documented as safe to call from two threads; one batch at a time.
        # Re-entrant: a batch that preempts another runs inside it, between its layers.
        self.device_lock = threading.RLock()
        # A fast tokenizer is not safe to call from two threads at once ("Already
        # borrowed"): `prepare` in one thread and an unprepared batch in another take turns.
        self._host_lock = threading.Lock()
        #: (id of each input, ...) -> (the inputs, their features), from `prepare`.
        self._prepared: OrderedDict[tuple[int, ...], tuple[list[Any], Mapping[str, Any]]] = OrderedDict()
        model = self.load_model()
        if self.dtype is not None:
            model.to(self.dtype)
        model.eval()
        # Between layers: every module of a ModuleList (a transformer's blocks) first
        # lets preempting work run (BatchRunner.step), when the device runner asks. The
        # longest list is taken as the model's stack of layers: before its layer k of n,
        # k/n of the batch is done (what the watchdog projects a batch's end from).
        stacks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
        longest_stack = max(stacks, key=len, default=None)
        for stack in stacks:
            for k, layer in enumerate(stack):
                done = k / len(stack) if stack is longest_stack else None
                layer.register_forward_pre_hook(functools.partial(self._between_layers, done=done))
        self._model: Any = model
        if warm_up is not None:
            # The first forward pass pays for lazy allocations and kernel selection;
            # pay it now rather than in the first caller's latency.
            self.run_batch([warm_up])

    def _between_layers(self, module: Any, args: Any, *, done: float | None) -> None:
        self.step(done)

    @abc.abstractmethod
    def load_model(self) -> Any:
        """The model, on ``self.torch_device``, in float32."""

    def forward(self, model: Any, inputs: list[Any]) -> torch.Tensor:
        """One row per input, in order, on the device. A row must not depend on its
        batch-mates: padding is masked. Override it, or `collate` and `forward_features`
        (then batches are prepared off the device)."""
        features = self._collate(model, inputs)
        if features is None:
            raise NotImplementedError(f"{type(self).__name__} must implement forward, or collate and forward_features")
        return self.forward_features(model, self._to_device(features, ahead=False))

    def collate(self, model: Any, inputs: list[Any]) -> Mapping[str, Any] | None:
        """The host's share of a batch: its input tensors (tokenized, padded), on the
        host. None: this runner has no host's share apart from `forward`."""
        return None

    def forward_features(self, model: Any, features: Mapping[str, Any]) -> torch.Tensor:
        """`forward` from `collate`'s features, on the device."""
        raise NotImplementedError(f"{type(self).__name__} collates but has no forward_features")

    def prepare(self, inputs: Sequence[Any]) -> None:
        """Collate the batch before it waits for the device (BatchRunner.prepare); on
        CUDA also start its copy to the device. `run_batch` uses it if it gets these
        very inputs, in this order; anything else is collated there."""
        batch = list(inputs)
        model = self._model
        if not batch or model is None:
            return
        features = self._collate(model, batch)
        if features is None:
            return
        features = self._to_device(features, ahead=True)
        with self._host_lock:
            self._prepared[_key(batch)] = (batch, features)
            while len(self._prepared) > MAX_PREPARED:
                self._prepared.popitem(last=False)

    def _take_prepared(self, batch: list[Any]) -> Mapping[str, Any] | None:
        # Keyed by the inputs' ids, and `_prepared` holds the inputs themselves, so no id
        # of theirs is reused while they wait: the same key means the same objects.
        with self._host_lock:
            kept = self._prepared.pop(_key(batch), None)
        return None if kept is None else kept[1]

    def _collate(self, model: Any, inputs: list[Any]) -> Mapping[str, Any] | None:
        with self._host_lock:
            return self.collate(model, inputs)

    def _to_device(self, features: Mapping[str, Any], *, ahead: bool) -> dict[str, Any]:
        """The features' tensors on the device. `ahead` (a batch prepared before its
        turn), on CUDA: copied from pinned host memory without waiting, so the copy is
        queued behind the batch running now and the host goes on."""
        if not self.cuda:
            return dict(features)
        moved: dict[str, Any] = {}
        for name, value in features.items():
            if isinstance(value, torch.Tensor):
                value = (
                    value.pin_memory().to(self.torch_device, non_blocking=True)
                    if ahead
                    else value.to(self.torch_device)
                )
            moved[name] = value
        return moved

    def answers(self, rows: list[Any], inputs: list[Any]) -> list[Any]:
        """The JSON answers from the rows (nested lists of floats, already rounded)."""
        return rows

    def run_batch(self, inputs: Sequence[Any]) -> list[Any]:
        if not inputs:
            return []
        batch = list(inputs)
        features = self._take_prepared(batch)
        with self.device_lock:
            model = self._model
            if model is None:
                raise RuntimeError(f"{type(self).__name__} on {self.device} is closed")
            with torch.inference_mode():
                out = self.forward(model, batch) if features is None else self.forward_features(model, features)
                # One copy to the host for the whole batch: a copy per row would wait on
                # the device once per input.
                host = out.to(device="cpu", dtype=torch.float64)
        rows = host.round(decimals=self.decimals).tolist()
        return self.answers(rows, batch)

    def after_failure(self, exc: BaseException) -> None:
        # The allocator keeps the failed batch's blocks cached; give them back so the
        # smaller retries see the memory the big batch could not get.
        if self.cuda and isinstance(exc, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()

    def probe_budget(self, *, max_batch: int = PROBE_MAX_BATCH, headroom: float = PROBE_HEADROOM) -> int:
        """The largest padded-token budget that fits this device now: batches of inputs
        of ``max_tokens`` tokens each, bisected over their size until one runs out of
        memory, less ``headroom``. Use it as this model's ``max_batch_tokens``.

        A budget of ``max_batch * max_tokens`` (less headroom) means the cap was reached,
        not memory: on a CPU that is the usual answer, since RAM seldom runs out first."""

        def fits(rows: int) -> bool:
            try:
                self.run_batch([self._longest] * rows)
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                self.after_failure(exc)
                return False
            return True

        if self.cuda:
            torch.cuda.empty_cache()
        rows = largest_fitting(fits, max_batch)
        if self.cuda:
            torch.cuda.empty_cache()
        return int(rows * self.max_tokens * (1.0 - headroom))

    def close(self) -> None:
        with self.device_lock:
            if self._model is None:
                return
            self._model = None
        with self._host_lock:
            self._prepared.clear()
        if self.cuda:
            torch.cuda.empty_cache()

    def __repr__(self) -> str:
        state = "closed" if self._model is None else "open"
        return f"<{type(self).__name__} {self.device} ({self.torch_device}) {state}>"
