"""The Lua scripts the store runs in Redis, kept as files so they read as Lua."""

from __future__ import annotations

from functools import cache
from pathlib import Path

_HERE = Path(__file__).resolve().parent


@cache
def source(name: str) -> bytes:
    """The text of `name`.lua, read once per process."""
    return (_HERE / f"{name}.lua").read_bytes()
