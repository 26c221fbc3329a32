"""Your model, not ours: models built on the spot (tests/tiny_models.py) in a temporary
folder, and a module factory in a file outside the repository, declared only through
the environment (BATCHING_MODELS as JSON, PYTHONPATH), served by the system as
`make run` starts it. Their answers through the whole pipeline, and over HTTP with
each model's own schema, equal calling each model on each input alone."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import apply_policy
from polling import poll_until
from systems import running
from tiny_models import Direct, TinyModels, batching_models, max_diff
from tiny_models import build as build_tiny_models
from webapi import api_token, http

from batching_site.harness import LocalSystem
from batching_site.processes import program_name
from dynamic_batching.core.policy import BatchPolicy
from dynamic_batching.edge.client import details, submit_many

pytestmark = pytest.mark.live

MAX_TOKENS = 64
DEVICE = "cpu:0"
LONG = " ".join(f"sentence {i} is about padding, batching and the latency of small models." for i in range(12))
TEXTS = [f"text {i}: " + "more words " * (i * 3 % 23) for i in range(14)] + ["中文 and 🚀", LONG]
PAIRS = [[f"query {i}", f"passage {i} " + "about batching " * (i * 5 % 19)] for i in range(12)] + [
    ["what is dynamic batching?", LONG]  # over the limit: the edge cuts the passage
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModels]:
    models = build_tiny_models(tmp_path_factory.mktemp("tiny-models"))
    sys.path.insert(0, str(models.module_dir))  # this process counts the module's tokens too
    yield models
    sys.path.remove(str(models.module_dir))


@pytest.fixture(scope="module")
def declared(tiny: TinyModels) -> dict[str, dict[str, Any]]:
    models = batching_models(tiny, max_tokens=MAX_TOKENS)
    models["tiny-classifier"]["probe"] = True
    return models


@pytest.fixture(scope="module")
def system(tiny: TinyModels, declared: dict[str, dict[str, Any]]) -> Iterator[LocalSystem]:
    path = [str(tiny.module_dir), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {
        "BATCHING_MODELS": json.dumps(declared),
        "BATCHING_DEFAULT_MODEL": "tiny-classifier",
        "PYTHONPATH": os.pathsep.join(path),
        "TORCH_THREADS": "1",
    }
    with running(LocalSystem(devices=[DEVICE], preload=",".join(declared), web=True, env=env), timeout=120) as s:
        # Inputs over a model's limit are cut at the edge; the reranker's batches are
        # capped at 4 of its own (a policy per model), the others' at 32.
        apply_policy(
            BatchPolicy(oversized="truncate", max_wait_ms=50, per_model={"tiny-reranker": {"max_batch_size": 4}})
        )
        yield s


@pytest.fixture
def here(batching_settings: Any, declared: dict[str, dict[str, Any]]) -> None:
    """This process submits too: it must know the same models."""
    batching_settings(MODELS=declared, DEFAULT_MODEL="tiny-classifier")


@pytest.fixture(scope="module")
def direct(tiny: TinyModels) -> Direct:
    return Direct(tiny, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def token(system: LocalSystem) -> str:
    return api_token(system)


def test_answers_through_the_pipeline_equal_direct_calls(system: LocalSystem, here: None, direct: Direct) -> None:
    calls = {
        "tiny-classifier": (TEXTS, direct.classify),
        "tiny-reranker": (PAIRS, direct.rerank),
        "tiny-embedder": (TEXTS, direct.embed),
        "tiny-module": (TEXTS, direct.run_module),
    }
    # All at once, so that they queue while the device is busy and batch up.
    sent = {name: submit_many(inputs, model=name) for name, (inputs, _) in calls.items()}
    for name, (inputs, call) in calls.items():
        sizes = []
        for value, result in zip(inputs, sent[name], strict=True):
            answer = result.get(timeout=60)
            diff = max_diff(answer, call(value))
            assert diff < 1e-4, (name, value, diff)
            sizes.append(details(result)["batch_size"])
        assert max(sizes) > 1, f"{name} never ran in a batch of more than one: {sizes}"
        if name == "tiny-reranker":
            assert max(sizes) <= 4, sizes
    assert details(sent["tiny-classifier"][-1])["truncated"] is True


def test_the_device_worker_logged_the_probed_budget(system: LocalSystem) -> None:
    log = system.logs(program_name(DEVICE))
    assert "model tiny-classifier on cpu:0: a padded-token budget of" in log
    assert "model tiny-reranker on cpu:0: a padded-token budget" not in log


def _wait_answer(system: LocalSystem, token: str, request_id: str) -> Any:
    def finished() -> dict[str, Any] | None:
        status, body = http(system, "GET", f"/api/v1/requests/{request_id}", token=token)
        return body if status == 200 and body["status"] in ("SUCCESS", "FAILURE") else None

    body = poll_until(finished, f"request {request_id} to finish", timeout=60, interval=0.05)
    assert body["status"] == "SUCCESS", body
    return body["result"]


def test_the_classifier_and_the_reranker_answer_over_http_in_their_own_shapes(
    system: LocalSystem, token: str, direct: Direct
) -> None:
    texts = ["a wonderful day", "a terrible, horrible, no good day at all"]
    status, body = http(system, "POST", "/api/v1/models/tiny-classifier/requests", {"inputs": texts}, token=token)
    assert status == 202, body
    for text, request_id in zip(texts, body["ids"], strict=True):
        answer = _wait_answer(system, token, request_id)
        assert set(answer) == {"label", "score", "scores"} and max_diff(answer, direct.classify(text)) < 1e-4

    pair = ["what is batching?", "grouping requests into one model call"]
    status, body = http(system, "POST", "/api/v1/models/tiny-reranker/requests", {"input": pair}, token=token)
    assert status == 202, body
    answer = _wait_answer(system, token, body["ids"][0])
    assert set(answer) == {"score"} and max_diff(answer, direct.rerank(pair)) < 1e-4

    # Its schema takes pairs only: a text is refused before it reaches the model.
    for wrong in ("just a text", ["one"], ["a", "b", "c"]):
        status, body = http(system, "POST", "/api/v1/models/tiny-reranker/requests", {"input": wrong}, token=token)
        assert status == 422, (wrong, body)


def _resolve(schema: dict[str, Any], document: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        node: Any = document
        for part in schema["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def _input_schema(document: dict[str, Any], model: str) -> dict[str, Any]:
    operation = document["paths"][f"/api/v1/models/{model}/requests"]["post"]
    body = _resolve(operation["requestBody"]["content"]["application/json"]["schema"], document)
    given = _resolve(body["properties"]["input"], document)
    [schema] = [_resolve(s, document) for s in given.get("anyOf", [given]) if s.get("type") != "null"]
    return schema


def test_the_openapi_document_shows_each_models_operation_and_input(system: LocalSystem, token: str) -> None:
    status, document = http(system, "GET", "/api/v1/openapi.json", token=token)
    assert status == 200
    pair = _input_schema(document, "tiny-reranker")
    assert pair["type"] == "array" and pair["minItems"] == pair["maxItems"] == 2
    assert [item["type"] for item in pair["prefixItems"]] == ["string", "string"]
    assert _input_schema(document, "tiny-classifier")["type"] == "string"
    for model in ("tiny-embedder", "tiny-module"):
        assert f"/api/v1/models/{model}/requests" in document["paths"]

    status, models = http(system, "GET", "/api/v1/models", token=token)
    assert status == 200
    by_name = {m["name"]: m for m in models}  # type: ignore[attr-defined]
    assert set(by_name["tiny-classifier"]["output"]["properties"]) == {"label", "score", "scores"}
    assert by_name["tiny-reranker"]["output"]["required"] == ["score"] and by_name["tiny-classifier"]["default"]


def test_the_models_are_declared_only_in_the_environment(system: LocalSystem, tiny: TinyModels) -> None:
    repo = Path(__file__).resolve().parents[2]
    assert not tiny.module_dir.is_relative_to(repo)
