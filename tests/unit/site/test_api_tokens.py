"""API tokens: expired, revoked and inactive-user tokens are refused; last use is recorded
at most once a minute; `create_api_token` and `api_tokens` issue, list and revoke them;
the admin lists and revokes them but never adds one; passwords go through Django's
validators."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from dynamic_batching.models import API_TOKEN_TOUCH_EVERY, ApiToken

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


@pytest.fixture
def alice(db: None) -> User:
    return User.objects.create_user("alice")


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


# --- the model ------------------------------------------------------------------------


def test_issue_sets_the_expiry(alice: User) -> None:
    token, raw = ApiToken.objects.issue(alice, name="ci", expires_in=timedelta(days=3), now=T0)
    assert token.created_at == T0 and token.expires_at == T0 + timedelta(days=3)
    assert ApiToken.objects.issue(alice)[0].expires_at is None
    with pytest.raises(ValueError, match="expires_in must be positive"):
        ApiToken.objects.issue(alice, expires_in=timedelta(0))


def test_an_expired_token_is_refused(alice: User) -> None:
    token, raw = ApiToken.objects.issue(alice, expires_in=timedelta(hours=1), now=T0)
    assert ApiToken.objects.user_for(raw, now=T0 + timedelta(minutes=59)) == alice
    assert ApiToken.objects.user_for(raw, now=T0 + timedelta(hours=1)) is None
    assert token.state_at(T0 + timedelta(minutes=59)) == "active"
    assert token.state_at(T0 + timedelta(hours=1)) == "expired"


def test_a_revoked_token_is_refused_and_revoking_again_changes_nothing(alice: User) -> None:
    token, raw = ApiToken.objects.issue(alice, expires_in=timedelta(hours=1), now=T0)
    assert token.revoke(now=T0 + timedelta(minutes=1)) is True
    assert ApiToken.objects.user_for(raw, now=T0 + timedelta(minutes=2)) is None
    assert token.revoke(now=T0 + timedelta(minutes=5)) is False
    token.refresh_from_db()
    assert token.revoked_at == T0 + timedelta(minutes=1)
    # Revoked wins over expired: it says what somebody did.
    assert token.state_at(T0 + timedelta(days=1)) == "revoked"


def test_an_inactive_users_token_and_garbage_are_refused(alice: User) -> None:
    _, raw = ApiToken.objects.issue(alice)
    alice.is_active = False
    alice.save()
    assert ApiToken.objects.user_for(raw) is None
    for garbage in (None, "", "bt_nope", raw[3:], "bt_" + "x" * 200):
        assert ApiToken.objects.user_for(garbage) is None


def test_last_use_is_written_once_a_minute_at_most(alice: User, django_assert_num_queries: Any) -> None:
    token, raw = ApiToken.objects.issue(alice, now=T0)
    assert token.last_used_at is None

    with django_assert_num_queries(2):  # the read, and the first write
        assert ApiToken.objects.user_for(raw, now=T0 + timedelta(seconds=1)) == alice
    token.refresh_from_db()
    assert token.last_used_at == T0 + timedelta(seconds=1)

    # A hot token costs the read only.
    for seconds in (2, 30, 61):
        with django_assert_num_queries(1):
            assert ApiToken.objects.user_for(raw, now=T0 + timedelta(seconds=seconds)) == alice
    token.refresh_from_db()
    assert token.last_used_at == T0 + timedelta(seconds=1)

    later = T0 + timedelta(seconds=1) + API_TOKEN_TOUCH_EVERY + timedelta(seconds=1)
    ApiToken.objects.user_for(raw, now=later)
    token.refresh_from_db()
    assert token.last_used_at == later


# --- create_api_token -------------------------------------------------------------------


def test_create_api_token_expires_after_the_default_days(alice: User, batching_settings: Any) -> None:
    batching_settings(API_TOKEN_DEFAULT_EXPIRY_DAYS=7)
    before = timezone.now()
    out, err = run("create_api_token", "alice", "--name", "cli")
    token = ApiToken.objects.get()
    assert ApiToken.objects.user_for(out.strip()) == alice
    assert before + timedelta(days=7) <= token.expires_at <= timezone.now() + timedelta(days=7)
    assert f"valid until {token.expires_at:%Y-%m-%d %H:%M} UTC" in err


def test_create_api_token_takes_expires_days(alice: User) -> None:
    run("create_api_token", "alice", "--expires-days", "1")
    run("create_api_token", "alice", "--expires-days", "0")
    one_day, never = ApiToken.objects.order_by("pk")
    assert one_day.expires_at is not None and one_day.expires_at - one_day.created_at == timedelta(days=1)
    assert never.expires_at is None
    with pytest.raises(CommandError, match="--expires-days must be 0"):
        run("create_api_token", "alice", "--expires-days", "-1")


# --- api_tokens -------------------------------------------------------------------------


@pytest.fixture
def tokens(alice: User) -> dict[str, ApiToken]:
    """alice's working, expired and revoked tokens, and bob's working one."""
    now = timezone.now()
    bob = User.objects.create_user("bob")
    tokens = {
        "working": ApiToken.objects.issue(alice, name="working", expires_in=timedelta(days=1))[0],
        "expired": ApiToken.objects.issue(
            alice, name="old", expires_in=timedelta(hours=1), now=now - timedelta(days=1)
        )[0],
        "revoked": ApiToken.objects.issue(alice, name="leaked")[0],
        "bob": ApiToken.objects.issue(bob, name="bobs")[0],
    }
    tokens["revoked"].revoke()
    return tokens


def lines_of(out: str) -> dict[str, list[str]]:
    """The table, by prefix: each row's cells."""
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["id", "prefix", "user", "name", "created", "last", "used", "expires", "state"]
    return {row[1]: row for row in rows[1:]}


