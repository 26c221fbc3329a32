"""bench/accelerator.py's report: the table and its targets, and its place in the page."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from bench import accelerator


def _row(variant: str, callers: str, rate: float, p99: float) -> dict[str, object]:
    nan = float("nan")
    return {
        "variant": variant, "callers": callers, "rate": rate, "ceiling": 200.0, "duty": 0.9,
        "gap_p50_ms": 1.0, "gap_p99_ms": 2.0, "batch": 8.0, "p50_ms": 50.0, "p99_ms": p99, "cpu": 0.5,
    } if variant == "overlap" else {
        "variant": variant, "callers": callers, "rate": rate, "ceiling": 200.0, "duty": nan,
        "gap_p50_ms": nan, "gap_p99_ms": nan, "batch": nan, "p50_ms": 60.0, "p99_ms": p99, "cpu": 0.2,
    }  # fmt: skip


def test_the_targets_compare_throughput_at_each_best_and_p99_at_the_same_load() -> None:
    rows = [
        _row("overlap", "1", 15, 100), _row("overlap", "64", 180, 600),
        _row("plain Celery", "1", 16, 110), _row("plain Celery", "64", 30, 2000),
    ]  # fmt: skip
    spec = SimpleNamespace(overhead_s=0.05, per_token_s=150e-6, count_tokens=lambda t: 15)
    args = SimpleNamespace(overhead_ms=50.0, per_token_us=150.0, variants=["serial", "overlap"])
    text = accelerator.render(rows, args, spec, idle_texts=["a median text"])
    assert "| overlap | 64 | 0.90 |" in text and "| plain Celery | 64 | n/a |" in text
    assert (
        "6.0x plain Celery's best (30 texts/s at 64 callers; target 5x); p99 at 64 callers 600 ms against 2000 ms"
        in text
    )
    assert "idle p50 50.0 ms against one median text's device time 52.3 ms" in text


def test_the_table_goes_between_its_own_markers_and_replaces_what_was_there(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nkept\n")
    accelerator.write(doc, "device-bound", "first")
    accelerator.write(doc, "cpu-bound", "other")
    accelerator.write(doc, "device-bound", "second")
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nkept\n") and "first" not in text
    assert text.count("second") == 1 and text.count("other") == 1
