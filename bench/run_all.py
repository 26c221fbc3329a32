"""`make bench`: every benchmark in docs/benchmarks.md, side by side, in one run.

    make bench                                    # the full run (~8 min); rewrites docs/
    .venv/bin/python bench/run_all.py --quick     # a small run for development; bench/out/quick/

In order, each alone on the machine (the previous system's processes are stopped):

1. the ceiling: MiniLM in a bare loop in this process, 2 torch threads;
2. our pipeline (collector + 2 CPU device workers, 1 torch thread each): closed loop at
   1/4/16/32/64 client threads, then batching off (max_batch_size=1), then a no-op model;
3. plain Celery, one task per request (prefork, 2 processes, 1 torch thread each);
4. celery-batches, swept over flush_every x flush_interval, then its best setting.

One Redis server serves all of them, a database each. Every system gets the same
seeded texts (bench/workload.py) and a short untimed warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # runnable as a plain script
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
# Benchmarks drive the test model `synthetic`, here and in the processes they start.
os.environ.setdefault("BATCHING_TEST_MODELS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("LOG_LEVEL", "WARNING")  # here and in every process started from here

import django  # noqa: E402

django.setup()

from tqdm import tqdm  # noqa: E402

from bench import ceiling, plots, report  # noqa: E402
from bench.baselines import batches_app, plain_celery  # noqa: E402
from bench.baselines.common import Worker  # noqa: E402
from bench.cpu import MachineCpu, ProcessCpu  # noqa: E402
from bench.workload import Run, bulk, closed_loop, corpus  # noqa: E402

#: Client threads of the headline runs: the issue's N.
MAIN_THREADS = 16
#: Client threads of the no-op runs: enough senders that the system, not the
#: clients' round trips, sets the rate.
NOOP_THREADS = 32
#: The no-op rows' model: `synthetic` at no cost, so what is measured is the serving.
ZERO_COST = {"SYNTHETIC_PER_TOKEN_S": "0", "SYNTHETIC_OVERHEAD_S": "0"}
#: No caller waits longer than this for one answer; past it the run fails loudly.
ANSWER_TIMEOUT_S = 120.0

SYSTEM_PIPELINE = "pipeline"
#: The process set `make run` starts, as a user runs it: web (gunicorn), Flower, both
#: collectors and a device worker per device under supervisord, MiniLM, default
#: logging and torch threads. Its rows carry kind "make run".
SYSTEM_MAKE_RUN = "make run"
SYSTEM_OFF = "pipeline, batching off"
SYSTEM_PLAIN = "plain Celery"
SYSTEM_BATCHES = "celery-batches"


@dataclass(frozen=True)
class Sizes:
    """How much each measurement sends. The full run fits `make bench` in 15 minutes
    on 2 cores; --quick is for checking the machinery, not for numbers."""

    ceiling_texts: int
    ceiling_unsorted_texts: int
    sorted_sizes: tuple[int, ...]
    unsorted_sizes: tuple[int, ...]
    #: The MAIN_THREADS runs that the ratios are taken from.
    main_texts: int
    #: Other points of throughput against offered load: client threads -> texts.
    curve: dict[int, int]
    off_texts: int
    sweep: tuple[tuple[int, float], ...]
    sweep_texts: int
    noop_texts: int
    #: One caller at a time on the `make run` system.
    idle_texts: int = 150
    warmup: int = 32
    noop_chunk: int = 50

    def total(self) -> int:
        ceiling_n = self.ceiling_texts * (1 + len(self.sorted_sizes))
        ceiling_n += self.ceiling_unsorted_texts * len(self.unsorted_sizes)
        curve = self.main_texts + sum(self.curve.values())
        pipeline = self.warmup + curve + self.off_texts + self.noop_texts
        pipeline += self.warmup + self.idle_texts + self.main_texts + self.noop_texts  # the make run system
        plain = self.warmup + curve + self.noop_texts
        batches = self.warmup + self.sweep_texts * len(self.sweep) + curve
        return ceiling_n + pipeline + plain + batches


FULL = Sizes(
    ceiling_texts=480,
    ceiling_unsorted_texts=160,
    sorted_sizes=(8, 16, 32, 64),
    unsorted_sizes=(16, 32, 64),
    main_texts=1500,
    # Up to 64 callers: each system's saturation point is on the curve.
    curve={1: 200, 4: 400, 32: 800, 64: 1200},
    off_texts=600,
    sweep=batches_app.SETTINGS,
    sweep_texts=160,
    noop_texts=4000,
)
QUICK = Sizes(
    ceiling_texts=120,
    ceiling_unsorted_texts=64,
    sorted_sizes=(16, 32),
    unsorted_sizes=(32,),
    main_texts=200,
    curve={1: 30, 4: 60, 32: 200},
    off_texts=100,
    sweep=((8, 0.01), (16, 0.01), (64, 0.1)),
    sweep_texts=64,
    noop_texts=1000,
    idle_texts=30,
    warmup=16,
)


@dataclass
class Bench:
    sizes: Sizes
    out: Path
    bar: tqdm
    redis_pid: int = 0
    runs: list[dict[str, Any]] = field(default_factory=list)
    #: The processes of the system under test, for CPU per request.
    cpu: ProcessCpu | None = None

    @property
    def logs(self) -> Path:
        return self.out / "logs"

    def record(self, run: Run, **extra: Any) -> Run:
        summary = run.summary()
        summary.update(extra)
        summary["latencies_ms"] = [round(s * 1000, 3) for s in run.latencies_s]
        self.runs.append(summary)
        self.bar.write(
            f"  {run.system:<24} {run.threads:>2} threads  {run.throughput:7.1f}/s  "
            f"p50 {run.percentile_ms(50):7.1f} ms  p99 {run.percentile_ms(99):7.1f} ms  "
            f"CPU {summary['cpu_ms_per_request']} ms/req  {run.settings or ''}"
        )
        return run

    def stage(self, text: str) -> None:
        self.bar.set_description_str(text)
        self.bar.write(text)

    def serving(self, pids: Callable[[], list[int]]) -> None:
        """From now on, count the CPU of these processes (and Redis, and this one)."""
        self.cpu = ProcessCpu(lambda: [*pids(), self.redis_pid])

    def measured(self, run: Callable[[], Run]) -> Run:
        before = self.cpu.read() if self.cpu else None
        result = run()
        if self.cpu and before is not None:
            result.cpu_s = self.cpu.read() - before
        return result

    def load(self, system: str, call: Callable[[str], Any], texts: list[str], threads: int, **settings: Any) -> Run:
        return self.measured(
            lambda: closed_loop(system, call, texts, threads, on_done=self.bar.update, settings=settings)
        )

    def bulk(
        self,
        system: str,
        send_many: Callable[[list[str]], list[Any]],
        wait_all: Callable[[list[Any]], Any],
        texts: list[str],
        **settings: Any,
    ) -> Run:
        """The no-op runs: NOOP_THREADS senders, each sending a chunk and waiting for all of it."""
        return self.measured(
            lambda: bulk(
                system,
                send_many,
                wait_all,
                texts,
                NOOP_THREADS,
                chunk=self.sizes.noop_chunk,
                on_done=self.bar.update,
                settings=settings,
            )
        )


# --- the systems ------------------------------------------------------------------------


def run_ceiling(b: Bench) -> dict[str, Any]:
    b.stage("ceiling: MiniLM bare loop, 2 torch threads")
    s = b.sizes
    result = ceiling.measure(
        corpus(s.ceiling_texts),
        sorted_sizes=s.sorted_sizes,
        unsorted_sizes=s.unsorted_sizes,
        unsorted_texts=s.ceiling_unsorted_texts,
        threads=2,
        on_done=b.bar.update,
    )
    for m in result["modes"]:
        b.bar.write(f"  {m['mode']:<24} {m['throughput']:7.1f}/s  pad ratio {m['pad_ratio']:.2f}")
    return result


def curve(b: Bench, system: str, call: Callable[[str], Any], texts: list[str], **settings: Any) -> None:
    """Throughput against offered load: the main run and the other thread counts."""
    points = {**b.sizes.curve, MAIN_THREADS: b.sizes.main_texts}
    for threads in sorted(points):
        b.record(b.load(system, call, texts[: points[threads]], threads, **settings))


@contextmanager
def _serving(b: Bench, system: Any, redis_url: str) -> Iterator[Callable[[str], Any]]:
    """Start one of our systems, count its processes' CPU, point this process at its
    Redis, and yield what a caller does: `submit(text).get()`."""
    from dynamic_batching.edge.client import submit
    from dynamic_batching.store import shared_state
    from dynamic_batching.store.connection import connect

    with system:
        b.serving(lambda: list(system.pids().values()))
        connect(redis_url)
        # The baselines and the bare loop let the model cut long texts at its 256-token
        # limit; the pipeline's default refuses them at the edge instead. Cut them here
        # too, so every system runs the same work.
        policy = shared_state.read_policy()
        _publish_and_wait(shared_state, policy.evolve(oversized="truncate", version=policy.version + 1))

        def call(text: str) -> Any:
            return submit(text).get(timeout=ANSWER_TIMEOUT_S)

        yield call


def run_noop_chunk(texts: list[str]) -> list[Any]:
    """A no-op chunk sent and all its answers awaited in one call, as a script would
    (dynamic_batching.edge.client.run_many)."""
    from dynamic_batching.edge.client import run_many

    return run_many(texts, model="synthetic", timeout=ANSWER_TIMEOUT_S)


def all_answered(values: list[Any]) -> list[Any]:
    """The answers of a chunk; a failed request fails the run."""
    failed = [v for v in values if isinstance(v, BaseException)]
    if failed:
        raise failed[0]
    return values


def joined(results: list[Any]) -> list[Any]:
    """Plain Celery's way to wait for a chunk: Celery's ResultSet.join_native, one wait
    for all, without the 0.5 s nap after its first look."""
    from celery.result import ResultSet

    return ResultSet(results).join_native(timeout=ANSWER_TIMEOUT_S, interval=0)


def run_pipeline(b: Bench, redis_url: str, texts: list[str], noop_texts: list[str]) -> dict[str, Any]:
    from batching_site.harness import LocalSystem
    from dynamic_batching.store import shared_state

    b.stage("pipeline: starting Redis-backed collector and 2 device workers")
    system = LocalSystem(
        devices=["cpu:0", "cpu:1"],
        preload="minilm,synthetic",
        env={"TORCH_THREADS": "1", **ZERO_COST},
        redis_url=redis_url,
        log_dir=str(b.logs),
    )
    with _serving(b, system, redis_url) as call:
        b.stage("pipeline: closed loop, MiniLM")
        b.load(SYSTEM_PIPELINE, call, texts[: b.sizes.warmup], MAIN_THREADS)
        before = _pipeline_stats(shared_state)
        curve(b, SYSTEM_PIPELINE, call, texts)
        stats = _pipeline_stats(shared_state, since=before)

        b.stage("pipeline: batching off (max_batch_size=1)")
        with _policy(shared_state, max_batch_size=1):
            b.record(b.load(SYSTEM_OFF, call, texts[: b.sizes.off_texts], MAIN_THREADS, max_batch_size=1))

        b.stage("pipeline: no-op model")
        noop = b.bulk(SYSTEM_PIPELINE, run_noop_chunk, all_answered, noop_texts, model="synthetic")
        b.record(noop, kind="noop")
    return stats


def make_run_system(redis_url: str | None, log_dir: Path, *, preload: str = "minilm", **env: str) -> Any:
    """The process set `make run` starts (SYSTEM_MAKE_RUN) on `redis_url` (None: a Redis
    of its own), with `env` over what `make run` leaves to the defaults; `preload` names
    the models its device workers load (bench/overhead.py's no-op run: `synthetic`)."""
    from batching_site.harness import LocalSystem

    return LocalSystem(
        devices=["cpu:0", "cpu:1"],
        preload=preload,
        # INFO logging, torch threads split between the devices (the TORCH_THREADS this
        # process's parent may have set for the harness rows does not apply).
        env={"LOG_LEVEL": "INFO", "TORCH_THREADS": "0", **env},
        redis_url=redis_url,
        log_dir=str(log_dir),
        web=True,
        flower=True,
    )


def run_make_run(b: Bench, redis_url: str, texts: list[str], noop_texts: list[str]) -> None:
    """The system as `make run` starts it, driven the way a script drives it: one caller
    at a time (idle), then MAIN_THREADS callers, each `submit(text).get()`; then the no-op
    model as on the harness, which shows what Flower costs a request (its workers load the
    zero-cost `synthetic` beside MiniLM for it; `make run` loads MiniLM only)."""
    b.stage("make run system: web, Flower, collectors and 2 device workers under supervisord")
    system = make_run_system(redis_url, b.logs / "make-run", preload="minilm,synthetic", **ZERO_COST)
    with _serving(b, system, redis_url) as call:
        b.load(SYSTEM_MAKE_RUN, call, texts[: b.sizes.warmup], MAIN_THREADS)
        b.stage("make run system: one caller at a time, then 16 callers")
        b.record(b.load(SYSTEM_MAKE_RUN, call, texts[: b.sizes.idle_texts], 1), kind="make run")
        b.record(b.load(SYSTEM_MAKE_RUN, call, texts[: b.sizes.main_texts], MAIN_THREADS), kind="make run")
        b.stage("make run system: no-op model")
        noop = b.bulk(SYSTEM_MAKE_RUN, run_noop_chunk, all_answered, noop_texts, model="synthetic")
        b.record(noop, kind="noop")


def _pipeline_stats(shared_state: Any, since: dict[str, Any] | None = None) -> dict[str, Any]:
    """Batches dispatched and device busy time, from the heartbeats (every 2 s)."""
    collector = shared_state.read_collector() or {}
    devices = shared_state.live_devices()
    now = {
        "at": time.time(),
        "batches": collector.get("stats", {}).get("dispatched_batches", 0),
        "requests": collector.get("stats", {}).get("dispatched_requests", 0),
        "busy_s": sum(d.get("busy_s", 0.0) for d in devices.values()),
        "devices": len(devices),
    }
    if since is None:
        return now
    wall = now["at"] - since["at"]
    batches = now["batches"] - since["batches"]
    requests = now["requests"] - since["requests"]
    return {
        "batches": batches,
        "requests": requests,
        "mean_batch_size": round(requests / batches, 2) if batches else None,
        "device_busy_share": round((now["busy_s"] - since["busy_s"]) / (wall * max(1, now["devices"])), 3),
    }


@contextmanager
def _policy(shared_state: Any, **changes: Any) -> Iterator[None]:
    """Publish a changed policy, wait until the collector applies it, restore it after."""
    original = shared_state.read_policy()
    changed = original.evolve(version=original.version + 1, **changes)
    _publish_and_wait(shared_state, changed)
    try:
        yield
    finally:
        _publish_and_wait(shared_state, original.evolve(version=original.version + 2))


def _publish_and_wait(shared_state: Any, policy: Any, timeout: float = 10.0) -> None:
    shared_state.publish_policy(policy)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (shared_state.read_collector() or {}).get("policy_version") == policy.version:
            return
        time.sleep(0.05)
    raise TimeoutError(f"the collector did not apply policy version {policy.version} within {timeout}s")


def run_plain(b: Bench, redis_url: str, texts: list[str], noop_texts: list[str]) -> None:
    app = plain_celery.app
    b.stage("plain Celery: starting a prefork worker, 2 processes")
    with Worker(
        "bench.baselines.plain_celery",
        app,
        redis_url,
        args=["-P", "prefork", "-c", "2", "--without-gossip", "--without-mingle", "--without-heartbeat"],
        env={"TORCH_THREADS": "1", "BENCH_PRELOAD_MINILM": "1"},
        log_path=b.logs / "plain_celery.log",
    ) as worker:
        b.serving(worker.pids)

        def call(text: str) -> Any:
            return plain_celery.embed.delay(text).get(timeout=ANSWER_TIMEOUT_S)

        b.stage("plain Celery: closed loop, MiniLM")
        b.load(SYSTEM_PLAIN, call, texts[: b.sizes.warmup], MAIN_THREADS)
        curve(b, SYSTEM_PLAIN, call, texts, processes=2)

        b.stage("plain Celery: no-op task")

        def send_many(chunk: list[str]) -> list[Any]:
            with app.producer_or_acquire() as producer:
                return [plain_celery.noop.apply_async((t,), producer=producer) for t in chunk]

        b.record(b.bulk(SYSTEM_PLAIN, send_many, joined, noop_texts, processes=2), kind="noop")


def run_batches(b: Bench, redis_url: str, texts: list[str]) -> dict[str, Any]:
    b.stage("celery-batches: starting a prefork worker, 2 processes")
    with Worker(
        "bench.baselines.batches_app",
        batches_app.app,
        redis_url,
        # Prefetch unlimited: a worker that may hold only a few messages can never
        # fill a batch of flush_every, as the celery-batches docs warn.
        args=["-P", "prefork", "-c", "2", "--prefetch-multiplier", "0"]
        + ["--without-gossip", "--without-mingle", "--without-heartbeat"],
        env={"TORCH_THREADS": "1", "BENCH_PRELOAD_MINILM": "1"},
        log_path=b.logs / "celery_batches.log",
    ) as worker:
        b.serving(worker.pids)

        def caller(every: int, interval: float) -> Callable[[str], Any]:
            task = batches_app.task_for(every, interval)
            return lambda text: task.delay(text).get(timeout=ANSWER_TIMEOUT_S)

        first = b.sizes.sweep[0]
        b.load(SYSTEM_BATCHES, caller(*first), texts[: b.sizes.warmup], MAIN_THREADS)
        b.stage(f"celery-batches: sweep of {len(b.sizes.sweep)} settings, {MAIN_THREADS} threads")
        sweep = []
        for every, interval in b.sizes.sweep:
            run = b.load(
                SYSTEM_BATCHES,
                caller(every, interval),
                texts[: b.sizes.sweep_texts],
                MAIN_THREADS,
                flush_every=every,
                flush_interval=interval,
            )
            sweep.append(b.record(run, kind="sweep"))
        best = max(sweep, key=lambda r: r.throughput)
        every, interval = best.settings["flush_every"], best.settings["flush_interval"]
        b.stage(f"celery-batches: best setting flush_every={every} flush_interval={interval}")
        curve(b, SYSTEM_BATCHES, caller(every, interval), texts, flush_every=every, flush_interval=interval)
    return {"flush_every": every, "flush_interval": interval}


# --- the run ---------------------------------------------------------------------------


@contextmanager
def redis_server(log_dir: Path) -> Iterator[tuple[str, int]]:
    """One Redis-compatible server for the whole run; yields its base URL and pid."""
    from batching_site.harness import free_port
    from batching_site.processes import redis_server_command

    port = free_port()
    data = tempfile.mkdtemp(prefix="bench-redis-")
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "redis.log", "ab") as log:
        proc = subprocess.Popen(redis_server_command(port, data), stdout=log, stderr=subprocess.STDOUT)
    try:
        import redis

        client = redis.Redis(port=port, socket_connect_timeout=1)
        deadline = time.monotonic() + 15
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}", proc.pid
    finally:
        proc.kill()
        proc.wait(10)


