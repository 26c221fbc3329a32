"""docs/models.md stays true: each example's options are ones its spec takes, the
line counts in its table are the examples' own, and its example spec runs."""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from django.utils.module_loading import import_string

from dynamic_batching.gpu_workers.models import get_spec

DOC = Path(__file__).resolve().parents[3] / "docs" / "models.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def declared(block: str) -> dict[str, Any]:
    scope: dict[str, Any] = {"BATCHING": {}}
    exec(block, scope)  # noqa: S102 - our own documentation
    return scope["BATCHING"]["MODELS"]


def entry_blocks() -> list[str]:
    """The examples that declare one model each."""
    return [b for b in blocks() if b.startswith('BATCHING["MODELS"] = {') and len(declared(b)) == 1]


def code_block(filename: str) -> str:
    [block] = [b for b in blocks() if b.startswith(f"# {filename}\n")]
    return block


def lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def table() -> dict[str, tuple[int, int]]:
    rows = re.findall(r"^\|[^|`]*`(\w+)`[^|]*\| (\d+) \| (\d+)", DOC.read_text(), flags=re.M)
    return {name: (int(settings), int(code)) for name, settings, code in rows}


def test_every_example_names_options_its_spec_takes() -> None:
    checked = 0
    for block in blocks():
        if not block.startswith('BATCHING["MODELS"] = {'):
            continue
        for config in declared(block).values():
            if config["spec"].startswith("my_models."):
                continue  # the example spec: test_the_example_spec_runs
            options = {k: v for k, v in config.items() if k != "spec"}
            inspect.signature(import_string(config["spec"])).bind(**options)
            checked += 1
    assert checked >= 6


def test_the_line_counts_are_the_examples_own() -> None:
    counted = {}
    for block in entry_blocks():
        [(_, config)] = declared(block).items()
        # The entry itself: the block less its `BATCHING["MODELS"] = {` and closing `}`.
        counted[config["spec"].rpartition(".")[2]] = lines(block) - 2
    code = {
        "TorchModuleSpec": lines(code_block("my_models/encoder.py")) - 1,
        "ModelSpec": lines(code_block("my_models/lexicon.py")) - 1,
    }
    counted["ModelSpec"] = counted.pop("LexiconSpec")
    assert table() == {name: (n, code.get(name, 0)) for name, n in counted.items()}


def test_the_example_spec_runs(tmp_path: Path, batching_settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "my_models"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "lexicon.py").write_text(code_block("my_models/lexicon.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("my_models", "my_models.lexicon"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    [block] = [b for b in entry_blocks() if "LexiconSpec" in b]
    batching_settings(MODELS=declared(block))

    spec = get_spec("lexicon")
    text = spec.validate_input("A good day, not a bad one")
    assert spec.count_tokens(text) == 7 and spec.truncate(text, 3) == ("A good day,", 3)
    with pytest.raises(TypeError, match="lexicon takes a text"):
        spec.validate_input(["a", "list"])
    with spec.load("cpu:0") as runner:
        assert runner.run_batch(["a good day", "bad awful great", text]) == [1 / 3, -1 / 3, 0.0]
    for name in ("my_models", "my_models.lexicon"):
        sys.modules.pop(name, None)
