"""Tests for dynamic_batching.gpu_workers.models: the registry, MiniLM and the synthetic model.

No broker and no Django. MiniLM is loaded once per module; everything else is
tokenizer-only or uses the synthetic model with a fake sleep.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynamic_batching.gpu_workers.models import (
    BatchRunner,
    ModelSpec,
    check_device,
    get_spec,
    model_names,
)
from dynamic_batching.gpu_workers.models.minilm import (
    MiniLMRunner,
    MiniLMSpec,
    torch_device_for,
    torch_threads_for,
)
from dynamic_batching.gpu_workers.models.synthetic import (
    DEFAULT_OVERHEAD_S,
    DEFAULT_PER_TOKEN_S,
    PoisonInput,
    SyntheticRunner,
    SyntheticSpec,
    embed,
)

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

REPO_ROOT = Path(__file__).resolve().parents[3]

LONG_TEXT = " ".join(
    f"sentence {i} talks about batching, padding and latency of embedding models on GPUs." for i in range(30)
)
TEXTS = [
    "",
    "hi",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "Café naïve façade — résumé with accents; ÉCOLE in capitals.",
    "中文字符会被逐字切分 and mixed with English",
    "emoji 🚀🔥 and symbols ∑∫√ and tabs\tand\nnewlines",
    "unbelievably antidisestablishmentarianism supercalifragilisticexpialidocious",
    "   leading and trailing whitespace   ",
    "x" * 150,
    " ".join(["medium length text about dynamic batching"] * 10),
    LONG_TEXT,
]


# ---------------------------------------------------------------- registry


def test_model_names() -> None:
    assert model_names() == ["minilm", "synthetic"]


def test_models_come_from_settings_and_bad_ones_name_the_setting(batching_settings) -> None:  # type: ignore[no-untyped-def]
    from django.core.exceptions import ImproperlyConfigured

    batching_settings(
        MODELS={
            "tiny": {"spec": "dynamic_batching.gpu_workers.models.synthetic.SyntheticSpec"},
            "typo": {"spec": "dynamic_batching.gpu_workers.models.nope.Spec"},
            "not-a-spec": {"spec": "json.dumps"},
            "bad-option": {"spec": "dynamic_batching.gpu_workers.models.minilm.MiniLMSpec", "colour": "red"},
        }
    )
    assert get_spec("tiny").name == "tiny" and model_names() == [
        "bad-option",
        "not-a-spec",
        "synthetic",
        "tiny",
        "typo",
    ]
    for name, says in (
        ("typo", "BATCHING['MODELS']['typo']: cannot import spec 'dynamic_batching.gpu_workers.models.nope.Spec'"),
        ("not-a-spec", "BATCHING['MODELS']['not-a-spec']: 'json.dumps' is not a ModelSpec subclass"),
        ("bad-option", "BATCHING['MODELS']['bad-option']: TypeError:"),
    ):
        with pytest.raises(ImproperlyConfigured, match=re.escape(says)):
            get_spec(name)


def test_the_test_model_exists_only_when_turned_on(batching_settings) -> None:  # type: ignore[no-untyped-def]
    batching_settings(TEST_MODELS=False)
    assert model_names() == ["minilm"]
    with pytest.raises(ValueError, match="is a test model and is off here.*BATCHING_TEST_MODELS=1"):
        get_spec("synthetic")


@pytest.mark.parametrize("name", ["minilm", "synthetic"])
def test_get_spec_returns_singleton(name: str) -> None:
    spec = get_spec(name)
    assert isinstance(spec, ModelSpec)
    assert spec.name == name
    assert get_spec(name) is spec


def test_get_spec_singleton_under_threads() -> None:
    with ThreadPoolExecutor(8) as pool:
        specs = list(pool.map(lambda _: get_spec("synthetic"), range(32)))
    assert all(s is specs[0] for s in specs)


@pytest.mark.parametrize("bad", ["", "MiniLM", "bert", " minilm", None, 3, ("minilm",)])
def test_get_spec_unknown(bad: object) -> None:
    with pytest.raises(ValueError) as info:
        get_spec(bad)  # type: ignore[arg-type]
    assert str(info.value) == f"unknown model {bad!r}; choose one of: minilm, synthetic"


def test_max_tokens() -> None:
    assert get_spec("minilm").max_tokens == 256
    assert get_spec("synthetic").max_tokens == 512


@pytest.mark.parametrize("device", ["cpu", "cpu:0", "cpu:1", "cuda", "cuda:0", "cuda:7"])
def test_check_device_ok(device: str) -> None:
    assert check_device(device) == device


@pytest.mark.parametrize("device", ["", "gpu", "cuda:", "cpu:x", "CUDA:0", "mps", None])
def test_check_device_bad(device: object) -> None:
    with pytest.raises(ValueError):
        check_device(device)  # type: ignore[arg-type]


def test_import_and_count_do_not_import_torch() -> None:
    # A fresh interpreter: this test process has torch loaded already.
    code = (
        "import sys\n"
        "import dynamic_batching.gpu_workers.models as m\n"
        "assert m.get_spec('minilm').count_tokens('hello world') == 4\n"
        "assert m.get_spec('minilm').truncate('one two three four', 4)[1] <= 4\n"
        "assert m.get_spec('synthetic').count_tokens('hello world') == 4\n"
        "bad = sorted(n for n in ('torch', 'sentence_transformers', 'transformers') if n in sys.modules)\n"
        "print('HEAVY', bad)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout


# ---------------------------------------------------------------- minilm


@pytest.fixture(scope="module")
def reference_model() -> SentenceTransformer:
    """An independent SentenceTransformer used as the oracle."""
    from sentence_transformers import SentenceTransformer

    from dynamic_batching.gpu_workers.models.minilm import model_dir

    return SentenceTransformer(str(model_dir()), device="cpu")


@pytest.fixture(scope="module")
def minilm_runner() -> Iterator[BatchRunner]:
    runner = get_spec("minilm").load("cpu:0")
    yield runner
    runner.close()


def test_minilm_count_matches_sentence_transformers(
    reference_model: SentenceTransformer,
) -> None:
    spec = get_spec("minilm")
    counts = []
    for text in TEXTS:
        expected = len(reference_model.tokenizer(text)["input_ids"])
        assert spec.count_tokens(text) == expected, text
        counts.append(expected)
    assert max(counts) > 300, "need at least one text beyond the model's 256-token limit"
    assert spec.count_tokens("") == 2


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(text=st.text(max_size=200))
def test_minilm_count_matches_sentence_transformers_fuzz(reference_model: SentenceTransformer, text: str) -> None:
    assert get_spec("minilm").count_tokens(text) == len(reference_model.tokenizer(text)["input_ids"])


def test_minilm_tokenizer_lazy_init_is_thread_safe() -> None:
    spec = MiniLMSpec()
    barrier = threading.Barrier(8)

    def count(_: int) -> int:
        barrier.wait()
        return spec.count_tokens(LONG_TEXT)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(count, range(8)))
    assert len(set(results)) == 1
    assert results[0] > 300


@pytest.mark.parametrize("limit", [2, 3, 5, 17, 128, 256])
def test_minilm_truncate_fits(limit: int) -> None:
    spec = get_spec("minilm")
    cut, n = spec.truncate(LONG_TEXT, limit)
    assert n == spec.count_tokens(cut)
    assert n <= limit
    assert LONG_TEXT.startswith(cut)
    # It should cut as little as possible, not just "something that fits".
    assert n >= limit - 1


def test_minilm_truncate_short_text_unchanged() -> None:
    spec = get_spec("minilm")
    text = "short text"
    assert spec.truncate(text, 256) == (text, spec.count_tokens(text))


def test_minilm_truncate_rejects_tiny_limit() -> None:
    with pytest.raises(ValueError):
        get_spec("minilm").truncate("hello", 1)


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=200), limit=st.integers(min_value=2, max_value=40))
def test_minilm_truncate_fuzz(text: str, limit: int) -> None:
    spec = get_spec("minilm")
    cut, n = spec.truncate(text, limit)
    assert text.startswith(cut)
    assert n == spec.count_tokens(cut) <= limit


def test_torch_device_mapping() -> None:
    assert torch_device_for("cpu") == "cpu"
    assert torch_device_for("cpu:0") == "cpu"
    assert torch_device_for("cpu:1") == "cpu"
    assert torch_device_for("cuda:0") == "cuda:0"
    assert torch_device_for("cuda:3") == "cuda:3"
    with pytest.raises(ValueError):
        torch_device_for("tpu:0")


def test_torch_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.delenv("TORCH_THREADS", raising=False)
    monkeypatch.delenv("DEVICE_COUNT", raising=False)
    assert torch_threads_for() == 16
    monkeypatch.setenv("DEVICE_COUNT", "4")
    assert torch_threads_for() == 4
    monkeypatch.setenv("DEVICE_COUNT", "32")
    assert torch_threads_for() == 1
    monkeypatch.setenv("TORCH_THREADS", "3")
    assert torch_threads_for() == 3


def test_minilm_batched_equals_alone(minilm_runner: BatchRunner, reference_model: SentenceTransformer) -> None:
    assert isinstance(minilm_runner, MiniLMRunner)
    assert minilm_runner.device == "cpu:0"
    texts = TEXTS
    assert max(get_spec("minilm").count_tokens(t) for t in texts) > 256
    batched = minilm_runner.run_batch(texts)
    assert len(batched) == len(texts)
    for text, row in zip(texts, batched, strict=True):
        assert len(row) == 384
        assert all(isinstance(v, float) for v in row)
        assert math.isclose(math.sqrt(sum(v * v for v in row)), 1.0, abs_tol=1e-4)
        alone = reference_model.encode([text], normalize_embeddings=True)[0]
        diff = max(abs(a - b) for a, b in zip(row, alone.tolist(), strict=True))
        assert diff < 1e-4, (text[:40], diff)


def test_minilm_batch_order_and_mates_do_not_matter(minilm_runner: BatchRunner) -> None:
    texts = TEXTS[1:6]
    forward = minilm_runner.run_batch(texts)
    backward = minilm_runner.run_batch(list(reversed(texts)))[::-1]
    with_long_mate = minilm_runner.run_batch([*texts, LONG_TEXT])[:-1]
    for a, b, c in zip(forward, backward, with_long_mate, strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4
        assert max(abs(x - y) for x, y in zip(a, c, strict=True)) < 1e-4


def test_minilm_empty_batch(minilm_runner: BatchRunner) -> None:
    assert minilm_runner.run_batch([]) == []


# ---------------------------------------------------------------- synthetic


class FakeSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


@pytest.fixture
def fake_sleep() -> FakeSleep:
    return FakeSleep()


def _runner(sleep: FakeSleep, **kw: float) -> SyntheticRunner:
    return SyntheticRunner("cpu:0", sleep=sleep, **kw)


def _cost(runner: SyntheticRunner, sleep: FakeSleep, texts: list[str]) -> float:
    """Seconds one batch slept in all: the runner sleeps in slices, like model layers."""
    start = len(sleep.calls)
    runner.run_batch(texts)
    return sum(sleep.calls[start:])


def test_synthetic_tokens() -> None:
    spec = get_spec("synthetic")
    assert spec.count_tokens("") == 2
    assert spec.count_tokens("one") == 3
    assert spec.count_tokens("  one   two\tthree\n") == 5


def test_synthetic_truncate() -> None:
    spec = get_spec("synthetic")
    text = " ".join(f"w{i}" for i in range(100))
    cut, n = spec.truncate(text, 10)
    assert cut == "w0 w1 w2 w3 w4 w5 w6 w7"
    assert n == 10 == spec.count_tokens(cut)
    assert spec.truncate("a b", 10) == ("a b", 4)
    assert spec.truncate("a b c", 2) == ("", 2)
    with pytest.raises(ValueError):
        spec.truncate("a", 1)


def test_synthetic_output_deterministic(fake_sleep: FakeSleep) -> None:
    runner = _runner(fake_sleep)
    texts = ["alpha", "beta gamma", "", "alpha"]
    out = runner.run_batch(texts)
    assert len(out) == 4
    assert out[0] == out[3] == embed("alpha")
    assert out[0] != out[1]
    for row in out:
        assert len(row) == 8
        assert math.isclose(math.sqrt(sum(v * v for v in row)), 1.0, rel_tol=1e-12)
    # Same text, different batch-mates, different device: same answer.
    other = SyntheticRunner("cuda:1", sleep=fake_sleep, slowdown=3.0)
    assert other.run_batch(["zeta", "beta gamma"])[1] == out[1]


def test_synthetic_fail_marker(fake_sleep: FakeSleep) -> None:
    runner = _runner(fake_sleep)
    with pytest.raises(PoisonInput, match="synthetic model refuses input containing !fail: 'bad !fail'"):
        runner.run_batch(["fine", "bad !fail", "also fine"])
    assert issubclass(PoisonInput, ValueError)
    assert runner.run_batch(["fine"]) == [embed("fine")]


def test_synthetic_slow_marker_costs_20x(fake_sleep: FakeSleep) -> None:
    runner = _runner(fake_sleep, overhead_s=0.0)
    plain = _cost(runner, fake_sleep, ["a b c d"])
    slow = _cost(runner, fake_sleep, ["a b c !slow"])  # same token count
    assert plain == pytest.approx(6 * DEFAULT_PER_TOKEN_S)
    assert slow == pytest.approx(20 * plain)


def test_synthetic_padding_cost(fake_sleep: FakeSleep) -> None:
    runner = _runner(fake_sleep)
    long_text = " ".join(["w"] * 98)  # 100 tokens
    one = _cost(runner, fake_sleep, [long_text])
    two = _cost(runner, fake_sleep, [long_text, "short"])
    two_reversed = _cost(runner, fake_sleep, ["short", long_text])
    assert one == pytest.approx(DEFAULT_OVERHEAD_S + 100 * DEFAULT_PER_TOKEN_S)
    assert two == pytest.approx(DEFAULT_OVERHEAD_S + 2 * 100 * DEFAULT_PER_TOKEN_S)
    assert two_reversed == pytest.approx(two)


def test_synthetic_env_knobs(monkeypatch: pytest.MonkeyPatch, fake_sleep: FakeSleep) -> None:
    spec = SyntheticSpec(sleep=fake_sleep)
    monkeypatch.setenv("SYNTHETIC_OVERHEAD_S", "0.5")
    monkeypatch.setenv("SYNTHETIC_PER_TOKEN_S", "0.01")
    monkeypatch.setenv("SYNTHETIC_SLOWDOWN", "2")
    runner = spec.load("cuda:0")
    assert runner.device == "cuda:0"
    assert isinstance(runner, SyntheticRunner)
    assert _cost(runner, fake_sleep, ["a b", "c"]) == pytest.approx(2 * (0.5 + 8 * 0.01))  # 2 texts x 4 tokens
    # Read at load() time: a runner loaded earlier keeps its settings.
    monkeypatch.setenv("SYNTHETIC_SLOWDOWN", "1")
    assert _cost(runner, fake_sleep, ["a b", "c"]) == pytest.approx(2 * (0.5 + 8 * 0.01))
    monkeypatch.setenv("SYNTHETIC_SLOWDOWN", "-1")
    with pytest.raises(ValueError):
        spec.load("cpu")


def test_synthetic_defaults_from_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SYNTHETIC_OVERHEAD_S", "SYNTHETIC_PER_TOKEN_S", "SYNTHETIC_SLOWDOWN"):
        monkeypatch.delenv(var, raising=False)
    runner = get_spec("synthetic").load("cpu:1")
    assert isinstance(runner, SyntheticRunner)
    assert (runner.overhead_s, runner.per_token_s, runner.slowdown) == (
        DEFAULT_OVERHEAD_S,
        DEFAULT_PER_TOKEN_S,
        1.0,
    )
    with pytest.raises(ValueError):
        get_spec("synthetic").load("tpu")


def test_synthetic_empty_and_close(fake_sleep: FakeSleep) -> None:
    runner = _runner(fake_sleep)
    assert runner.run_batch([]) == []
    assert fake_sleep.calls == []
    runner.close()
    runner.close()
    with pytest.raises(RuntimeError):
        runner.run_batch(["x"])


def test_synthetic_really_sleeps_without_gil() -> None:
    # While a runner sleeps in its batch, another thread runs Python, as a second device
    # would. Counted inside one sleep, not timed: a sleep that held the GIL would leave
    # the other thread no turn between its start and its end.
    import threading
    import time

    inside, woke = threading.Event(), threading.Event()

    def sleep(seconds: float) -> None:
        if inside.is_set():
            return
        inside.set()
        time.sleep(0.2)  # the first slice, long enough for the other thread to be scheduled
        woke.set()

    runner = SyntheticRunner("cpu:0", overhead_s=0.05, per_token_s=0.0, sleep=sleep)
    thread = threading.Thread(target=runner.run_batch, args=(["x"],))
    thread.start()
    inside.wait()
    turns = 0
    while not woke.is_set():
        turns += 1
    thread.join()
    assert turns > 0


def test_synthetic_reports_its_progress_between_slices(fake_sleep: FakeSleep) -> None:
    runner = _runner(fake_sleep, overhead_s=0.0)
    shares: list[float] = []
    runner.on_progress = shares.append
    runner.run_batch(["a b c !slow"])  # 6 tokens x 20 x 0.2 ms = 24 ms: five slices
    assert shares == pytest.approx([5 / 24, 10 / 24, 15 / 24, 20 / 24])
