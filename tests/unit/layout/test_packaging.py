"""The wheel holds every package of the import name, and its data: pyproject.toml lists
them by hand (package-dir maps two folders into one name), so a new folder must be
listed or a host's install would lack it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
#: Folder -> import name, as pyproject.toml's package-dir maps them.
FOLDERS = {"tasks": "dynamic_batching", "gpu_workers": "dynamic_batching.gpu_workers"}


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_package_dir_maps_the_fixed_folders_to_one_import_name() -> None:
    assert pyproject()["tool"]["setuptools"]["package-dir"] == {name: folder for folder, name in FOLDERS.items()}


def test_every_folder_with_an_init_is_a_listed_package() -> None:
    found = set()
    for folder, name in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([name, *parts]))
    assert sorted(pyproject()["tool"]["setuptools"]["packages"]) == sorted(found)


def test_the_data_files_a_package_reads_are_in_the_wheel() -> None:
    data = pyproject()["tool"]["setuptools"]["package-data"]
    assert data["dynamic_batching.protocol.lua"] == ["*.lua"]
    assert list((ROOT / "tasks" / "protocol" / "lua").glob("*.lua"))
    templates = list((ROOT / "tasks" / "templates" / "dynamic_batching").glob("*.html"))
    assert templates and "templates/dynamic_batching/*.html" in data["dynamic_batching"]
