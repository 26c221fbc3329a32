"""Built-in specs for the common model families, each declared in a few lines of
BATCHING_MODELS (docs/models.md shows each one)."""

from .cross_encoder import CrossEncoderSpec
from .sentence_transformer import SentenceTransformerSpec
from .sequence_classifier import SequenceClassifierSpec
from .torch_module import TorchModuleSpec

__all__ = ["CrossEncoderSpec", "SentenceTransformerSpec", "SequenceClassifierSpec", "TorchModuleSpec"]
