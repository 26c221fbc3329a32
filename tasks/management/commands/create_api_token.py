"""`manage.py create_api_token USERNAME [--name NAME]`: print a new API token.

The token is printed once, on its own line, and only its hash is stored:

    TOKEN=$(.venv/bin/python manage.py create_api_token alice --name "load test")
    curl -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
         -d '{"text": "hello"}' http://127.0.0.1:8000/api/v1/requests
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tasks.models import ApiToken


class Command(BaseCommand):
    help = "Issue an API token for an existing user and print it (only its hash is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", help="The user the token acts as; create one with createsuperuser.")
        parser.add_argument("--name", default="", help="What the token is for.")

    def handle(self, *args: Any, username: str, name: str, **options: Any) -> None:
        User = get_user_model()
        try:
            user = User.objects.get(**{User.USERNAME_FIELD: username})
        except User.DoesNotExist:
            raise CommandError(f"no user {username!r}; create one first with `manage.py createsuperuser`") from None
        if not user.is_active:
            raise CommandError(f"user {username!r} is inactive")
        token, raw = ApiToken.objects.issue(user, name=name)
        self.stderr.write(f"token {token.prefix}… for {username}; it is shown only now:")
        self.stdout.write(raw)
