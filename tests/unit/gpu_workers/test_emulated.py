"""The emulated accelerator's arithmetic and its one-batch-at-a-time rule, with a
recorded wait instead of sleeping (issue 40)."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest

from dynamic_batching.gpu_workers.models.emulated import EmulatedAcceleratorRunner, EmulatedAcceleratorSpec, answer
from dynamic_batching.gpu_workers.models.synthetic import SyntheticSpec


class FakeTime:
    """The runner's clock and its wait: each wait is recorded and moves the clock on by
    what was asked, plus `late` (a host thread that wakes late)."""

    def __init__(self, waits: list[float], late: float = 0.0) -> None:
        self.waits, self.late, self.now = waits, late, 100.0

    def wait(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds + self.late

    def clock(self) -> float:
        return self.now


def runner(waits: list[float], late: float = 0.0, **options: Any) -> EmulatedAcceleratorRunner:
    fake = FakeTime(waits, late)
    return EmulatedAcceleratorRunner(
        "cpu:0",
        options.get("spec", SyntheticSpec()),  # counts a text's words + 2
        overhead_s=options.get("overhead_s", 0.002),
        per_token_s=options.get("per_token_s", 4e-6),
        dim=options.get("dim", 384),
        wait=fake.wait,
        clock=fake.clock,
    )


def test_a_batch_costs_the_overhead_and_its_padded_tokens_and_counts_as_busy() -> None:
    waits: list[float] = []
    r = runner(waits)
    texts = ["one two three", "four", "five six seven eight nine ten"]  # 5, 3, 8 tokens
    out = r.run_batch(texts)
    padded = 3 * 8
    assert math.isclose(sum(waits), 0.002 + padded * 4e-6)
    assert math.isclose(r.device_busy_s, sum(waits))
    assert r.batch_seconds(padded) == pytest.approx(0.002 + padded * 4e-6)
    assert [len(v) for v in out] == [384, 384, 384]
    assert out[0] == answer(texts[0], 384) and math.isclose(sum(x * x for x in out[0]), 1.0, rel_tol=1e-6)


def test_a_long_batch_waits_in_slices_it_can_yield_between() -> None:
    waits: list[float] = []
    r = runner(waits, overhead_s=0.012, per_token_s=0.0)
    r.run_batch(["x"])
    assert waits == pytest.approx([0.005, 0.005, 0.002])


def test_a_host_that_wakes_late_does_not_make_the_device_slower_than_its_cost() -> None:
    # A device runs its batch in its own time, however late the host thread that waits
    # on it wakes between slices (sleep overshoots about 0.1 ms a 5 ms slice idle here,
    # more under load): the batch ends after its cost plus at most one late wake, and
    # only the cost counts as busy. Counting each slice as asked made a 50 ms batch run
    # 53.8 ms (bench/idle_legs.py) and the device look idle for the difference.
    waits: list[float] = []
    r = runner(waits, late=0.001, overhead_s=0.012, per_token_s=0.0)
    r.run_batch(["x"])
    assert waits == pytest.approx([0.005, 0.005])
    assert r.device_busy_s == pytest.approx(0.012)


def test_options_are_checked_with_what_to_do() -> None:
    with pytest.raises(ValueError, match="overhead_ms must be a finite number >= 0"):
        EmulatedAcceleratorSpec(of="minilm", overhead_ms=-1)
    with pytest.raises(ValueError, match="dim must be a whole number"):
        EmulatedAcceleratorSpec(of="minilm", dim=0)
    with pytest.raises(ValueError, match="of must name another model"):
        EmulatedAcceleratorSpec.from_config("gpu", {"of": "gpu"})


def test_one_batch_at_a_time_per_device() -> None:
    entered: list[str] = []
    release = threading.Event()

    now = [0.0]

    def wait(seconds: float) -> None:
        entered.append(threading.current_thread().name)
        if threading.current_thread().name == "first":
            release.wait(10)
        now[0] += seconds

    r = EmulatedAcceleratorRunner(
        "cpu:0", SyntheticSpec(), overhead_s=0.001, per_token_s=0.0, wait=wait, clock=lambda: now[0]
    )
    first = threading.Thread(target=r.run_batch, args=(["a"],), name="first")
    second = threading.Thread(target=r.run_batch, args=(["b"],), name="second")
    first.start()
    while not entered:
        threading.Event().wait(0.001)
    second.start()
    second.join(0.2)
    assert entered == ["first"] and second.is_alive(), "the second batch ran while the first held the device"
    release.set()
    first.join(5)
    second.join(5)
    assert entered == ["first", "second"]


def test_declared_in_batching_models_it_counts_the_real_models_tokens() -> None:
    from dynamic_batching.gpu_workers.models import build, get_spec

    spec = build(
        "minilm-gpu", {"spec": "dynamic_batching.gpu_workers.models.emulated.EmulatedAcceleratorSpec", "of": "minilm"}
    )
    real = get_spec("minilm")
    text = "The quick brown fox jumps over the lazy dog"
    assert spec.count_tokens(text) == real.count_tokens(text)
    assert spec.max_tokens == real.max_tokens
    with pytest.raises(ValueError, match="empty"):
        spec.validate_input("   ")


def test_prepare_does_the_host_share_off_the_device_and_the_run_only_waits() -> None:
    counted: list[str] = []

    class Counting(SyntheticSpec):
        def count_tokens(self, text: str) -> int:
            counted.append(text)
            return super().count_tokens(text)

    waits: list[float] = []
    r = runner(waits, spec=Counting(), overhead_s=0.002, per_token_s=4e-6)
    texts = ["one two three", "four"]
    r.prepare(texts)
    assert counted == texts and not waits
    counted.clear()
    out = r.run_batch(texts)
    assert counted == [], "the run counted tokens again"
    assert out == [answer(t, 384) for t in texts]
    assert math.isclose(sum(waits), 0.002 + 2 * 5 * 4e-6)
    # Used once: the same texts run again (a half of a split batch) are counted again.
    r.run_batch(texts[:1])
    assert counted == texts[:1]


def test_the_emulated_device_runs_beside_the_host_whatever_its_device_name() -> None:
    """So its batches are handed on as an accelerator's are (gpu_workers/device_lock.py),
    while a model on a CPU device, whose work is the host's own cores, is not."""
    assert runner([]).runs_beside_the_host is True
    assert SyntheticSpec().load("cpu:0").runs_beside_the_host is False
