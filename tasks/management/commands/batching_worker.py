"""`manage.py batching_worker ROLE`: become one batching worker process of this project.

    manage.py batching_worker collector                        # one active, any more stand by
    manage.py batching_worker collector --name collector-standby
    manage.py batching_worker device cuda:0                    # one per GPU, on any host
    manage.py batching_worker device cpu:0 --preload minilm    # a simulated device

Each role execs the command line tasks/processes.py builds, the one this repository's
`make run` and tests run, with this project's settings (DJANGO_SETTINGS_MODULE, which
manage.py sets) and its Celery app (BATCHING_CELERY_APP).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dynamic_batching.processes import collector_command, device_command


class Command(BaseCommand):
    help = "Run a batching worker of this project: the collector, or a device worker for one device."

    def add_arguments(self, parser: CommandParser) -> None:
        roles = parser.add_subparsers(dest="role", required=True)
        collector = roles.add_parser("collector", help="takes requests and forms batches (one active, more stand by)")
        collector.add_argument("--name", default="collector", help="the Celery node name (unique per host)")
        device = roles.add_parser("device", help="runs batches on one device")
        device.add_argument("device", help="cuda:0, cuda:1, ... (or cpu:0 for a simulated device)")
        device.add_argument("--preload", default=None, help="comma-separated models to load at start")
        for role in (collector, device):
            role.add_argument("--loglevel", default=None, help="default: LOG_LEVEL, else INFO")

    def command_line(self, options: dict[str, Any]) -> list[str]:
        if options["role"] == "collector":
            return collector_command(name=options["name"], loglevel=options["loglevel"])
        return device_command(options["device"], preload=options["preload"], loglevel=options["loglevel"])

    def handle(self, *args: Any, **options: Any) -> None:
        cmd = self.command_line(options)
        self.stdout.flush()
        os.execve(cmd[0], cmd, worker_environment(os.environ))


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The worker's environment: this one, with the settings module named and the
    project importable wherever the worker starts (`python -m celery` puts only the
    current directory on its path, and manage.py may have been run from elsewhere)."""
    module = settings.SETTINGS_MODULE
    if not module:
        # settings.configure() in this process: a worker would have no way to the same.
        raise CommandError("the workers read settings from a module: set DJANGO_SETTINGS_MODULE or pass --settings")
    env = dict(environ)
    env["DJANGO_SETTINGS_MODULE"] = module
    root = project_root(module)
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def project_root(settings_module: str) -> str | None:
    """The folder the settings module's top package is imported from, unless that is an
    installed package's folder (already on every interpreter's path)."""
    top = sys.modules.get(settings_module.partition(".")[0])
    where = getattr(top, "__file__", None)
    if where is None:
        return None
    path = Path(where).resolve()
    root = path.parent.parent if path.name == "__init__.py" else path.parent
    installed = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix)}
    if any(root == p or p in root.parents for p in installed):
        return None
    return str(root)
