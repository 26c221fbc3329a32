"""`manage.py create_api_token USERNAME [--name NAME] [--expires-days N]`: print a new API token.

The token is printed once, on its own line, and only its hash is stored:

    TOKEN=$(.venv/bin/python manage.py create_api_token alice --name "load test")
    curl -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
         -d '{"text": "hello"}' http://127.0.0.1:8000/api/v1/requests

It works for conf.API_TOKEN_DEFAULT_EXPIRY_DAYS days (90) unless --expires-days says
otherwise; --expires-days 0 makes one that never expires. `manage.py api_tokens` lists
and revokes tokens.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dynamic_batching.conf import conf
from dynamic_batching.models import ApiToken


class Command(BaseCommand):
    help = "Issue an API token for an existing user and print it (only its hash is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", help="The user the token acts as; create one with createsuperuser.")
        parser.add_argument("--name", default="", help="What the token is for.")
        parser.add_argument(
            "--expires-days",
            type=int,
            default=None,
            metavar="N",
            help="Days until the token stops working; 0: never. "
            "Default: conf.API_TOKEN_DEFAULT_EXPIRY_DAYS (env API_TOKEN_DEFAULT_EXPIRY_DAYS).",
        )

    def handle(self, *args: Any, username: str, name: str, expires_days: int | None, **options: Any) -> None:
        if expires_days is None:
            expires_days = conf.API_TOKEN_DEFAULT_EXPIRY_DAYS
        if expires_days < 0:
            raise CommandError(
                f"--expires-days must be 0 (never expires) or a positive number of days, got {expires_days}"
            )
        User = get_user_model()
        try:
            user = User.objects.get(**{User.USERNAME_FIELD: username})
        except User.DoesNotExist:
            raise CommandError(f"no user {username!r}; create one first with `manage.py createsuperuser`") from None
        if not user.is_active:
            raise CommandError(f"user {username!r} is inactive")
        expires_in = timedelta(days=expires_days) if expires_days else None
        token, raw = ApiToken.objects.issue(user, name=name, expires_in=expires_in)
        until = f"until {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else "with no expiry"
        self.stderr.write(f"token {token.prefix}… for {username}, valid {until}; it is shown only now:")
        self.stdout.write(raw)