def test_list_shows_working_tokens_unless_all(tokens: dict[str, ApiToken]) -> None:
    t = tokens
    rows = lines_of(run("api_tokens", "list")[0])
    assert set(rows) == {t["working"].prefix, t["bob"].prefix}
    working = rows[t["working"].prefix]
    assert working[0] == str(t["working"].pk) and working[2:4] == ["alice", "working"]
    assert working[-1] == "active" and "never" in working  # never used

    rows = lines_of(run("api_tokens", "list", "--user", "alice", "--all")[0])
    assert {prefix: row[-1] for prefix, row in rows.items()} == {
        t["working"].prefix: "active",
        t["expired"].prefix: "expired",
        t["revoked"].prefix: "revoked",
    }


def test_list_says_when_there_is_nothing_and_names_an_unknown_user(alice: User) -> None:
    assert run("api_tokens", "list")[0] == "no working tokens; --all shows expired and revoked ones too\n"
    with pytest.raises(CommandError, match="no user 'carol'"):
        run("api_tokens", "list", "--user", "carol")


def test_revoke_by_prefix_and_id_says_what_it_did(tokens: dict[str, ApiToken]) -> None:
    t = tokens
    out, _ = run("api_tokens", "revoke", t["working"].prefix + "…", str(t["bob"].pk), t["revoked"].prefix)
    lines = out.splitlines()
    assert lines[0] == f"revoked {t['working']}"
    assert lines[1] == f"revoked {t['bob']}"
    assert lines[2].startswith(f"{t['revoked']} was already revoked at ")
    assert ApiToken.objects.active().count() == 0


def test_revoke_refuses_an_unknown_name_and_revokes_nothing(tokens: dict[str, ApiToken]) -> None:
    with pytest.raises(
        CommandError, match=r"no token with id or prefix 'bt_zzzzzz'; `manage.py api_tokens list --all`"
    ):
        run("api_tokens", "revoke", tokens["working"].prefix, "bt_zzzzzz")
    assert ApiToken.objects.active().count() == 2


