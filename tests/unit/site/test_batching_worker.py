"""`manage.py batching_worker`: a host project's way to start the workers execs exactly
the command lines `make run` and the tests run, under the project's own settings."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from batching_site import processes
from dynamic_batching.management.commands import batching_worker


@pytest.fixture
def execs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], dict[str, str]]]:
    seen: list[tuple[list[str], dict[str, str]]] = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> Any:
        assert path == argv[0]
        seen.append((argv, env))

    monkeypatch.setattr(os, "execve", execve)
    return seen


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["collector"], processes.collector_command()),
        (["collector", "--name", "collector-standby"], processes.collector_command(name="collector-standby")),
        (["device", "cuda:0"], processes.device_command("cuda:0")),
        (
            ["device", "cpu:1", "--preload", "minilm,synthetic", "--loglevel", "WARNING"],
            processes.device_command("cpu:1", preload="minilm,synthetic", loglevel="WARNING"),
        ),
    ],
)
def test_each_role_execs_the_command_line_make_run_runs(
    execs: list[tuple[list[str], dict[str, str]]], args: list[str], expected: list[str]
) -> None:
    call_command("batching_worker", *args)
    assert [argv for argv, _ in execs] == [expected]
    assert execs[0][1]["DJANGO_SETTINGS_MODULE"] == "batching_site.settings"


def test_the_worker_finds_the_project_from_any_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/opt/extra")
    env = batching_worker.worker_environment(os.environ)
    root = str(Path(__file__).resolve().parents[3])
    assert env["PYTHONPATH"].split(os.pathsep) == [root, "/opt/extra"]


def test_an_installed_settings_package_adds_nothing_to_the_path() -> None:
    # Django's own package stands in for a project installed into the venv.
    assert batching_worker.project_root("django.conf.global_settings") is None
