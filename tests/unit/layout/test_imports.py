"""Imports flow one way: the site, then the edge / collector / device workers, then
metrics, the store, the protocol and the core. A small AST walk of every project
module finds each import (at any depth, deferred ones too) and fails on a cycle or on
an import that runs back up the layers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: Folder -> its import name (pyproject.toml maps tasks/ and gpu_workers/ into one package).
PACKAGES = {
    "batching_site": "batching_site",
    "tasks": "dynamic_batching",
    "gpu_workers": "dynamic_batching.gpu_workers",
}

#: Highest first. A module may import its own layer's modules and any lower layer's.
#: The first prefix that matches a module names its layer.
LAYERS: list[tuple[str, ...]] = [
    ("batching_site",),
    # The serving surface a host includes: pages, the API, reports.
    ("dynamic_batching.urls", "dynamic_batching.web", "dynamic_batching.reporting"),
    (
        "dynamic_batching.admin",
        "dynamic_batching.management",
        "dynamic_batching.models",
        "dynamic_batching.apps",
        "dynamic_batching.checks",
        "dynamic_batching.relabel",
        "dynamic_batching.migrations",
        "dynamic_batching.processes",
    ),
    ("dynamic_batching.collector", "dynamic_batching.edge", "dynamic_batching.gpu_workers"),
    ("dynamic_batching.metrics",),
    ("dynamic_batching.store",),
    ("dynamic_batching.protocol",),
    ("dynamic_batching.core",),
]
#: Below every layer: the settings every process reads, and the package's accessor of
#: them. (The Celery app module is the site's: the package reaches it only by name,
#: through BATCHING["CELERY_APP"].)
BASE = ("batching_site.settings", "dynamic_batching.conf")
#: The device workers' model specs sit under the edge, which counts tokens with them.
LAYERS.insert(LAYERS.index(("dynamic_batching.metrics",)), ("dynamic_batching.gpu_workers.models",))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGES[parts[0]], *parts[1:]])


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules `name` imports, resolved to the longest known module."""
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    # Imports for type checkers only never run.
    skipped = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = name.split(".") if is_pkg else name.split(".")[:-1]
                parent = parent[: len(parent) - (node.level - 1)]
                base = ".".join([*parent, base] if base else parent)
            # `from pkg import module` imports the module; `from pkg import name`, pkg.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def graph() -> dict[str, set[str]]:
    mods = project_modules()
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def layer_of(module: str) -> int | None:
    if module in ("dynamic_batching", "dynamic_batching.gpu_workers"):
        return 1  # the Django app's package itself: empty
    if module.startswith(BASE):
        return len(LAYERS)
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def test_every_module_has_a_layer() -> None:
    assert [m for m in graph() if layer_of(m) is None] == []


def test_no_import_runs_up_a_layer() -> None:
    upward = []
    for mod, deps in graph().items():
        for dep in deps:
            # A package's __init__ may re-export its own modules.
            if dep.startswith(mod + ".") or mod.startswith(dep + "."):
                continue
            if layer_of(dep) < layer_of(mod):  # type: ignore[operator]
                upward.append(f"{mod} -> {dep}")
    assert sorted(upward) == []


def test_no_import_cycle() -> None:
    g = graph()
    # Package __init__ files importing their own children are not edges of a cycle.
    g = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in g.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(g.get(m, ())):
            if state.get(d) == 1:
                cycles.append([*path[path.index(d) :], d] if d in path else [m, d])
            elif d not in state:
                visit(d, [*path, d])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def run_imports(modules: list[str], *, setup: bool) -> subprocess.CompletedProcess[str]:
    code = "import importlib, sys\n"
    if setup:
        code += "import django\ndjango.setup()\n"
    code += "for m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    return subprocess.run(
        [sys.executable, "-c", code, *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "batching_site.settings", "DJANGO_READ_DOT_ENV": "0"},
    )


PACKAGE_INITS = [
    "dynamic_batching.core",
    "dynamic_batching.protocol",
    "dynamic_batching.store",
    "dynamic_batching.metrics",
    "dynamic_batching.edge",
    "dynamic_batching.collector",
    "dynamic_batching.gpu_workers",
    "batching_site",
]


@pytest.mark.parametrize(
    "package", [*PACKAGE_INITS, "dynamic_batching.collector.worker", "dynamic_batching.gpu_workers.worker"]
)
def test_each_package_imports_alone_in_a_fresh_interpreter(package: str) -> None:
    done = run_imports([package], setup=False)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("reverse", [False, True], ids=["top-down", "bottom-up"])
def test_every_module_imports_in_either_order(reverse: bool) -> None:
    modules = sorted(m for m in project_modules() if ".migrations" not in m and not m.endswith(".worker"))
    done = run_imports(list(reversed(modules)) if reverse else modules, setup=True)
    assert done.returncode == 0, done.stderr[-3000:]
