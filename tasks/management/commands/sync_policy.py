"""`manage.py sync_policy`: make Redis hold the policy the database says is active.

`make run` calls it after migrate, so a fresh system starts with a policy row and the
collector and the edge run that row's version. Run it by hand after restoring a
database, or when /healthz shows the published version behind the active one.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dynamic_batching.models import BatchingPolicy
from dynamic_batching.store import shared_state


class Command(BaseCommand):
    help = "Create the default batching policy if there is none, and publish the active one to Redis."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--wait",
            type=float,
            default=0.0,
            metavar="SECONDS",
            help="Keep trying this long while Redis does not answer (for a Redis that is still starting).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        policy = BatchingPolicy.objects.active().to_policy()
        deadline = time.monotonic() + options["wait"]
        while True:
            try:
                shared_state.publish_policy(policy)
                break
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if time.monotonic() >= deadline:
                    raise CommandError(f"could not publish the batching policy: {exc}") from exc
                time.sleep(0.2)
        self.stdout.write(f"published batching policy version {policy.version}")
