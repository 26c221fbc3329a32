"""The padded-token budget: what a batch costs a device is its size times its longest
request, because every request is padded to the longest."""

from __future__ import annotations


def fits(*, size: int, padded_len: int, tokens: int, budget: int) -> bool:
    """Whether a request of `tokens` can join a batch of `size` requests padded to
    `padded_len` without the batch passing `budget` padded tokens."""
    return (size + 1) * max(padded_len, tokens) <= budget
