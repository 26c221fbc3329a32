"""A flood of refused logins is answered on the event loop (issue 42, finding 1): once
this web process knows an address is past its failed-login limit, the site's ASGI
application refuses that address's login POSTs itself, with no thread, body or Django,
the way LoginThrottle refuses them a step later. Measured, a refused login cost the web
2.7 ms of CPU through Django (bench/login_flood.py prints it)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from batching_site import logins
from batching_site.asgi import application


class Site:
    """The application behind the gate: records what reached it."""

    def __init__(self) -> None:
        self.reached: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"site"})


def call(app: Any, method: str, path: str, client: str, headers: list[tuple[bytes, bytes]] = ()) -> dict[str, Any]:
    scope = {"type": "http", "method": method, "path": path, "client": (client, 40000), "headers": list(headers)}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return {
        "status": sent[0]["status"],
        "headers": dict(sent[0]["headers"]),
        "body": b"".join(m.get("body", b"") for m in sent[1:]),
    }


def gate_for(site: Any) -> logins.LockedAddressGate:
    """The gate with a hold that returns at once (the tests of the hold say how long)."""

    async def no_wait(seconds: float) -> None:
        return None

    return logins.LockedAddressGate(site, sleep=no_wait)


def lock(address: str, seconds: float = 120) -> None:
    logins._locked.remember(f"{logins.LOGIN_FAILURES_PREFIX}addr:{address}", seconds, True)


@pytest.mark.parametrize("path", ["/login/", "/admin/login/"])
def test_a_login_from_an_address_known_to_be_locked_never_reaches_the_site(path: str) -> None:
    site = Site()
    gate = gate_for(site)
    lock("198.51.100.9")
    answer = call(gate, "POST", path, "198.51.100.9")
    assert answer["status"] == 429 and site.reached == []
    assert 1 <= int(answer["headers"][b"retry-after"]) <= 120
    assert answer["headers"][b"content-type"] == b"application/json"
    assert answer["headers"][b"x-content-type-options"] == b"nosniff"
    assert "too many failed logins" in json.loads(answer["body"])["detail"]


def test_the_address_is_the_front_doors_x_forwarded_for_as_for_a_django_request() -> None:
    site = Site()
    gate = gate_for(site)
    lock("203.0.113.5")
    through_proxy = [(b"x-forwarded-for", b"10.9.9.9, 203.0.113.5")]
    assert call(gate, "POST", "/login/", "127.0.0.1", through_proxy)["status"] == 429
    # The proxy itself, and another caller through it, are not locked.
    assert call(gate, "POST", "/login/", "127.0.0.1")["status"] == 200
    assert call(gate, "POST", "/login/", "127.0.0.1", [(b"x-forwarded-for", b"192.0.2.1")])["status"] == 200
    assert site.reached == ["/login/", "/login/"]


def test_everything_else_goes_to_the_site() -> None:
    site = Site()
    gate = gate_for(site)
    lock("198.51.100.9")
    assert call(gate, "GET", "/login/", "198.51.100.9")["status"] == 200  # the form itself
    assert call(gate, "POST", "/api/v1/requests", "198.51.100.9")["status"] == 200
    assert call(gate, "POST", "/login/", "198.51.100.10")["status"] == 200  # another address
    lock("198.51.100.11", seconds=-1)  # a lock whose window has passed
    assert call(gate, "POST", "/login/", "198.51.100.11")["status"] == 200
    assert site.reached == ["/login/", "/api/v1/requests", "/login/", "/login/"]


def test_the_site_is_served_behind_the_gate() -> None:
    assert isinstance(application, logins.LockedAddressGate)


def test_a_locked_address_is_answered_only_after_the_hold() -> None:
    """A client that retries without waiting its Retry-After gets each refusal a second
    later, so one that waits for its answers sends a few a second, not hundreds."""
    sent_before_hold: list[int] = []
    answers: list[dict[str, Any]] = []
    asked: list[float] = []

    async def sleep(seconds: float) -> None:
        asked.append(seconds)
        sent_before_hold.append(len(answers))

    gate = logins.LockedAddressGate(Site(), sleep=sleep)
    lock("198.51.100.20")
    answers.append(call(gate, "POST", "/login/", "198.51.100.20"))
    assert asked == [logins.HOLD_S] and logins.HOLD_S >= 1
    assert sent_before_hold == [0] and answers[0]["status"] == 429
    call(gate, "POST", "/login/", "198.51.100.21")  # not locked: passes with no hold
    assert asked == [logins.HOLD_S]


def test_past_the_most_held_at_once_the_rest_are_answered_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logins, "HOLD_AT_MOST", 2)
    lock("198.51.100.30")

    async def run() -> list[int]:
        release = asyncio.Event()

        async def sleep(seconds: float) -> None:
            await release.wait()

        gate = logins.LockedAddressGate(Site(), sleep=sleep)
        finished: list[int] = []

        async def one(i: int) -> None:
            sent: list[dict[str, Any]] = []

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)

            scope = {"type": "http", "method": "POST", "path": "/login/", "client": ("198.51.100.30", 1), "headers": []}
            await gate(scope, None, send)
            assert sent[0]["status"] == 429
            finished.append(i)

        held = [asyncio.create_task(one(i)) for i in range(2)]
        await asyncio.sleep(0)
        await one(2)  # the third: answered while the first two are still held
        assert gate.held == 2
        release.set()
        await asyncio.gather(*held)
        assert gate.held == 0
        return finished

    assert asyncio.run(run()) == [2, 0, 1]
