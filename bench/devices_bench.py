"""Devices: balance across unequal devices, pull against push, and 1/2/4-device scaling.

    .venv/bin/python bench/devices_bench.py                    # about 3 minutes
    .venv/bin/python bench/devices_bench.py --seconds 6        # quicker, noisier
    .venv/bin/python bench/devices_bench.py --out docs/benchmarks-devices.json

The synthetic model sleeps for its batch time (releasing the CPU, as a GPU kernel would),
so simulated devices scale on 2 cores. One Redis and real collector / device-worker
processes throughout; devices are started and stopped between phases, in this order:

    fast alone        cpu:0                      its capacity (and the 1-device baseline)
    slow alone        cpu:1 at SYNTHETIC_SLOWDOWN=3
    pull, unequal     fast + slow, worker-pull   target >= 0.9 x (fast + slow capacity)
    push, unequal     fast + slow, round-robin push (BATCHING_COLLECTOR_DISPATCH=push, baseline only)
    2 devices, 4 devices   equal fast devices, worker-pull; ratios against one device

Each phase keeps a closed-loop backlog of requests in flight (so every device is always
busy), then measures steady-state throughput from the devices' own timestamps: requests
in batches finished between the first and the last batch to finish inside the window,
over the time between them. The texts are seeded; the ratios are measured in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # runnable as a plain script
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
# Benchmarks drive the test model `synthetic`, here and in the processes they start.
os.environ.setdefault("BATCHING_TEST_MODELS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import django  # noqa: E402

django.setup()

from tqdm import tqdm  # noqa: E402

from batching_site.celery import app  # noqa: E402
from batching_site.harness import LocalSystem  # noqa: E402
from batching_site.processes import program_name  # noqa: E402
from dynamic_batching.core.policy import BatchPolicy  # noqa: E402
from dynamic_batching.edge.client import details, submit_many  # noqa: E402
from dynamic_batching.store import shared_state  # noqa: E402
from dynamic_batching.store.connection import connect  # noqa: E402

SEED = 0
#: Per-device cost: a full batch (16 x 22 tokens) takes about 0.57 s, 36 ms a request,
#: so four devices ask ~110 requests/s of the 2-core host: its CPUs (shared with the
#: client, the collector and Redis) feed that even when other work runs beside it.
SYNTHETIC = {"SYNTHETIC_PER_TOKEN_S": "0.0016", "SYNTHETIC_OVERHEAD_S": "0.002"}
SLOWDOWN = 3
MAX_BATCH = 16
#: Ignore the first this-many seconds of a phase (the backlog filling up).
WARMUP_S = 1.5
WORDS = "alpha beta gamma delta kernel tensor batch queue worker device token budget latency".split()


def corpus(n: int, seed: int = SEED) -> list[str]:
    # Equal lengths (20 words, 22 tokens): every full batch costs the same, so a phase
    # measures the devices and the dispatch, not how well a given backlog happened to pack.
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(20)) for _ in range(n)]


class Bench:
    def __init__(self, seconds: float, log_dir: str | None = None) -> None:
        self.seconds = seconds
        self.texts = corpus(4000)
        self.next_text = 0
        self.system = LocalSystem(devices=["cpu:0"], preload="synthetic", env=dict(SYNTHETIC), log_dir=log_dir)
        self.results: dict[str, dict[str, Any]] = {}

    # --- processes ------------------------------------------------------------------

    def start(self) -> None:
        self.system.start_redis()
        assert self.system.redis_url
        connect(self.system.redis_url)
        shared_state.publish_policy(BatchPolicy(max_batch_size=MAX_BATCH, version=1))
        self.collector("pull")

    def collector(self, mode: str) -> None:
        self.system.stop("collector")
        shared_state.client().delete(shared_state.COLLECTOR_KEY)  # so we see the new one
        self.system.start_collector(env={"BATCHING_COLLECTOR_DISPATCH": mode})

    def device(self, name: str, *, slowdown: float = 1.0) -> None:
        self.system.start_device(name, env={"SYNTHETIC_SLOWDOWN": str(slowdown)})

    def stop_device(self, name: str) -> None:
        self.system.stop(program_name(name))

    def ready(self, devices: int) -> None:
        def exactly() -> bool:
            beat = shared_state.read_collector()
            return len(shared_state.live_devices()) == devices and beat is not None and beat["devices"] == devices

        self.system._wait(exactly, f"exactly {devices} device(s)", 120)
        # A worker's heartbeat starts before the rest of its start-up, which takes the
        # CPU for a few seconds: run an untimed load first, so that every device has
        # taken a batch (and finished starting) before anything is measured.
        ran: set[str] = set()
        for _ in range(10):
            results = submit_many(self.take(2 * MAX_BATCH * devices), model="synthetic")
            for r in results:
                r.get(timeout=120)
            ran |= {details(r)["device"] for r in results}
            if len(ran) >= devices:
                return
        raise RuntimeError(f"warm-up ran only on {sorted(ran)}, expected {devices} devices")

    def take(self, n: int) -> list[str]:
        texts = [self.texts[(self.next_text + i) % len(self.texts)] for i in range(n)]
        self.next_text += n
        return texts

    # --- one measured phase -----------------------------------------------------------

    def phase(self, name: str, devices: int, bar: tqdm) -> dict[str, Any]:
        # Enough queued that every device always has a full next batch waiting, even
        # when this process polls late.
        backlog = 4 * MAX_BATCH * devices + 64
        backend = app.backend
        pending: dict[str, float] = {}
        done: dict[str, dict[str, Any]] = {}
        t0 = time.time()
        stop_at = t0 + WARMUP_S + self.seconds
        shown = 0
        while pending or time.time() < stop_at:
            if time.time() < stop_at and len(pending) < backlog:
                for r in submit_many(self.take(backlog - len(pending)), model="synthetic"):
                    pending[r.id] = time.time()
            ids = list(pending)
            for task_id, raw in zip(ids, backend.client.mget([backend.get_key_for_task(t) for t in ids]), strict=True):
                if raw is not None:
                    meta = json.loads(raw)
                    if meta["status"] != "SUCCESS":
                        raise RuntimeError(f"{name}: request {task_id} failed: {meta['result']}")
                    done[task_id] = meta["batching"]
                    del pending[task_id]
            elapsed = min(int(time.time() - t0), int(WARMUP_S + self.seconds))
            bar.update(elapsed - shown)
            shown = elapsed
            time.sleep(0.02)
        bar.update(int(WARMUP_S + self.seconds) - shown)
        return self.steady_rate(name, done, t0 + WARMUP_S, stop_at)

    @staticmethod
    def steady_rate(name: str, done: dict[str, dict[str, Any]], start: float, stop: float) -> dict[str, Any]:
        batches: dict[str, tuple[float, int, str, float]] = {}
        for d in done.values():
            finished = d["started_at"] + d["run_ms"] / 1000.0
            batches[d["batch_id"]] = (finished, d["batch_size"], d["device"].split("@")[0], d["run_ms"] / 1000.0)
        window = sorted(b for b in batches.values() if start <= b[0] <= stop)
        if len(window) < 3:
            raise RuntimeError(f"{name}: only {len(window)} batches finished in the window; raise --seconds")
        first, rest = window[0], window[1:]
        per_device: dict[str, int] = defaultdict(int)
        busy: dict[str, float] = defaultdict(float)
        for _, size, device, run_s in rest:
            per_device[device] += size
            busy[device] += run_s
        span = rest[-1][0] - first[0]
        served = sum(per_device.values())
        return {
            "throughput": served / span,
            "requests": served,
            "seconds": span,
            "batches": len(rest),
            "mean_batch": served / len(rest),
            "share": {d: n / served for d, n in sorted(per_device.items())},
            # Fraction of the window each device spent inside the model.
            "busy": {d: min(1.0, t / span) for d, t in sorted(busy.items())},
        }

    # --- the run ------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        plan = [
            ("fast alone", 1),
            ("slow alone", 1),
            ("pull, unequal", 2),
            ("push, unequal", 2),
            ("2 devices", 2),
            ("4 devices", 4),
        ]
        steps = {
            "fast alone": lambda: (self.device("cpu:0"), self.ready(1)),
            "slow alone": lambda: (self.stop_device("cpu:0"), self.device("cpu:1", slowdown=SLOWDOWN), self.ready(1)),
            "pull, unequal": lambda: (self.device("cpu:0"), self.ready(2)),
            "push, unequal": lambda: (self.collector("push"), self.ready(2)),
            "2 devices": lambda: (
                self.stop_device("cpu:1"),
                self.collector("pull"),
                self.device("cpu:1"),
                self.ready(2),
            ),
            "4 devices": lambda: (self.device("cpu:2"), self.device("cpu:3"), self.ready(4)),
        }
        per_phase = int(WARMUP_S + self.seconds)
        with tqdm(total=per_phase * len(plan), unit="s", desc="devices bench", dynamic_ncols=True) as bar:
            for name, devices in plan:
                bar.set_postfix_str(f"starting {name}")
                steps[name]()
                bar.set_postfix_str(name)
                self.results[name] = self.phase(name, devices, bar)
                bar.set_postfix_str(f"{name}: {self.results[name]['throughput']:.1f}/s")
        return self.summary()

    def summary(self) -> dict[str, Any]:
        r = {k: v["throughput"] for k, v in self.results.items()}
        capacity = r["fast alone"] + r["slow alone"]
        return {
            "settings": {
                **SYNTHETIC,
                "SYNTHETIC_SLOWDOWN (slow device)": SLOWDOWN,
                "max_batch_size": MAX_BATCH,
                "seconds_per_phase": self.seconds,
                "seed": SEED,
                "cpus": os.cpu_count(),
            },
            "phases": self.results,
            "ratios": {
                "pull / (fast + slow capacity)": r["pull, unequal"] / capacity,
                "push / (fast + slow capacity)": r["push, unequal"] / capacity,
                "push / pull": r["push, unequal"] / r["pull, unequal"],
                "slow / fast capacity": r["slow alone"] / r["fast alone"],
                "2 devices / 1": r["2 devices"] / r["fast alone"],
                "4 devices / 1": r["4 devices"] / r["fast alone"],
            },
        }

    def close(self) -> None:
        self.system.close()


def markdown(s: dict[str, Any]) -> str:
    lines = [
        "| phase | requests/s | batches | mean batch | share of requests by device | device busy |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    for name, p in s["phases"].items():
        share = ", ".join(f"{d} {v:.0%}" for d, v in p["share"].items())
        busy = ", ".join(f"{v:.0%}" for v in p["busy"].values())
        lines.append(f"| {name} | {p['throughput']:.1f} | {p['batches']} | {p['mean_batch']:.1f} | {share} | {busy} |")
    lines += ["", "| ratio | value |", "| --- | ---: |"]
    lines += [f"| {k} | {v:.3f} |" for k, v in s["ratios"].items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per phase (plus warm-up)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument("--logs", help="keep every process's log in this directory")
    args = parser.parse_args()
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    bench = Bench(args.seconds, args.logs)
    try:
        bench.start()
        summary = bench.run()
    finally:
        bench.close()
    print()
    print(markdown(summary))
    target = summary["ratios"]["pull / (fast + slow capacity)"]
    print(f"\nunequal devices, worker-pull: {target:.1%} of summed capacity (target >= 90%)")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
