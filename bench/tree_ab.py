"""Did the code change, or the machine? The same closed-loop run from two trees, alternated.

    .venv/bin/python bench/tree_ab.py 79dd912               # that commit against this tree
    .venv/bin/python bench/tree_ab.py 79dd912 --rounds 3 --texts 2000
    .venv/bin/python bench/tree_ab.py 79dd912 --make-run    # make run's process set

A ratio recorded on another day compares two machines as much as two trees: on a shared
or changed machine plain Celery and the pipeline move by different amounts. This checks
out `rev` in a temporary worktree (using this tree's .venv), then runs the harness
pipeline (collector and two single-threaded MiniLM device workers, as `make bench`)
from each tree in turn, `--rounds` times: 16 callers each calling `submit(text).get()`
over the same texts. It prints texts/s and CPU ms a text (counted as `make bench` counts it,
and by process: the client is this one) for each run. `--make-run` runs the process set
`make run` starts instead (web, Flower, INFO logging: bench/run_all.py::make_run_system).
The two trees must share `bench.workload`, `bench.run_all.redis_server` and
`LocalSystem`, as every tree since issue 16 does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CALLERS = 16


def measure(tree: Path, n_texts: int, make_run: bool = False) -> None:
    """One run, importing everything from `tree`. Prints one line."""
    os.chdir(tree)
    sys.path.insert(0, str(tree))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
    import django

    django.setup()
    from batching_site.harness import LocalSystem
    from bench.cpu import by_process
    from bench.run_all import _publish_and_wait, make_run_system, redis_server
    from bench.workload import closed_loop, corpus
    from dynamic_batching.edge.client import submit
    from dynamic_batching.store import shared_state
    from dynamic_batching.store.connection import connect

    texts = corpus(n_texts + 100)
    logs = Path(tempfile.mkdtemp(prefix="tree-ab-"))
    with redis_server(logs) as (base, redis_pid):
        url = f"{base}/0"
        if make_run:
            system = make_run_system(url, logs)
        else:
            system = LocalSystem(
                devices=["cpu:0", "cpu:1"],
                preload="minilm",
                env={"TORCH_THREADS": "1"},
                redis_url=url,
                log_dir=str(logs),
            )
        with system:
            connect(url)
            policy = shared_state.read_policy()
            _publish_and_wait(shared_state, policy.evolve(oversized="truncate", version=policy.version + 1))

            def call(text: str) -> object:
                return submit(text).get(timeout=120)

            closed_loop("warm-up", call, texts[:100], CALLERS)
            # What make bench counts: the system's processes, Redis and this client.
            pids = {**system.pids(), "redis": redis_pid}
            before = by_process(pids)
            run = closed_loop("pipeline", call, texts[100:], CALLERS)
            after = by_process(pids)
            each = {name: 1000 * (after[name] - before[name]) / len(run.latencies_s) for name in after}
    parts = ", ".join(f"{name} {ms:.2f}" for name, ms in sorted(each.items()) if ms >= 0.01)
    print(f"{run.throughput:.1f} texts/s  {sum(each.values()):.2f} CPU ms/text ({parts})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rev", nargs="?", help="the git revision to compare this tree with")
    ap.add_argument("--rounds", type=int, default=2, help="runs per tree, alternated")
    ap.add_argument("--texts", type=int, default=1000, help="texts per run")
    ap.add_argument("--make-run", action="store_true", help="make run's process set instead of the harness's")
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        measure(args.measure, args.texts, args.make_run)
        return
    if not args.rev:
        ap.error("name a revision to compare with, e.g. HEAD~5")
    other = Path(tempfile.mkdtemp(prefix="tree-ab-")) / "tree"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(other), args.rev], check=True)
    try:
        (other / ".venv").symlink_to(REPO / ".venv")
        trees = {args.rev: other, "this tree": REPO}
        for k in range(args.rounds):
            for name, tree in trees.items():
                out = subprocess.run(
                    [sys.executable, __file__, "--measure", str(tree), "--texts", str(args.texts)]
                    + (["--make-run"] if args.make_run else []),
                    capture_output=True,
                    text=True,
                )
                line = out.stdout.strip().splitlines()[-1] if out.returncode == 0 else f"failed: {out.stderr[-300:]}"
                print(f"round {k + 1}  {name:<12} {line}", flush=True)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(other)], check=False)


if __name__ == "__main__":
    main()
