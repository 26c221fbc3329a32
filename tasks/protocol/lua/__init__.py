"""The Lua scripts the store runs in Redis, kept as files so they read as Lua."""

from __future__ import annotations

from functools import cache
from pathlib import Path

_HERE = Path(__file__).resolve().parent


#: A script's first line naming snippets it needs: "-- uses: bucket".
_USES = b"-- uses: "


@cache
def source(name: str) -> bytes:
    """The text of `name`.lua, read once per process, after the snippets its first line
    names (Lua scripts in Redis cannot import one another)."""
    text = (_HERE / f"{name}.lua").read_bytes()
    first = text.split(b"\n", 1)[0]
    if not first.startswith(_USES):
        return text
    return b"\n".join([*(source(used.decode()) for used in first[len(_USES) :].split()), text])
