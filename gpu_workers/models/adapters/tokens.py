"""Counting and cutting tokens the way a Hugging Face model sees them, without torch.

Client processes price every request at the edge, so this reads the model's own
``tokenizer.json`` with the bare ``tokenizers`` library: the same Rust tokenizer that
``transformers``' fast tokenizers wrap, minus torch and transformers.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

__all__ = ["HFTokens", "find_tokenizer", "model_limit", "read_json"]

#: tokenizer_config.json says this (or more) when it knows no limit.
_NO_LIMIT = 1_000_000


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file's object, or {} when there is no such file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def find_tokenizer(directory: Path, option: str) -> Path:
    """``directory/tokenizer.json``, or ValueError naming the option and saying how to
    make one."""
    path = directory / "tokenizer.json" if directory.is_dir() else directory
    if not path.is_file():
        raise ValueError(
            f"{option}: no tokenizer.json in {str(directory)!r}; save a fast tokenizer there "
            "(AutoTokenizer.from_pretrained(...).save_pretrained(dir))"
        )
    return path


def model_limit(directory: Path) -> int | None:
    """The longest input a Hugging Face model directory says it takes, special tokens
    included: the tokenizer's model_max_length, else config.json's position limit."""
    limits = []
    declared = read_json(directory / "tokenizer_config.json").get("model_max_length")
    if isinstance(declared, int) and 0 < declared < _NO_LIMIT:
        limits.append(declared)
    positions = read_json(directory / "config.json").get("max_position_embeddings")
    if isinstance(positions, int) and positions > 0:
        limits.append(positions)
    return min(limits) if limits else None


class HFTokens:
    """One model's tokenizer, loaded on first use (once, under a lock, however many
    threads count at once), with the padding and truncation a tokenizer.json may ship
    with turned off: either would make counts lie."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tokenizer: Tokenizer | None = None
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> Tokenizer:
        tok = self._tokenizer
        if tok is not None:
            return tok
        with self._lock:
            if self._tokenizer is None:
                from tokenizers import Tokenizer

                tok = Tokenizer.from_file(str(self.path))
                tok.no_truncation()
                tok.no_padding()
                self._tokenizer = tok
            return self._tokenizer

    def special(self, *, pair: bool = False) -> int:
        """Special tokens added to one text, or to a pair."""
        return int(self.tokenizer.num_special_tokens_to_add(pair))

    def encode(self, text: str, second: str | None = None) -> Encoding:
        return self.tokenizer.encode(text, second)

    def count(self, text: str) -> int:
        return len(self.encode(text).ids)

    def count_pair(self, first: str, second: str) -> int:
        """Tokens of the pair encoding ([CLS] first [SEP] second [SEP] for BERT)."""
        return len(self.encode(first, second).ids)

    def truncate(self, text: str, max_tokens: int) -> tuple[str, int]:
        """The longest prefix of ``text`` that counts at most ``max_tokens``."""
        need = self.special()
        if max_tokens < need:
            raise ValueError(f"max_tokens must be >= {need} (room for the special tokens), got {max_tokens}")
        enc = self.encode(text)  # once: a long text costs about a millisecond to encode
        count = len(enc.ids)
        if count <= max_tokens:
            return text, count
        return _cut(text, enc, 0, max_tokens - need, self.count)

    def truncate_pair(self, first: str, second: str, max_tokens: int) -> tuple[tuple[str, str], int]:
        """Cut ``second`` (a reranker's passage) until the pair fits; only if the first
        text alone is over the limit is it cut too, with nothing left of the second."""
        need = self.special(pair=True)
        if max_tokens < need:
            raise ValueError(f"max_tokens must be >= {need} (room for the special tokens), got {max_tokens}")
        enc = self.encode(first, second)
        count = len(enc.ids)
        if count <= max_tokens:
            return (first, second), count
        room = max_tokens - need - sum(1 for s in enc.sequence_ids if s == 0)
        if room >= 0:
            cut, n = _cut(second, enc, 1, room, lambda s: self.count_pair(first, s))
            return (first, cut), n
        cut, n = _cut(first, self.encode(first, ""), 0, max_tokens - need, lambda s: self.count_pair(s, ""))
        return (cut, ""), n


def _cut(text: str, enc: Encoding, sequence: int, keep: int, count: Callable[[str], int]) -> tuple[str, int]:
    """``text`` (sequence ``sequence`` of ``enc``) cut after its ``keep``-th token.

    Cutting at a token's end offset re-tokenises to the same prefix for WordPiece, but
    normalisation corner cases could in principle add a token, so the cut is recounted
    and backed off rather than trusted blindly."""
    ends = [end for (_, end), seq in zip(enc.offsets, enc.sequence_ids, strict=True) if seq == sequence]
    limit = count("") + keep
    while keep > 0:
        cut = text[: ends[keep - 1]]
        n = count(cut)
        if n <= limit:
            return cut, n
        keep -= 1
    return "", count("")
