"""The staff gate the front door asks before Flower: 204 for active staff, 401 for no
session, 403 for everyone else, never cached."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.test import RequestFactory

from batching_site.gate import staff_gate


@pytest.mark.parametrize(
    ("user", "status"),
    [
        (AnonymousUser(), 401),
        (User(username="ann", is_active=True, is_staff=False), 403),
        (User(username="bob", is_active=False, is_staff=True), 403),
        (User(username="op", is_active=True, is_staff=True), 204),
        (User(username="root", is_active=True, is_staff=True, is_superuser=True), 204),
    ],
)
def test_the_gate_answers_by_who_is_asking(user: object, status: int) -> None:
    request = RequestFactory().get("/auth/staff", HTTP_X_FORWARDED_URI="/flower/")
    request.user = user
    response = staff_gate(request)
    assert response.status_code == status
    assert response.content == b""
    assert "no-store" in response["Cache-Control"]


def test_the_gate_only_reads() -> None:
    request = RequestFactory().post("/auth/staff")
    request.user = User(username="op", is_active=True, is_staff=True)
    assert staff_gate(request).status_code == 405
