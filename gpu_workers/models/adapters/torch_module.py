"""Any ``torch.nn.Module`` with a tokenizer, for what the other adapters do not cover::

    "mine": {
        "spec": "dynamic_batching.gpu_workers.models.adapters.TorchModuleSpec",
        "module": "my_models.encoder:build",
        "tokenizer": "/models/my-encoder",
    }

``build()`` returns the module. Each batch is tokenized with the tokenizer.json in the
``tokenizer`` directory, padded to its longest input, and the module is called as
``module(input_ids=..., attention_mask=...)`` (both ``[batch, tokens]`` int64 tensors).
It returns a ``[batch, n]`` tensor (or, with ``"output": "name"``, a dict or object
holding one under that name); row i, as a list of floats, is input i's answer. A row
must not depend on padding: mask it (mean pooling over the attention mask, say).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .common import TokenizedSpec
from .tokens import HFTokens, find_tokenizer, model_limit

if TYPE_CHECKING:
    from .torch_runner import TorchRunner

__all__ = ["TorchModuleSpec"]

_FACTORY = re.compile(r"^([A-Za-z_][\w.]*):([A-Za-z_]\w*)$")


class TorchModuleSpec(TokenizedSpec):
    """Options: ``module`` ("package.module:factory"); ``tokenizer`` (a directory with
    tokenizer.json, or the file); ``max_tokens`` (default: what the tokenizer's
    directory says; needed otherwise); ``output`` (the name of the tensor in what the
    module returns, if it returns more than one); ``factory_kwargs`` (passed to the
    factory); ``description`` (of one answer, for the API); ``dtype``, ``probe``,
    ``decimals``."""

    output_type: ClassVar[Any] = list[float]
    input_description: ClassVar[str] = "A text."
    input_example: ClassVar[Any] = "a sentence for the model"

    def __init__(
        self,
        module: str,
        tokenizer: str,
        max_tokens: int | None = None,
        output: str | None = None,
        factory_kwargs: dict[str, Any] | None = None,
        description: str = "The module's output row for this input: a list of floats.",
        dtype: str | None = None,
        decimals: int = 8,
        probe: bool = False,
    ) -> None:
        found = _FACTORY.match(module) if isinstance(module, str) else None
        if found is None:
            raise ValueError(f"module must be 'package.module:factory', got {module!r}")
        # Only found, not imported: the module imports torch, and a spec never may.
        try:
            where = importlib.util.find_spec(found.group(1))
        except (ImportError, ValueError) as exc:
            raise ValueError(f"module: cannot find {found.group(1)!r}: {exc}") from None
        if where is None:
            raise ValueError(f"module: no module named {found.group(1)!r} (is its folder on PYTHONPATH?)")
        self.module = module
        if output is not None and not isinstance(output, str):
            raise ValueError(f"output must be a name, got {output!r}")
        self.output = output
        if factory_kwargs is not None and not isinstance(factory_kwargs, dict):
            raise ValueError(f"factory_kwargs must be an object, got {factory_kwargs!r}")
        self.factory_kwargs = dict(factory_kwargs or {})
        if not isinstance(description, str):
            raise ValueError(f"description must be a text, got {description!r}")
        self.output_description = description
        if not isinstance(tokenizer, str):
            raise ValueError(f"tokenizer must be a directory with tokenizer.json, got {tokenizer!r}")
        path = find_tokenizer(Path(tokenizer).expanduser(), "tokenizer")
        super().__init__(
            tokens=HFTokens(path),
            max_tokens=max_tokens,
            # The tokenizer's own limit is only a default: the module may take more.
            limit=model_limit(path.parent) if max_tokens is None else None,
            dtype=dtype,
            probe=probe,
            decimals=decimals,
        )

    def load(self, device: str) -> TorchRunner:
        from .runners import ModuleRunner

        return ModuleRunner(
            device,
            factory=self.module,
            factory_kwargs=self.factory_kwargs,
            tokenizer=self.tokens.path,
            output=self.output,
            **self.runner_options(),
        )
