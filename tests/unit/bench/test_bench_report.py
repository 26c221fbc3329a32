"""`make bench`'s report and plots, rendered from recorded runs' results (trimmed):
the page it writes has every target row, and the plots are drawn, without measuring."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bench import plots, report

RESULTS = Path(__file__).parent / "data" / "bench_results.json"


def test_every_target_row_is_computed_from_the_results() -> None:
    results = json.loads(RESULTS.read_text())
    rows = {measure: (ratio, met) for measure, _how, ratio, _target, met in report.targets(results)}
    # Nine rows for the harness, and five for the `make run` system (its rows in the data
    # come from a later run than the rest).
    assert len(rows) == 14
    pipe16 = next(r for r in results["runs"] if r["system"] == "pipeline" and r["threads"] == 16 and not r.get("kind"))
    plain16 = next(
        r for r in results["runs"] if r["system"] == "plain Celery" and r["threads"] == 16 and not r.get("kind")
    )
    ratio, met = rows["throughput vs plain Celery (one task per request)"]
    assert ratio == pipe16["throughput"] / plain16["throughput"]
    assert met == (ratio >= 1.6)
    # The peak rows take each system's best client count.
    peak = max(r["throughput"] for r in results["runs"] if r["system"] == "pipeline" and not r.get("kind"))
    ceiling = results["ceiling"]["best_sorted"]["throughput"]
    assert rows["peak throughput (best client count) vs the ceiling"][0] == peak / ceiling
    # The `make run` system's no-op rate against plain Celery's no-op tasks.
    made_noop = next(r for r in results["runs"] if r["system"] == "make run" and r.get("kind") == "noop")
    plain_noop = next(r for r in results["runs"] if r["system"] == "plain Celery" and r.get("kind") == "noop")
    ratio, met = rows["`make run`: no-op throughput vs plain Celery no-op tasks/s"]
    assert ratio == made_noop["throughput"] / plain_noop["throughput"] and met == (ratio >= 4.0)


def test_results_without_a_make_run_no_op_row_still_render() -> None:
    results = json.loads(RESULTS.read_text())
    results["runs"] = [r for r in results["runs"] if not (r["system"] == "make run" and r.get("kind") == "noop")]
    assert len(report.targets(results)) == 13


def test_render_rewrites_only_the_generated_section(tmp_path: Path) -> None:
    results = json.loads(RESULTS.read_text())
    doc = tmp_path / "benchmarks.md"
    doc.write_text(
        f"# Benchmarks\n\nhand-written intro\n\n{report.START}\nold numbers\n{report.END}\n\nhand-written notes\n"
    )
    images = plots.draw(results, tmp_path / "img")
    assert [p.name for p in images] == ["latency_cdf.png", "throughput.png"]
    assert all(p.stat().st_size > 10_000 for p in images)
    report.write(results, doc, images)
    text = doc.read_text()
    assert "hand-written intro" in text and "hand-written notes" in text and "old numbers" not in text
    assert "| idle p50 vs plain Celery's idle p50 |" in text
    assert "make bench" in text
    shutil.rmtree(tmp_path / "img")
