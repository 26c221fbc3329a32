"""Fuzzing the JSON API: no input, valid or not, gets a 500.

Two fuzzers, both through Django's WSGI app in this process:
- schemathesis reads /api/v1/openapi.json and sends valid and invalid calls to every
  operation, checking each answer against the schema (status codes it declares,
  content types, bodies);
- hypothesis sends bodies the schema knows nothing about: random bytes, random JSON,
  wrong content types.

Submissions go to a Redis with nothing consuming it (the `bare_redis` fixture), so
valid ones just queue up; past a tier's cap they get 429, which is also allowed.
"""

from __future__ import annotations

import json

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from dynamic_batching.gpu_workers.models import model_names
from dynamic_batching.models import ApiToken

pytestmark = pytest.mark.django_db

ALLOWED = {202, 400, 401, 403, 413, 422, 429}


@pytest.fixture
def token(django_user_model) -> str:  # type: ignore[no-untyped-def]
    return ApiToken.objects.issue(django_user_model.objects.create_user("fuzzer"), name="fuzz")[1]


@pytest.fixture
def api_schema(bare_redis):  # type: ignore[no-untyped-def]
    return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", WSGIHandler())


OPERATIONS = [
    ("/api/v1/requests", "POST"),
    ("/api/v1/requests/{request_id}", "GET"),
    ("/api/v1/requests/{request_id}", "DELETE"),
    ("/api/v1/stats", "GET"),
    ("/api/v1/models", "GET"),
    # One typed operation per configured model.
    *((f"/api/v1/models/{name}/requests", "POST") for name in model_names()),
]


def test_every_operation_is_fuzzed(api_schema) -> None:  # type: ignore[no-untyped-def]
    found = {(op.ok().path, op.ok().method.upper()) for op in api_schema.get_all_operations()}
    assert found == set(OPERATIONS)


# schemathesis.pytest.from_fixture does not run under pytest 9 (it reads a private
# attribute pytest removed), so each operation's strategy is driven by hypothesis here.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
@pytest.mark.parametrize(("path", "method"), OPERATIONS)
def test_schemathesis_finds_no_500_and_no_undeclared_answer(api_schema, token, path, method, mode) -> None:  # type: ignore[no-untyped-def]
    operation = api_schema[path][method]

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(case=operation.as_strategy(generation_mode=mode))
    def call(case) -> None:  # type: ignore[no-untyped-def]
        response = case.call(headers={"Authorization": f"Bearer {token}"})
        case.validate_response(
            response,
            checks=[not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance],
        )

    call()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)
request_like = st.fixed_dictionaries(
    {},
    optional={
        "text": json_values | st.text(max_size=200),
        "texts": st.lists(st.text(max_size=30), max_size=300) | json_values,
        "priority": st.sampled_from(["high", "normal", "low", "", "HIGH"]) | json_values,
        "model": st.sampled_from(["synthetic", "minilm", "nope"]) | json_values,
        "deadline_s": st.floats(allow_nan=True, allow_infinity=True) | json_values,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    body=st.binary(max_size=300)
    | request_like.map(lambda d: json.dumps(d, allow_nan=True).encode())
    | json_values.map(lambda v: json.dumps(v, allow_nan=True).encode()),
    content_type=st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", ""]),
)
def test_hypothesis_bodies_never_get_a_500(bare_redis, token: str, body: bytes, content_type: str) -> None:  # type: ignore[no-untyped-def]
    api = Client(headers={"Authorization": f"Bearer {token}"})
    response = api.post("/api/v1/requests", data=body, content_type=content_type)
    assert response.status_code in ALLOWED, (response.status_code, body, response.content[:300])
    assert "detail" in response.json() or response.status_code == 202


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    body=st.binary(max_size=300)
    | request_like.map(lambda d: json.dumps(d, allow_nan=True).encode())
    | json_values.map(lambda v: json.dumps(v, allow_nan=True).encode())
    | st.integers(min_value=1, max_value=200_000).map(lambda n: b"[" * n + b"]" * n),
    content_type=st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", ""]),
)
def test_the_form_path_never_gets_a_500_either(bare_redis, django_user_model, body: bytes, content_type: str) -> None:  # type: ignore[no-untyped-def]
    # The page's /submit: the same submit path and error map as the API, a session user.
    user, _ = django_user_model.objects.get_or_create(username="form-fuzz")
    page = Client()
    page.force_login(user)
    response = page.post("/submit", data=body, content_type=content_type)
    assert response.status_code in ALLOWED, (response.status_code, body[:80], response.content[:300])
    assert "detail" in response.json() or response.status_code == 202