def loadavg() -> list[str]:
    return Path("/proc/loadavg").read_text().split()[:3]


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    import torch

    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": round(mem_kb / 2**20, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "loadavg_at_start": loadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small run to check the machinery (numbers are noise)")
    parser.add_argument(
        "--out", type=Path, help="where results, plots and logs go (default: docs/, or bench/out/quick)"
    )
    parser.add_argument("--render", type=Path, help="only redraw plots and rewrite the doc from this results.json")
    args = parser.parse_args()
    if args.render:
        results = json.loads(args.render.read_text())
        docs = args.out or REPO / "docs"
        report.write(results, docs / "benchmarks.md", plots.draw(results, docs / "img"))
        print(report.ratio_table(results))
        return

    sizes = QUICK if args.quick else FULL
    docs = args.out or (REPO / "bench/out/quick" if args.quick else REPO / "docs")
    out = REPO / "bench/out" if not args.quick else docs
    started = time.time()
    meter = MachineCpu()
    meta: dict[str, Any] = {
        "command": "make bench" if not args.quick else "python bench/run_all.py --quick",
        "argv": shlex.join([Path(sys.executable).name, *sys.argv]),
        "quick": args.quick,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
        "machine": machine(),
    }
    texts = corpus(max(sizes.main_texts, *sizes.curve.values(), sizes.off_texts, sizes.sweep_texts))
    noop_texts = corpus(sizes.noop_texts)

    with tqdm(total=sizes.total(), unit="req", dynamic_ncols=True, smoothing=0.05) as bar:
        b = Bench(sizes, out, bar)
        results: dict[str, Any] = {"meta": meta, "ceiling": run_ceiling(b)}
        with redis_server(b.logs) as (base, b.redis_pid):
            results["pipeline_stats"] = run_pipeline(b, f"{base}/0", texts, noop_texts)
            run_make_run(b, f"{base}/3", texts, noop_texts)
            run_plain(b, f"{base}/1", texts, noop_texts)
            results["batches_best"] = run_batches(b, f"{base}/2", texts)
        results["runs"] = b.runs

    meta["duration_s"] = round(time.time() - started, 1)
    meta["others_cpu_share"] = meter.others_share()
    meta["loadavg_at_end"] = loadavg()
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    images = plots.draw(results, docs / "img")
    target = docs / "benchmarks.md"
    report.write(results, target, images)
    print(f"wrote {target}, {', '.join(str(p) for p in images)} and {out / 'results.json'}")
    print(report.ratio_table(results))


if __name__ == "__main__":
    main()
