"""A Hugging Face sequence classifier (``AutoModelForSequenceClassification``)::

    "sentiment": {"spec": "dynamic_batching.gpu_workers.models.adapters.SequenceClassifierSpec", "path": "/models/sentiment"}

Input: a text. Answer: ``{"label": "POS", "score": 0.93, "scores": {"NEG": 0.02, ...}}``,
the softmax of the logits, with the labels of the model's config.json (id2label).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import TypedDict

from .common import TokenizedSpec, model_directory
from .tokens import read_json

if TYPE_CHECKING:
    from .torch_runner import TorchRunner

__all__ = ["Classification", "SequenceClassifierSpec", "labels_of"]


class Classification(TypedDict):
    #: The most probable label.
    label: str
    #: Its probability.
    score: float
    #: Every label's probability; they sum to 1.
    scores: dict[str, float]


def labels_of(directory: Path) -> list[str]:
    """The model's labels in output order, from config.json's id2label (or LABEL_i for
    each of its num_labels), or ValueError naming the path."""
    config = read_json(directory / "config.json")
    if not config:
        raise ValueError(f"path: no config.json in {str(directory)!r}; save the model with save_pretrained(dir)")
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            by_index = {int(k): str(v) for k, v in id2label.items()}
        except ValueError:
            raise ValueError(f"path: config.json's id2label has a key that is not an index: {id2label!r}") from None
        if sorted(by_index) == list(range(len(by_index))):
            return [by_index[i] for i in range(len(by_index))]
        raise ValueError(f"path: config.json's id2label must number its labels 0..n-1, got {sorted(by_index)}")
    count = config.get("num_labels", 2)
    return [f"LABEL_{i}" for i in range(int(count))]


class SequenceClassifierSpec(TokenizedSpec):
    """Options: ``path`` (saved with save_pretrained, with a tokenizer.json);
    ``max_tokens`` (default: the model's limit); ``dtype``, ``probe``, ``decimals``."""

    output_type: ClassVar[Any] = Classification
    input_description: ClassVar[str] = "A text to classify."
    input_example: ClassVar[Any] = "this is a wonderful day"

    def __init__(
        self,
        path: str,
        max_tokens: int | None = None,
        dtype: str | None = None,
        decimals: int = 8,
        probe: bool = False,
    ) -> None:
        self.directory = model_directory(path)
        self.labels = labels_of(self.directory)
        if len(self.labels) < 2:
            raise ValueError(
                "path: a classifier needs two labels or more; a model with one output is a "
                "cross-encoder (CrossEncoderSpec)"
            )
        self.output_description = (
            f"The most probable label (one of {', '.join(self.labels)}), its probability, and every label's."
        )
        self._init_saved(self.directory, max_tokens=max_tokens, dtype=dtype, probe=probe, decimals=decimals)

    def load(self, device: str) -> TorchRunner:
        from .runners import ClassifierRunner

        return ClassifierRunner(device, directory=self.directory, labels=self.labels, **self.runner_options())
