"""How busy the serving path keeps a fast device: the emulated accelerator (issue 40).

    .venv/bin/python bench/accelerator.py                       # 1, 16 and 64 callers
    .venv/bin/python bench/accelerator.py --callers 64 --variants serial ahead timed overlap
    .venv/bin/python bench/accelerator.py --overhead-ms 10 --per-token-us 100

On the process set `make run` starts (web, Flower, the collector and its standby, two
device workers under supervisord: bench/run_all.py::make_run_system), both devices run
`minilm-gpu`, an EmulatedAcceleratorSpec of MiniLM (gpu_workers/models/emulated.py):
real tokens, real 384-float answers, and a batch that keeps the device busy for
`overhead_ms + per_token_us x padded tokens`. Closed-loop callers each send a text and
wait for its answer with `submit(text).get()`.

For each load it prints, per the devices' own record:

- duty cycle: the fraction of wall time the devices were busy (each device reports its
  busy seconds in its heartbeat, `device_busy_s`);
- the gap between two batches on one device, median and p99 (from each request's
  record: bench/device_gaps.py::legs);
- throughput against the emulated ceiling: the same texts, sorted by length and cut
  into the policy's full batches, run back to back on the two devices (the bare loop's
  best, computed from the spec's own cost);
- p50 and p99 latency.

`--variants NAME ...` repeats each load with the overlap mechanisms on or off, a system
started afresh for each (VARIANTS below): `serial` is the design before them (a device
gets its next batch only after it reports done, and does everything in series),
`overlap` is today's defaults.

Then, in the same run and on the same emulated model, the two systems we compare
against (bench/baselines/), each a prefork worker of 2 processes, so 2 emulated devices
as ours has: plain Celery (one request per task, `embed.delay(text).get()`) and
celery-batches (flush_every 64, flush_interval 10 ms). Their duty cycle: plain Celery's
is exact (each task is a batch of one, whose cost the spec gives); celery-batches'
batches are not recorded, so it shows as n/a. `--no-baselines` leaves them out.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = "minilm-gpu"

#: Each mechanism on and off (docs/configuration.md): a batch sent ahead, sent only as a
#: device is about to free (timed), a device worker that prepares and writes one batch
#: while another runs (overlap), and its short GIL switch interval; overlap-ahead2 sends
#: two batches ahead, each with a thread of its own in the device worker.
VARIANTS = {
    "serial": {"BATCHING_COLLECTOR_BATCHES_AHEAD": "0", "BATCHING_DEVICE_OVERLAP": "0"},
    "ahead": {
        "BATCHING_COLLECTOR_BATCHES_AHEAD": "1",
        "BATCHING_COLLECTOR_AHEAD_TIMED": "0",
        "BATCHING_DEVICE_OVERLAP": "0",
    },
    "timed": {
        "BATCHING_COLLECTOR_BATCHES_AHEAD": "1",
        "BATCHING_COLLECTOR_AHEAD_TIMED": "1",
        "BATCHING_DEVICE_OVERLAP": "0",
    },
    "overlap-untimed": {
        "BATCHING_COLLECTOR_BATCHES_AHEAD": "1",
        "BATCHING_COLLECTOR_AHEAD_TIMED": "0",
        "BATCHING_DEVICE_OVERLAP": "1",
    },
    "overlap": {
        "BATCHING_COLLECTOR_BATCHES_AHEAD": "1",
        "BATCHING_COLLECTOR_AHEAD_TIMED": "1",
        "BATCHING_DEVICE_OVERLAP": "1",
    },
    "overlap-ahead2": {
        "BATCHING_COLLECTOR_BATCHES_AHEAD": "2",
        "BATCHING_COLLECTOR_AHEAD_TIMED": "1",
        "BATCHING_DEVICE_OVERLAP": "1",
    },
    # Python's own GIL switch interval in the device worker (the default is 0.5 ms).
    "overlap-gil-5ms": {
        "BATCHING_COLLECTOR_BATCHES_AHEAD": "1",
        "BATCHING_COLLECTOR_AHEAD_TIMED": "1",
        "BATCHING_DEVICE_OVERLAP": "1",
        "BATCHING_DEVICE_SWITCH_INTERVAL_MS": "5",
    },
}


def models_env(overhead_ms: float, per_token_us: float) -> str:
    return json.dumps(
        {
            "minilm": {"spec": "dynamic_batching.gpu_workers.models.minilm.MiniLMSpec"},
            MODEL: {
                "spec": "dynamic_batching.gpu_workers.models.emulated.EmulatedAcceleratorSpec",
                "of": "minilm",
                "overhead_ms": overhead_ms,
                "per_token_us": per_token_us,
            },
        }
    )


def ceiling_per_s(texts: list[str], spec: Any, policy: Any, devices: int) -> float:
    """Requests a second if the devices ran these texts back to back in full batches,
    sorted by length (the least padding): the bare loop's best."""
    lengths = sorted(spec.count_tokens(t) for t in texts)
    limits = policy.for_model(MODEL)
    busy, i = 0.0, 0
    while i < len(lengths):
        size = 1
        while (
            i + size < len(lengths)
            and size < limits.max_batch_size
            and (size + 1) * lengths[i + size] <= limits.max_batch_tokens
        ):
            size += 1
        busy += spec.overhead_s + size * lengths[i + size - 1] * spec.per_token_s
        i += size
    return len(texts) / (busy / devices)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--callers", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=["serial", "overlap"])
    ap.add_argument("--texts", type=int, default=1500, help="texts measured per load (after 100 to warm up)")
    ap.add_argument("--overhead-ms", type=float, default=10.0)
    ap.add_argument("--per-token-us", type=float, default=100.0)
    ap.add_argument(
        "--open-loop", type=float, default=1.2, help="also send at this many times the ceiling, open loop (0: not)"
    )
    ap.add_argument("--no-baselines", dest="baselines", action="store_false")
    ap.add_argument("--write", type=Path, help="put the table in this page, between its markers (make bench)")
    ap.add_argument("--part", help="the markers' name (default: the device's two costs)")
    args = ap.parse_args()

    os.environ["BATCHING_MODELS"] = models_env(args.overhead_ms, args.per_token_us)
    os.environ["BATCHING_TEST_MODELS"] = "0"
    import django

    django.setup()
    from tqdm import tqdm

    from batching_site.celery import app
    from bench.cpu import MachineCpu, by_process
    from bench.device_gaps import Ran, legs
    from bench.run_all import _publish_and_wait, make_run_system
    from bench.workload import closed_loop, corpus, open_loop
    from dynamic_batching.edge.client import submit
    from dynamic_batching.gpu_workers.models import get_spec
    from dynamic_batching.store import shared_state
    from dynamic_batching.store.connection import connect

    spec = get_spec(MODEL)
    texts = corpus(args.texts + 100)
    rows = []
    ids: list[str] = []
    lock = threading.Lock()

    def send(text: str) -> Any:
        result = submit(text, model=MODEL)
        with lock:
            ids.append(result.id)
        return result

    def call(text: str) -> None:
        send(text).get(timeout=120)

    for variant in args.variants:
        logs = Path(tempfile.mkdtemp(prefix="accelerator-"))
        system = make_run_system(
            None,
            logs,
            preload=MODEL,
            BATCHING_MODELS=os.environ["BATCHING_MODELS"],
            LOG_LEVEL="WARNING",
            **VARIANTS[variant],
        )
        with system:
            connect(system.redis_url)
            policy = shared_state.read_policy()
            policy = policy.evolve(oversized="truncate", version=policy.version + 1)
            _publish_and_wait(shared_state, policy)
            closed_loop("warm-up", call, texts[:100], 16)
            # Once a heartbeat has passed, the devices' carry all their busy time so far,
            # as after every load below. Read at once, the busy time between the last
            # heartbeat and the warm-up's end counted in the first load's: a duty cycle
            # of 1.03-1.10 at 64 callers run first.
            time.sleep(1.1 * shared_state.HEARTBEAT_EVERY_S)
            loads: list[tuple[str, Any]] = [(str(c), c) for c in args.callers]
            if args.open_loop:
                loads.append((f"open {args.open_loop}x", None))
            for label, callers in loads:
                ids.clear()
                measured = texts[100 : 100 + (args.texts if callers != 1 else min(args.texts, 300))]
                ceiling = ceiling_per_s(measured, spec, policy, len(shared_state.live_devices()) or 2)
                before = {d: i.get("device_busy_s", 0.0) for d, i in shared_state.live_devices().items()}
                t0 = time.monotonic()
                cpu = MachineCpu()
                procs = by_process(system.pids())
                with tqdm(total=len(measured), desc=f"{variant}, {label} callers", unit="text") as bar:
                    if callers is None:
                        loop = open_loop("measured", send, measured, args.open_loop * ceiling, on_done=bar.update)
                    else:
                        loop = closed_loop("measured", call, measured, callers, on_done=bar.update)
                cpu_share = cpu.busy_share()
                spent = by_process(system.pids())
                ms_by_process = {name: 1000 * (spent[name] - procs.get(name, 0.0)) / loop.requests for name in spent}
                # The next heartbeat carries the busy time up to the end.
                time.sleep(1.1 * shared_state.HEARTBEAT_EVERY_S)
                wall = time.monotonic() - t0
                after = {d: i.get("device_busy_s", 0.0) for d, i in shared_state.live_devices().items()}
                busy = sum(after[d] - before.get(d, 0.0) for d in after)
                batches: dict[str, Ran] = {}
                for task_id in ids:
                    b = app.backend.get_task_meta(task_id)["batching"]
                    batches.setdefault(
                        b["batch_id"],
                        Ran(b["device"], b["started_at"], b["dispatched_at"], b["run_ms"] / 1000, b["batch_size"]),
                    )
                gaps = legs(batches)["gap"]
                rows.append(
                    {
                        "variant": variant,
                        "callers": label,
                        "rate": loop.requests / loop.wall_s,
                        "ceiling": ceiling,
                        # Busy over the loop's own wall time (the heartbeat wait adds no busy time).
                        "duty": busy / (len(after) * loop.wall_s),
                        "gap_p50_ms": statistics.median(gaps) * 1000 if gaps else float("nan"),
                        "gap_p99_ms": pct(gaps, 0.99) * 1000,
                        "batch": statistics.mean(r.size for r in batches.values()),
                        "p50_ms": statistics.median(loop.latencies_s) * 1000,
                        "p99_ms": pct(loop.latencies_s, 0.99) * 1000,
                        "wall": wall,
                        "cpu": cpu_share,
                        "ms_by_process": ms_by_process,
                    }
                )
            if args.baselines and variant == args.variants[-1]:
                rows += baselines(args, system.redis_url, spec, policy, texts)
    table = render(rows, args, spec, idle_texts=texts[100 : 100 + min(args.texts, 300)])
    print("\n" + table)
    if args.write:
        write(args.write, args.part or f"{args.overhead_ms:g}ms-{args.per_token_us:g}us", table)
        print(f"wrote {args.write}")


