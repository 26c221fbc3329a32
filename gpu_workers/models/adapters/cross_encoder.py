"""A cross-encoder reranker: a Hugging Face sequence classifier with one output that
reads a (query, passage) pair together::

    "rerank": {"spec": "dynamic_batching.gpu_workers.models.adapters.CrossEncoderSpec", "path": "/models/ms-marco-MiniLM"}

Input: ``["query", "passage"]``. Answer: ``{"score": 4.2}``, the model's single logit
(the higher, the more relevant), or its sigmoid, between 0 and 1, with ``"sigmoid": true``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from typing_extensions import TypedDict

from ..base import check_text
from .common import TokenizedSpec, model_directory
from .sequence_classifier import labels_of

if TYPE_CHECKING:
    from .torch_runner import TorchRunner

__all__ = ["CrossEncoderSpec", "Relevance"]


class Relevance(TypedDict):
    #: How relevant the passage is to the query: higher is more relevant.
    score: float


class CrossEncoderSpec(TokenizedSpec):
    """Options: ``path`` (a sequence classifier with num_labels=1 and a tokenizer.json);
    ``sigmoid`` (default false: the raw logit); ``max_tokens``, ``dtype``, ``probe``,
    ``decimals``. An input over ``max_tokens`` loses the end of its passage."""

    input_type: ClassVar[Any] = tuple[str, str]
    output_type: ClassVar[Any] = Relevance
    input_description: ClassVar[str] = "A [query, passage] pair: two texts."
    input_example: ClassVar[Any] = [
        "what is dynamic batching?",
        "Dynamic batching groups requests that arrive close together into one model call.",
    ]

    def __init__(
        self,
        path: str,
        sigmoid: bool = False,
        max_tokens: int | None = None,
        dtype: str | None = None,
        decimals: int = 8,
        probe: bool = False,
    ) -> None:
        self.directory = model_directory(path)
        outputs = len(labels_of(self.directory))
        if outputs != 1:
            raise ValueError(
                f"path: a cross-encoder has one output (num_labels=1); this model has {outputs}: "
                "serve it with SequenceClassifierSpec"
            )
        if not isinstance(sigmoid, bool):
            raise ValueError(f"sigmoid must be true or false, got {sigmoid!r}")
        self.sigmoid = sigmoid
        self.output_description = "The passage's relevance to the query: " + (
            "the sigmoid of the model's logit, from 0 to 1." if sigmoid else "the model's logit; higher is better."
        )
        self._init_saved(self.directory, max_tokens=max_tokens, dtype=dtype, probe=probe, decimals=decimals)

    def validate_input(self, value: object) -> list[str]:
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            if isinstance(value, (list, tuple)):
                got = f"{len(value)} item{'' if len(value) == 1 else 's'}"
            else:
                got = f"a {type(value).__name__}"
            raise TypeError(f"{self.name} takes a [query, passage] pair (a JSON array of two texts), got {got}")
        for what, text in zip(("query", "passage"), value, strict=True):
            if not isinstance(text, str):
                raise TypeError(f"the {what} must be a text (a JSON string), got {type(text).__name__}")
            if not text.strip():
                raise ValueError(f"the {what} is empty or only whitespace; send some words")
            check_text(text)
        return [value[0], value[1]]

    def count_tokens(self, value: Any) -> int:
        query, passage = value
        return self.tokens.count_pair(query, passage)

    def truncate(self, value: Any, max_tokens: int) -> tuple[Any, int]:
        pair, count = self.tokens.truncate_pair(value[0], value[1], max_tokens)
        return list(pair), count

    def longest_input(self) -> Any:
        text = super().longest_input()
        return [text, text]

    def load(self, device: str) -> TorchRunner:
        from .runners import CrossEncoderRunner

        return CrossEncoderRunner(device, directory=self.directory, sigmoid=self.sigmoid, **self.runner_options())
