"""Lua scripts in Redis cannot import one another, so a rule two scripts share is
written once, in a snippet, and put in front of each script whose first line names it
("-- uses: bucket"): tasks/protocol/lua/__init__.py."""

from __future__ import annotations

import re
from pathlib import Path

from dynamic_batching.protocol import lua

LUA = Path(lua.__file__).resolve().parent
SNIPPETS = {"bucket", "states"}


def test_a_script_gets_the_snippets_it_names_first_and_only_those() -> None:
    for path in LUA.glob("*.lua"):
        name = path.stem
        if name in SNIPPETS:
            continue
        text = lua.source(name).decode()
        own = path.read_text()
        used = set(own.splitlines()[0].removeprefix("-- uses: ").split()) if own.startswith("-- uses: ") else set()
        assert text.endswith(own)
        for snippet in SNIPPETS:
            defined = (LUA / f"{snippet}.lua").read_text()
            functions = re.findall(r"local function (\w+)", defined)
            calls = any(re.search(rf"\b{f}\(", own) for f in functions)
            assert calls == (snippet in used), (
                f"{name}.lua calls {snippet}'s functions: it must say '-- uses: {snippet}'"
            )
            assert (defined in text) == (snippet in used)
        # Each function is defined once, in one place.
        for f in re.findall(r"local function (\w+)", own):
            assert not any(f in re.findall(r"local function (\w+)", (LUA / f"{s}.lua").read_text()) for s in SNIPPETS)
