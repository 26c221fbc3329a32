"""The serving overhead alone, in about a minute: no model, just the plumbing.

    .venv/bin/python bench/overhead.py                 # pipeline vs plain Celery, no-op work
    .venv/bin/python bench/overhead.py --profile DIR   # and py-spy flame graphs of every process
    .venv/bin/python bench/overhead.py --cores 32      # project the no-op ceiling to 32 cores
    .venv/bin/python bench/overhead.py --make-run      # on make run's process set, Flower included

The two overhead rows of `make bench` (idle round trip and no-op throughput), without
loading MiniLM: our pipeline with the zero-cost `synthetic` model on two device
workers, against a plain Celery no-op task on a 2-process prefork worker. For working
on the hot path; `make bench` is the record.

It also reads each process's CPU per no-op request, and projects the no-op ceiling to a
machine of `--cores` cores (16 by default): the collector (and its standby) and Redis stay
one process each (one core at most), while callers, device workers and pool processes
scale out with the cores (bench/cpu.py::projected_ceiling).

`--make-run` measures the pipeline on the process set `make run` starts (web, Flower,
INFO logging: bench/run_all.py::make_run_system) instead of the harness's, so the CPU
table shows what Flower spends on each request; Flower, one process, is projected as
one core at most too. `BATCHING_TASK_SENT_EVENTS=0` in front of the command measures without the
task-sent events (for the client's requests and the collector's batches).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
# Benchmarks drive the test model `synthetic`, here and in the processes they start.
os.environ.setdefault("BATCHING_TEST_MODELS", "1")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from batching_site.processes import COLLECTORS  # noqa: E402
from bench.cpu import by_process, projected_ceiling  # noqa: E402
from bench.run_all import (  # noqa: E402
    NOOP_THREADS,
    ZERO_COST,
    all_answered,
    joined,
    make_run_system,
    redis_server,
    run_noop_chunk,
)
from bench.workload import bulk, closed_loop, corpus  # noqa: E402
from dynamic_batching.store.connection import client, connect  # noqa: E402


def _profile(pids: dict[str, int], out: Path, seconds: float) -> list[subprocess.Popen[bytes]]:
    """py-spy on each process for `seconds`: a flame graph and collapsed stacks each."""
    out.mkdir(parents=True, exist_ok=True)
    spy = REPO / ".venv/bin/py-spy"
    return [
        subprocess.Popen(
            [
                str(spy),
                "record",
                "-p",
                str(pid),
                "-d",
                str(int(seconds)),
                "--nonblocking",
                "--format",
                fmt,
                "-o",
                str(out / f"{name}.{ext}"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
        for fmt, ext in (("flamegraph", "svg"), ("raw", "txt"))
    ]


def _cpu_report(name: str, before: dict[str, float], after: dict[str, float], n: int, cores: int) -> dict[str, Any]:
    """CPU ms per no-op request by process, and the ceiling projected to `cores` cores."""
    ms = {k: round((after[k] - before[k]) * 1000 / n, 3) for k in before}
    rate, bound = projected_ceiling(ms, cores, ["redis", "flower", *COLLECTORS])
    shown = ", ".join(f"{k} {v:.3f}" for k, v in sorted(ms.items(), key=lambda kv: -kv[1]))
    print(f"{name:<14} CPU ms per no-op request: {shown}; {sum(ms.values()):.3f} in all")
    print(f"{name:<14} projected no-op ceiling at {cores} cores: {rate:,.0f}/s, bound by {bound}")
    return {"cpu_ms": ms, "projected_per_s": round(rate), "bound_by": bound}


def _reset_redis_stats(base: str) -> None:
    client(base).config_resetstat()


def _commands_report(name: str, base: str, n: int) -> dict[str, float]:
    """Redis commands per no-op request, the most frequent first."""
    # Redis's own count of each command run since the last CONFIG RESETSTAT.
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in client(base).info("commandstats").items()}
    calls.pop("config", None)
    per = {k: round(v / n, 2) for k, v in calls.items() if v / n >= 0.01}
    shown = ", ".join(f"{k} {v:g}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))
    print(f"{name:<14} Redis commands per no-op request: {shown}; {sum(per.values()):.2f} in all")
    return per


def _report(name: str, idle: Any, noop: Any) -> dict[str, float]:
    row = {
        "idle_p50_ms": round(idle.percentile_ms(50), 2),
        "idle_p99_ms": round(idle.percentile_ms(99), 2),
        "noop_per_s": round(noop.throughput, 1),
    }
    print(
        f"{name:<14} idle p50 {row['idle_p50_ms']:6.2f} ms  p99 {row['idle_p99_ms']:6.2f} ms  "
        f"no-op {row['noop_per_s']:7.1f}/s"
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle", type=int, default=300, help="sequential requests for the idle round trip")
    parser.add_argument("--noop", type=int, default=4000, help="requests for the no-op throughput")
    parser.add_argument("--only", choices=["pipeline", "plain"], help="measure one system only")
    parser.add_argument("--profile", type=Path, help="write py-spy flame graphs of the no-op run here")
    parser.add_argument("--cores", type=int, default=16, help="project the no-op ceiling to this many cores")
    parser.add_argument(
        "--make-run", action="store_true", help="the pipeline on make run's process set (web, Flower, INFO logging)"
    )
    args = parser.parse_args()
    texts = corpus(max(args.idle, args.noop))
    log_dir = REPO / "bench/out/overhead-logs"
    rows = {}
    cpu: dict[str, dict[str, Any]] = {}
    with redis_server(log_dir) as (base, redis_pid):
        if args.only != "plain":
            from batching_site.harness import LocalSystem
            from dynamic_batching.edge.client import submit

            if args.make_run:
                system = make_run_system(f"{base}/0", log_dir, preload="synthetic", **ZERO_COST)
            else:
                system = LocalSystem(
                    devices=["cpu:0", "cpu:1"],
                    preload="synthetic",
                    env=ZERO_COST,
                    redis_url=f"{base}/0",
                    log_dir=str(log_dir),
                )
            with system:
                connect(f"{base}/0")
                short = [t[:60] for t in texts]
                closed_loop("warm-up", lambda t: submit(t, model="synthetic").get(timeout=30), short[:50], 4)
                idle = closed_loop(
                    "idle", lambda t: submit(t, model="synthetic").get(timeout=30), short[: args.idle], 1
                )
                spies = []
                if args.profile:
                    pids = system.pids() | {"client": os.getpid()}
                    spies = _profile(pids, args.profile / "pipeline", 6)
                procs = {**system.pids(), "redis": redis_pid}
                _reset_redis_stats(base)
                before = by_process(procs)
                noop = bulk(
                    "noop",
                    run_noop_chunk,
                    all_answered,
                    short[: args.noop],
                    NOOP_THREADS,
                )
                after = by_process(procs)
                for s in spies:
                    s.wait()
                shown = "make run" if args.make_run else "pipeline"
                rows["pipeline"] = _report(shown, idle, noop)
                cpu["pipeline"] = _cpu_report(shown, before, after, args.noop, args.cores)
                _commands_report(shown, base, args.noop)
        if args.only != "pipeline":
            from bench.baselines import plain_celery
            from bench.baselines.common import Worker

            app = plain_celery.app
            with Worker(
                "bench.baselines.plain_celery",
                app,
                f"{base}/1",
                args=["-P", "prefork", "-c", "2", "--without-gossip", "--without-mingle", "--without-heartbeat"],
                env={},
                log_path=log_dir / "plain_celery.log",
            ) as worker:
                short = [t[:60] for t in texts]
                closed_loop("warm-up", lambda t: plain_celery.noop.delay(t).get(timeout=30), short[:50], 4)
                idle = closed_loop("idle", lambda t: plain_celery.noop.delay(t).get(timeout=30), short[: args.idle], 1)
                spies = (
                    _profile({"worker": worker.pids()[0], "client": os.getpid()}, args.profile / "plain", 6)
                    if args.profile
                    else []
                )

                def send_many(chunk: list[str]) -> list[Any]:
                    with app.producer_or_acquire() as producer:
                        return [plain_celery.noop.apply_async((t,), producer=producer) for t in chunk]

                procs = {"worker": worker.pids()[0], "redis": redis_pid}
                _reset_redis_stats(base)
                before = by_process(procs)
                noop = bulk("noop", send_many, joined, short[: args.noop], NOOP_THREADS)
                after = by_process(procs)
                for s in spies:
                    s.wait()
                rows["plain"] = _report("plain Celery", idle, noop)
                cpu["plain"] = _cpu_report("plain Celery", before, after, args.noop, args.cores)
                _commands_report("plain Celery", base, args.noop)
    if len(rows) == 2:
        p, c = rows["pipeline"], rows["plain"]
        print(
            f"ratios: idle p50 {p['idle_p50_ms'] / c['idle_p50_ms']:.2f}x (target <= 1.2x)  "
            f"no-op {p['noop_per_s'] / c['noop_per_s']:.2f}x (target >= 4x)"
        )
        pp, cp = cpu["pipeline"]["projected_per_s"], cpu["plain"]["projected_per_s"]
        print(f"projected at {args.cores} cores: no-op {pp:,}/s against {cp:,}/s, {pp / cp:.2f}x")


if __name__ == "__main__":
    main()
