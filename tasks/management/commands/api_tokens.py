"""`manage.py api_tokens list|revoke`: see who holds API tokens, and stop them working.

    manage.py api_tokens list                     # working tokens, newest first
    manage.py api_tokens list --user alice --all  # alice's, expired and revoked too
    manage.py api_tokens revoke bt_Ab3dE9 17      # by prefix (as `list` shows it) or id
    manage.py api_tokens revoke --user alice      # every working token of alice's

Revoking is immediate and cannot be undone: issue a new token with create_api_token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from dynamic_batching.models import API_TOKEN_PREFIX, ApiToken, hash_api_token

COLUMNS = ("id", "prefix", "user", "name", "created", "last used", "expires", "state")


def _when(moment: datetime | None, empty: str) -> str:
    return f"{moment:%Y-%m-%d %H:%M}" if moment else empty


def table(tokens: Iterable[ApiToken], now: datetime) -> list[str]:
    """The lines `list` prints: a header, then one row per token, times in UTC to the
    minute, columns padded to fit."""
    rows = [COLUMNS] + [
        (
            str(t.pk),
            t.prefix,
            str(t.user),
            t.name or "-",
            _when(t.created_at, "-"),
            _when(t.last_used_at, "never"),
            _when(t.expires_at, "never"),
            t.state_at(now),
        )
        for t in tokens
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


class Command(BaseCommand):
    help = "List API tokens, or revoke them by prefix, id or user."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{list,revoke}")
        show = actions.add_parser("list", help="Print a table of tokens (working ones unless --all).")
        show.add_argument("--user", metavar="USERNAME", help="Only this user's tokens.")
        show.add_argument("--all", action="store_true", help="Include expired and revoked tokens.")
        revoke = actions.add_parser("revoke", help="Revoke tokens by prefix or id, or all of one user's.")
        revoke.add_argument("tokens", nargs="*", metavar="PREFIX_OR_ID", help="A prefix as `list` shows it, or an id.")
        revoke.add_argument("--user", metavar="USERNAME", help="Revoke every working token of this user.")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        now = timezone.now()
        if action == "list":
            self.list_tokens(options["user"], show_all=options["all"], now=now)
        else:
            self.revoke_tokens(options["tokens"], options["user"], now=now)

    def list_tokens(self, username: str | None, *, show_all: bool, now: datetime) -> None:
        tokens = ApiToken.objects.select_related("user").order_by("-created_at", "-pk")
        if username is not None:
            tokens = tokens.filter(user=self.user(username))
        if not show_all:
            tokens = tokens.active(now)
        rows = list(tokens)
        if not rows:
            whose = f" of {username}" if username else ""
            hint = "" if show_all else "; --all shows expired and revoked ones too"
            self.stdout.write(f"no {'' if show_all else 'working '}tokens{whose}{hint}")
            return
        for line in table(rows, now):
            self.stdout.write(line)

    def revoke_tokens(self, names: Sequence[str], username: str | None, *, now: datetime) -> None:
        if bool(names) == (username is not None):
            what = "the tokens' prefixes or ids (`manage.py api_tokens list` shows them) or --user USERNAME"
            raise CommandError(f"give {what}, not both" if names else f"give {what}")
        if username is not None:
            user = self.user(username)
            tokens = list(ApiToken.objects.filter(user=user).active(now).order_by("created_at", "pk"))
            if not tokens:
                self.stdout.write(f"{username} has no working tokens; nothing revoked")
                return
            ApiToken.objects.filter(pk__in=[t.pk for t in tokens]).revoke(now)
            listed = ", ".join(t.prefix for t in tokens)
            self.stdout.write(f"revoked {len(tokens)} token{'s' if len(tokens) != 1 else ''} of {username}: {listed}")
            return
        # Find every token first, so a typo in the third name revokes nothing.
        for token in [self.find(name) for name in names]:
            if token.revoke(now):
                self.stdout.write(f"revoked {token}")
            else:
                self.stdout.write(f"{token} was already revoked at {_when(token.revoked_at, '-')}; left as it was")

    def user(self, username: str) -> Any:
        User = get_user_model()
        try:
            return User.objects.get(**{User.USERNAME_FIELD: username})
        except User.DoesNotExist:
            raise CommandError(f"no user {username!r}; check the spelling in the admin's user list") from None

    def find(self, name: str) -> ApiToken:
        """The one token `name` means: an id, a prefix as `list` prints it (a trailing
        "…" is ignored), or a whole raw token pasted in."""
        name = name.strip().rstrip("…")
        tokens = ApiToken.objects.select_related("user")
        if name.isdigit():
            matches = list(tokens.filter(pk=int(name)))
        elif name.startswith(API_TOKEN_PREFIX) and len(name) > ApiToken._meta.get_field("prefix").max_length:
            matches = list(tokens.filter(key_hash=hash_api_token(name)))
        else:
            matches = list(tokens.filter(prefix=name))
        if not matches:
            raise CommandError(
                f"no token with id or prefix {name!r}; `manage.py api_tokens list --all` shows every token"
            )
        if len(matches) > 1:
            ids = ", ".join(f"{t.pk} ({t})" for t in matches)
            raise CommandError(f"prefix {name!r} is shared by several tokens; name one by its id: {ids}")
        return matches[0]