def test_revoke_a_users_tokens(tokens: dict[str, ApiToken]) -> None:
    out, _ = run("api_tokens", "revoke", "--user", "alice")
    assert out == f"revoked 1 token of alice: {tokens['working'].prefix}\n"
    assert list(ApiToken.objects.active()) == [tokens["bob"]]
    assert run("api_tokens", "revoke", "--user", "alice")[0] == "alice has no working tokens; nothing revoked\n"


@pytest.mark.parametrize("args", [(), ("bt_abc", "--user", "alice")])
def test_revoke_needs_tokens_or_a_user(alice: User, args: tuple[str, ...]) -> None:
    with pytest.raises(CommandError, match="prefixes or ids .* or --user USERNAME"):
        run("api_tokens", "revoke", *args)


# --- the admin --------------------------------------------------------------------------


@pytest.fixture
def admin_browser(db: None) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", email="root@example.com"))
    return client


def test_the_changelist_lists_tokens_and_explains_there_is_no_add(
    admin_browser: Client, tokens: dict[str, ApiToken]
) -> None:
    response = admin_browser.get(reverse("admin:dynamic_batching_apitoken_changelist"))
    assert response.status_code == 200
    page = response.content.decode()
    for token in tokens.values():
        assert token.prefix in page
        assert token.key_hash not in page
    assert "create_api_token USERNAME" in page
    assert reverse("admin:dynamic_batching_apitoken_add") not in page
    assert admin_browser.get(reverse("admin:dynamic_batching_apitoken_add")).status_code == 403

    revoked = admin_browser.get(
        reverse("admin:dynamic_batching_apitoken_changelist"), {"state": "revoked"}
    ).content.decode()
    assert tokens["revoked"].prefix in revoked and tokens["working"].prefix not in revoked
    found = admin_browser.get(reverse("admin:dynamic_batching_apitoken_changelist"), {"q": "bob"}).content.decode()
    assert tokens["bob"].prefix in found and tokens["working"].prefix not in found


def test_the_change_page_edits_only_name_and_expiry(admin_browser: Client, alice: User) -> None:
    token = ApiToken.objects.issue(alice, name="ci")[0]
    response = admin_browser.get(reverse("admin:dynamic_batching_apitoken_change", args=[token.pk]))
    assert response.status_code == 200
    assert set(response.context["adminform"].form.fields) == {"name", "expires_at"}
    assert token.key_hash not in response.content.decode()


def test_the_revoke_action(admin_browser: Client, tokens: dict[str, ApiToken]) -> None:
    chosen = [tokens["working"], tokens["revoked"]]
    revoked_at = tokens["revoked"].revoked_at
    response = admin_browser.post(
        reverse("admin:dynamic_batching_apitoken_changelist"),
        {"action": "revoke_tokens", "_selected_action": [t.pk for t in chosen]},
        follow=True,
    )
    assert response.status_code == 200
    assert "Revoked 1 token; 1 were revoked already." in response.content.decode()
    assert {t.state for t in ApiToken.objects.all()} == {"revoked", "expired", "active"}
    assert ApiToken.objects.get(pk=tokens["working"].pk).state == "revoked"
    assert ApiToken.objects.get(pk=tokens["revoked"].pk).revoked_at == revoked_at
    assert ApiToken.objects.get(pk=tokens["bob"].pk).state == "active"


# --- passwords --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("password", "why"),
    [
        ("short", "too short"),
        ("1234567890123", "entirely numeric"),
        ("password123", "too common"),
        ("alice-liddell", "too similar to the username"),
    ],
)
def test_weak_passwords_are_refused(password: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        validate_password(password, user=User(username="alice-liddell"))


def test_a_long_uncommon_password_passes() -> None:
    validate_password("correct horse battery staple", user=User(username="alice"))
