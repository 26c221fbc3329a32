"""The README's benchmark plots, drawn from a run's results.json.

    .venv/bin/python bench/plots.py bench/out/results.json docs/img    # redraw only

* latency_cdf.png  latency CDFs: 16 client threads, and one request at a time (idle)
* throughput.png   throughput against offered load (closed-loop client threads), with
                   the bare-model ceilings as horizontal lines
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

#: One colour per system, the same in every plot.
COLORS = {
    "pipeline": "tab:blue",
    "pipeline, batching off": "tab:cyan",
    "plain Celery": "tab:orange",
    "celery-batches": "tab:red",
}
HEADLINE_THREADS = 16


def closed_runs(results: dict[str, Any], system: str) -> dict[int, dict[str, Any]]:
    """The closed-loop MiniLM runs of one system, by client threads."""
    return {r["threads"]: r for r in results["runs"] if r["system"] == system and not r.get("kind")}


def draw(results: dict[str, Any], img_dir: Path) -> list[Path]:
    img_dir.mkdir(parents=True, exist_ok=True)
    return [latency_cdf(results, img_dir / "latency_cdf.png"), throughput(results, img_dir / "throughput.png")]


def latency_cdf(results: dict[str, Any], path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    panels = [(HEADLINE_THREADS, f"{HEADLINE_THREADS} client threads (closed loop)"), (1, "one request at a time")]
    for ax, (threads, title) in zip(axes, panels, strict=True):
        for system, color in COLORS.items():
            run = closed_runs(results, system).get(threads)
            if run is None or not run["latencies_ms"]:
                continue
            xs = np.sort(np.asarray(run["latencies_ms"]))
            ys = np.arange(1, len(xs) + 1) / len(xs)
            label = f"{system}  (p50 {run['p50_ms']:.0f} ms, p99 {run['p99_ms']:.0f} ms)"
            ax.step(xs, ys, where="post", color=color, label=label)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1, 2, 5)))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("latency, ms (log scale)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0].set_ylabel("fraction of requests answered")
    fig.suptitle("MiniLM, mixed-length texts: latency from submit to answer")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def throughput(results: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for system, color in COLORS.items():
        runs = closed_runs(results, system)
        if not runs:
            continue
        threads = sorted(runs)
        style = "s" if len(threads) == 1 else "o-"
        ax.plot(threads, [runs[t]["throughput"] for t in threads], style, color=color, label=system)
    ceiling = results["ceiling"]
    for key, style, what in (("best_sorted", "--", "sorted by length"), ("best_unsorted", ":", "arrival order")):
        best = ceiling[key]
        ax.axhline(best["throughput"], color="gray", linestyle=style)
        ax.annotate(
            f"bare model, {what}, batch {best['batch']}: {best['throughput']:.0f}/s",
            (1, best["throughput"]),
            textcoords="offset points",
            xytext=(2, 3),
            fontsize=8,
            color="dimgray",
        )
    ax.set_xscale("log", base=2)
    most = max((t for system in COLORS for t in closed_runs(results, system)), default=32)
    ax.set_xticks([2**i for i in range(most.bit_length())])
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("client threads, each waiting for its answer (offered load)")
    ax.set_ylabel("texts per second")
    ax.set_ylim(bottom=0)
    ax.set_title("MiniLM, mixed-length texts, 2 CPU cores")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    for p in draw(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])):
        print(p)
