"""A sentence-transformers embedding model, from a directory or from a package that
ships one::

    "embed": {"spec": "dynamic_batching.gpu_workers.models.adapters.SentenceTransformerSpec", "path": "/models/e5-small"}

Input: a text. Answer: its embedding, a list of floats (L2-normalised unless
``normalize`` is false).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .common import TokenizedSpec, model_directory
from .tokens import HFTokens, find_tokenizer, model_limit, read_json

if TYPE_CHECKING:
    from .torch_runner import TorchRunner

__all__ = ["SentenceTransformerSpec"]

_TRANSFORMER = "sentence_transformers.models.Transformer"


def _transformer_dir(directory: Path) -> Path:
    """Where the model's tokenizer lives: the directory itself, or its Transformer
    module's folder (modules.json) when that is a subfolder."""
    if (directory / "tokenizer.json").is_file():
        return directory
    try:
        modules = json.loads((directory / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return directory
    for module in modules if isinstance(modules, list) else []:
        if isinstance(module, dict) and module.get("type") == _TRANSFORMER:
            return directory / str(module.get("path") or "")
    return directory


class SentenceTransformerSpec(TokenizedSpec):
    """Options: ``path`` (a saved SentenceTransformer) or ``package`` (a module whose
    ``get_model_path()`` returns one); ``max_tokens`` (default: its max_seq_length);
    ``normalize`` (default true); ``dtype``, ``probe``, ``decimals`` (TokenizedSpec)."""

    output_type: ClassVar[Any] = list[float]
    input_description: ClassVar[str] = "A text to embed."
    output_description: ClassVar[str] = "The text's embedding: a list of floats."
    input_example: ClassVar[Any] = "a sentence to embed"

    def __init__(
        self,
        path: str | None = None,
        package: str | None = None,
        max_tokens: int | None = None,
        normalize: bool = True,
        dtype: str | None = None,
        decimals: int = 8,
        probe: bool = False,
    ) -> None:
        self.directory = model_directory(path, package)
        inner = _transformer_dir(self.directory)
        seq_length = read_json(inner / "sentence_bert_config.json").get("max_seq_length") or read_json(
            self.directory / "sentence_bert_config.json"
        ).get("max_seq_length")
        limit = seq_length if isinstance(seq_length, int) and seq_length > 0 else model_limit(inner)
        if not isinstance(normalize, bool):
            raise ValueError(f"normalize must be true or false, got {normalize!r}")
        self.normalize = normalize
        super().__init__(
            tokens=HFTokens(find_tokenizer(inner, "path")),
            max_tokens=max_tokens,
            limit=limit,
            dtype=dtype,
            probe=probe,
            decimals=decimals,
        )

    def load(self, device: str) -> TorchRunner:
        from .runners import SentenceTransformerRunner

        return SentenceTransformerRunner(
            device, directory=self.directory, normalize=self.normalize, **self.runner_options()
        )
