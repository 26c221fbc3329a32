"""Every queue name and `batching:*` Redis key is spelled once, in
tasks/protocol/names.py: a test greps the code for stray literals."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OWNER = ROOT / "tasks" / "protocol" / "names.py"
#: String literals that name a key or a queue: "batching:...", "requests.<tier>",
#: "collector.events" / "collector.control", "device.<name>" and the batch queue.
STRAY = re.compile(
    r"""["'](batching:[\w:*<>{}-]*|(batching\.)?requests\.(high|normal|low)|(batching\.)?collector\.(events|control)"""
    r"""|batching\.(batches|device\.)[\w.]*)["']"""
)


def offenders(paths: list[Path]) -> list[str]:
    out = []
    for path in paths:
        if path == OWNER:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if STRAY.search(line):
                out.append(f"{path}:{n}: {line.strip()}")
    return out


def test_names_are_defined_only_in_protocol_names() -> None:
    code = [p for pkg in ("tasks", "gpu_workers", "batching_site", "scripts") for p in (ROOT / pkg).rglob("*.py")]
    code += list((ROOT / "tasks" / "protocol" / "lua").glob("*.lua"))
    assert offenders(code) == []


def test_the_grep_finds_a_stray_literal(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text('KEY = "batching:policy"\nQUEUE = "requests.low"\n')
    assert len(offenders([planted])) == 2
