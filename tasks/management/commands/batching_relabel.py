"""`manage.py batching_relabel`: move a database made under the app's old label `tasks`
to `dynamic_batching`, keeping every row (dynamic_batching/relabel.py). Safe to run on
any database, any number of times: on a fresh or moved one it does nothing."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from dynamic_batching.relabel import relabel


class Command(BaseCommand):
    help = "Move the batching tables from the old app label `tasks` to `dynamic_batching` (run before migrate)."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default="default", help="the database to move (default: default)")

    def handle(self, *args: Any, **options: Any) -> None:
        moved = relabel(options["database"])
        for old, new in moved:
            self.stdout.write(f"{old} -> {new}")
        if options["verbosity"] and not moved:
            self.stdout.write("nothing to move")