def render(rows: list[dict[str, Any]], args: Any, spec: Any, *, idle_texts: list[str]) -> str:
    """The table of one device, and the issue's targets read off it."""
    one = spec.overhead_s + statistics.median(spec.count_tokens(t) for t in idle_texts) * spec.per_token_s
    lines = [
        f"Emulated device: {args.overhead_ms:g} ms a batch + {args.per_token_us:g} us a padded token, two of them; "
        f"measured {time.strftime('%Y-%m-%d %H:%M %Z')} on {os.cpu_count()} CPUs with "
        f"`{shlex.join(['.venv/bin/python', 'bench/accelerator.py', *sys.argv[1:]])}`. "
        "CPU busy: the share of the whole machine's CPUs busy during the load.",
        "",
        "| system | callers | duty cycle | gap p50 ms | gap p99 ms | mean batch | texts/s | of ceiling | p50 ms | p99 ms | CPU busy |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['callers']} | {r['duty']:.2f} | {r['gap_p50_ms']:.2f} | {r['gap_p99_ms']:.2f} | "
            f"{r['batch']:.1f} | {r['rate']:.0f} | {r['rate'] / r['ceiling']:.2f}x of {r['ceiling']:.0f} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r.get('cpu', float('nan')):.2f} |".replace("nan", "n/a")
        )
    ours = [r for r in rows if r["variant"] == args.variants[-1]]
    best = max((r for r in ours if r["callers"] != "1"), key=lambda r: r["rate"], default=None)
    idle = next((r for r in ours if r["callers"] == "1"), None)
    if best is not None:
        lines += ["", f"Against the targets ({args.variants[-1]}, at its best load, {best['callers']} callers):", ""]
        lines.append(f"- duty cycle {best['duty']:.2f} (target 0.9); gap p50 {best['gap_p50_ms']:.2f} ms (target 1 ms)")
        lines.append(f"- {best['rate'] / best['ceiling']:.2f}x of the emulated ceiling (target 0.9x)")
        for name, target in (("plain Celery", 5.0), ("celery-batches", 2.0)):
            theirs = [r for r in rows if r["variant"].startswith(name)]
            if theirs:
                top = max(theirs, key=lambda r: r["rate"])
                line = (
                    f"- {best['rate'] / top['rate']:.1f}x {name}'s best ({top['rate']:.0f} texts/s at "
                    f"{top['callers']} callers; target {target:g}x)"
                )
                # Latency is compared at the same load: each closed-loop load of both.
                same = [
                    f"{c} callers {mine['p99_ms']:.0f} ms against {other['p99_ms']:.0f} ms"
                    for mine in ours
                    for other in theirs
                    if (c := mine["callers"]) == other["callers"] and c != "1"
                ]
                lines.append(line + ("; p99 at " + ", ".join(same) if same else ""))
        ms = best.get("ms_by_process")
        if ms:
            from bench.cpu import projected_ceiling

            rate, bound = projected_ceiling(ms, 16, ["collector", "redis"])
            top = ", ".join(f"{k} {v:.2f}" for k, v in sorted(ms.items(), key=lambda kv: -kv[1])[:4])
            lines.append(
                f"- CPU: {sum(ms.values()):.1f} ms a text in all ({top}, ...); at that CPU a text, 16 cores "
                f"could feed about {rate:.0f} texts/s (bound by {bound}), against the devices' ceiling of "
                f"{best['ceiling']:.0f}"
            )
        if idle is not None:
            lines.append(
                f"- idle p50 {idle['p50_ms']:.1f} ms against one median text's device time {one * 1000:.1f} ms "
                f"+ 3 ms (target)"
            )
    return "\n".join(lines)


