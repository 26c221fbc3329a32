"""Every URL, every kind of caller: who may call it, and that nobody reads what isn't theirs.

The callers: nobody logged in, user A, user B, a staff user, A's API token, and a revoked
token of A's. A submits a text (and a failing one, so it shows in the stats' recent
failures); then every URL pattern in batching_site/urls.py is called by each caller. The
test asserts the status, and that no body a caller other than A or staff receives holds
A's text or A's request ids. A URL pattern with no row in MATRIX fails the test: a new
URL needs an owner rule here (and in docs/security.md) before it ships.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from celery.result import AsyncResult
from django.test import Client
from django.urls import URLResolver, get_resolver
from django.utils import timezone

from dynamic_batching.gpu_workers.models import model_names
from dynamic_batching.models import ApiToken

pytestmark = [pytest.mark.live, pytest.mark.django_db]

CALLERS = ("anonymous", "user_a", "user_b", "staff", "a_token", "revoked_token")
#: Who may see A's requests.
A_SIDE = {"user_a", "staff", "a_token"}


@dataclass(frozen=True)
class Row:
    method: str
    #: The path, given A's request id.
    path: Callable[[str], str]
    #: Expected status per caller.
    status: dict[str, int]
    body: object = None


def each(anonymous: int, user_a: int, user_b: int, staff: int, a_token: int, revoked_token: int) -> dict[str, int]:
    return dict(zip(CALLERS, (anonymous, user_a, user_b, staff, a_token, revoked_token), strict=True))


SUBMIT = {"text": "a harmless sentence", "priority": "normal"}

#: URL pattern -> its owner rule, as statuses. Pages use the session only, so a token
#: there is nobody; the API takes either.
MATRIX: dict[str, Row] = {
    "": Row("GET", lambda a: "/", each(302, 200, 200, 200, 302, 302)),
    "healthz": Row("GET", lambda a: "/healthz", each(200, 200, 200, 200, 200, 200)),
    "submit": Row("POST", lambda a: "/submit", each(401, 202, 202, 202, 401, 401), SUBMIT),
    "requests/<uuid:request_id>.json": Row("GET", lambda a: f"/requests/{a}.json", each(401, 200, 404, 200, 401, 401)),
    "requests/<uuid:request_id>": Row("GET", lambda a: f"/requests/{a}", each(302, 200, 404, 200, 302, 302)),
    "dashboard/": Row("GET", lambda a: "/dashboard/", each(302, 200, 200, 200, 302, 302)),
    "metrics": Row("GET", lambda a: "/metrics", each(401, 403, 403, 200, 403, 401)),
    "api/v1/openapi.json": Row("GET", lambda a: "/api/v1/openapi.json", each(200, 200, 200, 200, 200, 200)),
    "api/v1/docs": Row("GET", lambda a: "/api/v1/docs", each(200, 200, 200, 200, 200, 200)),
    "api/v1/requests": Row("POST", lambda a: "/api/v1/requests", each(401, 202, 202, 202, 202, 401), SUBMIT),
    "api/v1/requests/<request_id>": Row("GET", lambda a: f"/api/v1/requests/{a}", each(401, 200, 404, 200, 200, 401)),
    "api/v1/models": Row("GET", lambda a: "/api/v1/models", each(401, 200, 200, 200, 200, 401)),
    **{
        f"api/v1/models/{name}/requests": Row(
            "POST",
            lambda a, name=name: f"/api/v1/models/{name}/requests",
            each(401, 202, 202, 202, 202, 401),
            {"input": "a harmless sentence"},
        )
        for name in model_names()
    },
    "api/v1/stats": Row("GET", lambda a: "/api/v1/stats", each(401, 200, 200, 200, 200, 401)),
    "api/v1/": Row("GET", lambda a: "/api/v1/", each(404, 404, 404, 404, 404, 404)),
    # The admin: Django's own rules (active staff, then model permissions); its index
    # stands for every admin URL.
    "admin/": Row("GET", lambda a: "/admin/", each(302, 302, 302, 200, 302, 302)),
    "auth/staff": Row("GET", lambda a: "/auth/staff", each(401, 403, 403, 204, 401, 401)),
    # Staff go on to Flower's host name with a ticket; anybody else logs in first, or not.
    "auth/flower": Row("GET", lambda a: "/auth/flower", each(302, 403, 403, 302, 302, 302)),
    # Only on Flower's host name, and only with a ticket (tests/live/test_flower_host.py).
    "_staff/enter": Row("GET", lambda a: "/_staff/enter", each(404, 404, 404, 404, 404, 404)),
    "login/": Row("GET", lambda a: "/login/", each(200, 200, 200, 200, 200, 200)),
    # Last: it ends the sessions the rows above used.
    "logout/": Row("POST", lambda a: "/logout/", each(302, 302, 302, 302, 302, 302), {}),
}


#: Other methods on a route above, each with its own owner rule.
ALSO: dict[str, Row] = {
    # A's request has finished when this runs: its owner and staff get 409 (nothing to
    # cancel), anybody else the same 404 as for an id that never existed.
    "DELETE api/v1/requests/<request_id>": Row(
        "DELETE", lambda a: f"/api/v1/requests/{a}", each(401, 409, 404, 409, 409, 401)
    ),
}


def url_patterns(patterns: list | None = None, prefix: str = "") -> set[str]:
    """Every route of the site, through every include (batching's, and the API's within
    it), by its full pattern; the admin as one."""
    out = set()
    for p in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(p, URLResolver) and p.namespace != "admin":
            out |= url_patterns(p.url_patterns, prefix + str(p.pattern))
        else:
            out.add(prefix + str(p.pattern))
    return out


def test_every_url_pattern_has_an_owner_rule() -> None:
    routes = url_patterns()
    assert routes - MATRIX.keys() == set(), "URLs with no owner rule: add a row to MATRIX and to docs/security.md"
    assert MATRIX.keys() - routes == set(), "rows for URLs that no longer exist"
    assert {k.split(" ", 1)[1] for k in ALSO} <= routes


@pytest.fixture
def clients(django_user_model) -> dict[str, Client]:  # type: ignore[no-untyped-def]
    a = django_user_model.objects.create_user("user-a")
    b = django_user_model.objects.create_user("user-b")
    staff = django_user_model.objects.create_user("staff-s", is_staff=True)
    out = {"anonymous": Client()}
    for name, user in (("user_a", a), ("user_b", b), ("staff", staff)):
        c = Client()
        c.force_login(user)
        out[name] = c
    out["a_token"] = Client(headers={"Authorization": f"Bearer {ApiToken.objects.issue(a, name='matrix')[1]}"})
    revoked, raw = ApiToken.objects.issue(a, name="revoked")
    revoked.revoked_at = timezone.now()
    revoked.save()
    out["revoked_token"] = Client(headers={"Authorization": f"Bearer {raw}"})
    return out


def call(client: Client, row: Row, a_id: str):  # type: ignore[no-untyped-def]
    path = row.path(a_id)
    if row.method == "POST":
        return client.post(path, data=json.dumps(row.body), content_type="application/json")
    if row.method == "DELETE":
        return client.delete(path)
    return client.get(path)


def test_a_user_who_is_not_staff_logs_in_on_the_sites_own_form(django_user_model) -> None:  # type: ignore[no-untyped-def]
    # The admin's login form takes staff only; /login/ takes every active user.
    django_user_model.objects.create_user("plain-user", password="a-plain-password-42")
    browser = Client()
    assert browser.get("/").status_code == 302
    reply = browser.post("/login/", {"username": "plain-user", "password": "a-plain-password-42", "next": "/"})
    assert reply.status_code == 302 and reply["Location"] == "/"
    assert browser.get("/").status_code == 200
    assert browser.post("/logout/").status_code == 302 and browser.get("/").status_code == 302


def test_authorization_matrix(live_system: object, clients: dict[str, Client]) -> None:
    secret = f"alpha secret {uuid.uuid4().hex}"
    a = clients["user_a"]
    reply = a.post(
        "/api/v1/requests",
        data=json.dumps({"texts": [secret, f"!fail {secret}"], "model": "synthetic"}),
        content_type="application/json",
    )
    assert reply.status_code == 202, reply.content
    a_id, a_failing = reply.json()["ids"]
    for task_id in (a_id, a_failing):
        AsyncResult(task_id).get(timeout=60, propagate=False)

    # What A and staff do see: the answer, and A's failure among the stats' recent ones.
    assert a.get(f"/api/v1/requests/{a_id}").json()["status"] == "SUCCESS"
    for caller in ("user_a", "staff"):
        failed = [e["id"] for e in clients[caller].get("/api/v1/stats").json()["recent"]["failed"]]
        assert a_failing in failed, caller
    assert "clients" in clients["staff"].get("/api/v1/stats").json()
    assert "clients" not in a.get("/api/v1/stats").json()

    seen: dict[tuple[str, str], int] = {}
    rows = {**MATRIX, **ALSO}
    logout = rows.pop("logout/")  # last: it ends the sessions the others use
    for route, row in [*rows.items(), ("logout/", logout)]:
        for caller in CALLERS:
            response = call(clients[caller], row, a_id)
            seen[(route, caller)] = response.status_code
            body = response.content.decode(errors="replace")
            if caller not in A_SIDE:
                for leaked in (secret, a_id, a_failing):
                    assert leaked not in body, f"{caller} read A's {leaked!r} at {route}"
    every = {**MATRIX, **ALSO}
    wrong = {k: (v, every[k[0]].status[k[1]]) for k, v in seen.items() if v != every[k[0]].status[k[1]]}
    assert wrong == {}, "(route, caller): (got, expected)"
