"""The built-in adapters' runners: how each turns a batch into one tensor on the device
(TorchRunner does the rest). Imported only by a spec's ``load``: it needs torch."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from .torch_runner import TorchRunner

__all__ = ["ClassifierRunner", "CrossEncoderRunner", "ModuleRunner", "SentenceTransformerRunner"]


class SentenceTransformerRunner(TorchRunner):
    def __init__(self, device: str, *, directory: Path, normalize: bool, **options: Any) -> None:
        self.directory = directory
        self.normalize = normalize
        super().__init__(device, **options)

    def load_model(self) -> Any:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(self.directory), device=str(self.torch_device))
        # The model cuts at its own max_seq_length; cut where the edge counted.
        model.max_seq_length = self.max_tokens
        return model

    # What SentenceTransformer.encode does for one batch, in two parts (the same answers
    # to the last digit kept: tests/unit/gpu_workers/test_adapters.py).
    def collate(self, model: Any, inputs: list[Any]) -> Mapping[str, Any]:
        return model.preprocess(inputs)

    def forward_features(self, model: Any, features: Mapping[str, Any]) -> torch.Tensor:
        embeddings = model(dict(features))["sentence_embedding"]
        return torch.nn.functional.normalize(embeddings, p=2, dim=1) if self.normalize else embeddings


class _HFRunner(TorchRunner):
    """AutoModelForSequenceClassification and its own tokenizer (which pads to the
    batch's longest input and masks the padding)."""

    def __init__(self, device: str, *, directory: Path, **options: Any) -> None:
        self.directory = directory
        super().__init__(device, **options)

    def load_model(self) -> Any:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(self.directory))
        return AutoModelForSequenceClassification.from_pretrained(str(self.directory)).to(self.torch_device)

    def tokenize(self, *texts: list[str]) -> Mapping[str, Any]:
        # truncation: the edge cut what it was told to; an input let through to run
        # alone is cut here, at the model's limit (a pair loses its passage's end first).
        return dict(
            self.tokenizer(*texts, padding=True, truncation=True, max_length=self.max_tokens, return_tensors="pt")
        )

    def logits(self, model: Any, features: Mapping[str, Any]) -> torch.Tensor:
        return model(**features).logits.float()


class ClassifierRunner(_HFRunner):
    def __init__(self, device: str, *, labels: list[str], **options: Any) -> None:
        self.labels = labels
        super().__init__(device, **options)

    def collate(self, model: Any, inputs: list[Any]) -> Mapping[str, Any]:
        return self.tokenize(inputs)

    def forward_features(self, model: Any, features: Mapping[str, Any]) -> torch.Tensor:
        return torch.softmax(self.logits(model, features), dim=-1)

    def answers(self, rows: list[Any], inputs: list[Any]) -> list[Any]:
        out = []
        for row in rows:
            best = max(range(len(row)), key=row.__getitem__)
            out.append(
                {"label": self.labels[best], "score": row[best], "scores": dict(zip(self.labels, row, strict=True))}
            )
        return out


class CrossEncoderRunner(_HFRunner):
    def __init__(self, device: str, *, sigmoid: bool, **options: Any) -> None:
        self.sigmoid = sigmoid
        super().__init__(device, **options)

    def collate(self, model: Any, inputs: list[Any]) -> Mapping[str, Any]:
        return self.tokenize([q for q, _ in inputs], [p for _, p in inputs])

    def forward_features(self, model: Any, features: Mapping[str, Any]) -> torch.Tensor:
        scores = self.logits(model, features)[:, 0]
        return torch.sigmoid(scores) if self.sigmoid else scores

    def answers(self, rows: list[Any], inputs: list[Any]) -> list[Any]:
        return [{"score": score} for score in rows]


class ModuleRunner(TorchRunner):
    def __init__(
        self,
        device: str,
        *,
        factory: str,
        factory_kwargs: dict[str, Any],
        tokenizer: Path,
        output: str | None,
        **options: Any,
    ) -> None:
        self.factory = factory
        self.factory_kwargs = factory_kwargs
        self.output = output
        self.tokenizer = Tokenizer.from_file(str(tokenizer))
        # To the batch's longest input (a tokenizer.json may ship a fixed length), and
        # cut at the model's limit, as the edge counted.
        padding = self.tokenizer.padding or {}
        self.tokenizer.enable_padding(pad_id=padding.get("pad_id", 0), pad_token=padding.get("pad_token", "[PAD]"))
        self.tokenizer.enable_truncation(max_length=options["max_tokens"])
        super().__init__(device, **options)

    def load_model(self) -> Any:
        module_name, _, attr = self.factory.partition(":")
        build = getattr(importlib.import_module(module_name), attr)
        module = build(**self.factory_kwargs)
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"{self.factory} returned a {type(module).__name__}, not a torch.nn.Module")
        return module.to(self.torch_device)

    def collate(self, model: Any, inputs: list[Any]) -> Mapping[str, Any]:
        encoded = self.tokenizer.encode_batch(inputs)
        return {
            "input_ids": torch.tensor([e.ids for e in encoded], dtype=torch.long),
            "attention_mask": torch.tensor([e.attention_mask for e in encoded], dtype=torch.long),
        }

    def forward_features(self, model: Any, features: Mapping[str, Any]) -> torch.Tensor:
        rows = len(features["input_ids"])
        out = model(input_ids=features["input_ids"], attention_mask=features["attention_mask"])
        if self.output is not None:
            out = out[self.output] if isinstance(out, dict) or hasattr(out, "keys") else getattr(out, self.output)
        if not isinstance(out, torch.Tensor) or out.dim() < 1 or out.shape[0] != rows:
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise TypeError(f"{self.factory} must return one row per input ({rows}), got {shape}")
        return out.float()