def write(doc: Path, part: str, table: str) -> None:
    """Replace this device's section of `doc`, between its markers, or add it at the end."""
    start = f"<!-- bench:accelerator:{part}:start (generated by bench/accelerator.py) -->"
    end = f"<!-- bench:accelerator:{part}:end -->"
    text = doc.read_text() if doc.exists() else ""
    block = f"{start}\n{table}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    doc.write_text(text)


def baselines(args: Any, redis_url: str, spec: Any, policy: Any, texts: list[str]) -> list[dict[str, Any]]:
    """Plain Celery and celery-batches on the same emulated model, same callers."""
    from tqdm import tqdm

    from bench.baselines import batches_app, plain_celery
    from bench.baselines.common import MODEL_ENV, Worker
    from bench.cpu import MachineCpu
    from bench.workload import closed_loop

    base = redis_url.rsplit("/", 1)[0]
    env = {"BATCHING_MODELS": os.environ["BATCHING_MODELS"], MODEL_ENV: MODEL, "BENCH_PRELOAD_MINILM": "1"}
    logs = Path(tempfile.mkdtemp(prefix="accelerator-baselines-"))
    systems = [
        ("plain Celery", "bench.baselines.plain_celery", plain_celery.app, f"{base}/1", [],
         lambda text: plain_celery.embed.delay(text).get(timeout=120)),
        ("celery-batches 64/10ms", "bench.baselines.batches_app", batches_app.app, f"{base}/2",
         ["--prefetch-multiplier", "0"], lambda text: batches_app.task_for(64, 0.01).delay(text).get(timeout=120)),
    ]  # fmt: skip
    rows = []
    for name, module, app, url, extra, call in systems:
        args_ = ["-P", "prefork", "-c", "2", *extra, "--without-gossip", "--without-mingle", "--without-heartbeat"]
        with Worker(module, app, url, args=args_, env=env, log_path=logs / f"{module}.log"):
            closed_loop("warm-up", call, texts[:100], 16)
            for callers in args.callers:
                measured = texts[100 : 100 + (args.texts if callers > 1 else min(args.texts, 300))]
                cpu = MachineCpu()
                with tqdm(total=len(measured), desc=f"{name}, {callers} callers", unit="text") as bar:
                    loop = closed_loop("measured", call, measured, callers, on_done=bar.update)
                cpu_share = cpu.busy_share()
                one_each = sum(spec.overhead_s + spec.count_tokens(t) * spec.per_token_s for t in measured)
                rows.append(
                    {
                        "variant": name,
                        "callers": str(callers),
                        "rate": loop.requests / loop.wall_s,
                        "ceiling": ceiling_per_s(measured, spec, policy, 2),
                        "duty": one_each / (2 * loop.wall_s) if module.endswith("plain_celery") else float("nan"),
                        "gap_p50_ms": float("nan"),
                        "gap_p99_ms": float("nan"),
                        "batch": 1.0 if module.endswith("plain_celery") else float("nan"),
                        "p50_ms": statistics.median(loop.latencies_s) * 1000,
                        "p99_ms": pct(loop.latencies_s, 0.99) * 1000,
                        "wall": loop.wall_s,
                        "cpu": cpu_share,
                    }
                )
    return rows


if __name__ == "__main__":
    main()
