"""Failed logins are limited per client address and per username, the admin's login
included: past the limit a login POST gets 429 with Retry-After before any password is
checked (issue 42, finding 1: unlimited attempts, each a PBKDF2 run)."""

from __future__ import annotations

import pytest
from django.contrib.auth import forms
from django.test import Client

from batching_site import logins

pytestmark = [pytest.mark.live, pytest.mark.django_db]

PASSWORD = "the-right-password-42"


def test_a_username_guessed_at_is_refused_past_its_limit_then_cleared_by_success(
    bare_redis, django_user_model, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    django_user_model.objects.create_user("target", password=PASSWORD, is_staff=True)
    guesser = Client(REMOTE_ADDR="198.51.100.7")
    for _ in range(logins.PER_USERNAME):
        assert guesser.post("/login/", {"username": "target", "password": "wrong"}).status_code == 200
    checks = []
    monkeypatch.setattr(forms, "authenticate", lambda *a, **k: checks.append(k) or None)
    refused = guesser.post("/admin/login/", {"username": "target", "password": PASSWORD})
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert "too many failed logins" in refused.json()["detail"]
    assert checks == [], "a refused login was checked (PBKDF2) all the same"
    monkeypatch.undo()
    # The right user from elsewhere is still refused for that username, until the window ends.
    assert (
        Client(REMOTE_ADDR="203.0.113.1").post("/login/", {"username": "target", "password": PASSWORD}).status_code
        == 429
    )


def test_one_address_is_refused_past_its_limit_whatever_username_it_tries(bare_redis, django_user_model) -> None:  # type: ignore[no-untyped-def]
    django_user_model.objects.create_user("someone", password=PASSWORD)
    flood = Client(REMOTE_ADDR="198.51.100.8")
    for i in range(logins.PER_ADDRESS):
        flood.post("/login/", {"username": f"nobody-{i}", "password": "x"})
    assert flood.post("/login/", {"username": "someone", "password": PASSWORD}).status_code == 429
    # Behind the front door the address is the proxy's X-Forwarded-For, not the proxy's own.
    assert (
        Client(REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.8")
        .post("/login/", {"username": "someone", "password": PASSWORD})
        .status_code
        == 429
    )
    other = Client(REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="192.0.2.50")
    assert other.post("/login/", {"username": "someone", "password": PASSWORD}).status_code == 302


def test_concurrent_guesses_get_exactly_the_limits_password_checks(bare_redis) -> None:  # type: ignore[no-untyped-def]
    # Attempts are counted before their password is checked, in one atomic step: 40
    # guesses at once for one username let exactly PER_USERNAME through. Counting the
    # failures after the check let 8 of a 4-thread flood through (bench/login_flood.py).
    from concurrent.futures import ThreadPoolExecutor

    from django.test import RequestFactory

    def attempt(i: int) -> int | None:
        request = RequestFactory().post("/login/", REMOTE_ADDR=f"192.0.2.{i}")
        return logins.refused_for(request, "many-guessers")

    with ThreadPoolExecutor(8) as pool:
        waits = list(pool.map(attempt, range(40)))
    assert waits.count(None) == logins.PER_USERNAME


def test_an_address_that_keeps_trying_a_locked_username_is_locked_itself(bare_redis) -> None:  # type: ignore[no-untyped-def]
    # Refusals for a username this process remembers are answered without Redis, so
    # they never reached the address's count there: a flood at one username stayed on
    # Django's path (2.2 ms of web CPU each) and never reached LockedAddressGate.
    flood = Client(REMOTE_ADDR="198.51.100.20")
    statuses = [
        flood.post("/login/", {"username": "one-target", "password": "x"}).status_code
        for _ in range(logins.PER_USERNAME + logins.PER_ADDRESS)
    ]
    assert statuses.count(200) == logins.PER_USERNAME and statuses.count(429) == logins.PER_ADDRESS
    assert logins._locked.recall(logins._key_of_address("198.51.100.20")) is not None
    # Another address trying another username is not held to it.
    other = Client(REMOTE_ADDR="198.51.100.21")
    assert other.post("/login/", {"username": "someone-else", "password": "x"}).status_code == 200
