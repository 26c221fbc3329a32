"""Where an idle request's time goes between processes, read on one clock: Redis's.

    make run                                                       # in one shell
    .venv/bin/python bench/redis_hops.py                           # in another
    .venv/bin/python bench/redis_hops.py --redis-url redis://127.0.0.1:6400/0 -n 200

Against a running system (what `make run` starts, by default at REDIS_URL or
127.0.0.1:6379): one caller sends requests one at a time while Redis's MONITOR stream
timestamps every command each process sends. Each request's path is the commands it
causes, in order:

    edge admits it        the caller's admission script (tasks/store/request_queues.py)
    collector takes it    the collector's take script, after its wake-up
    collector sends it    the dispatch script that pushes its batch task
    device receives it    kombu records the batch message as unacked (its MULTI)
    device starts it      the device worker records the batch as taken, right before the run
    answer written        the outcome script (tasks/store/outcomes.py)

and the two ends on the caller's clock, which on one host is the same wall clock:
`submit()` called, and `.get()` returned. It prints the median and p90 of each hop. Unlike
bench/idle_legs.py, no hop depends on two processes' clocks agreeing; MONITOR itself
costs Redis some time per command, so totals run a little above an unmonitored run's.
Last it measures the floor of one hop, a bare RPUSH to BLMPOP between two processes.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import django  # noqa: E402

django.setup()

import redis  # noqa: E402
from tqdm import tqdm  # noqa: E402

from tasks.edge.client import submit  # noqa: E402
from tasks.protocol.names import taken_key  # noqa: E402
from tasks.store import outcomes, request_queues  # noqa: E402
from tasks.store.connection import connect  # noqa: E402

#: The list bare_wake uses.
BARE_KEY = "bench:redis_hops:bare"

#: (the step a command marks, its command name, how its first argument starts).
STEPS = (
    ("edge admits it", "EVALSHA", request_queues._ADMIT_SCRIPT.sha),
    ("collector takes it", "EVALSHA", request_queues._TAKE_SCRIPT.sha),
    ("collector sends it", "EVALSHA", request_queues._DISPATCH_SCRIPT.sha),
    ("device receives it", "ZADD", "unacked_index"),  # kombu's Redis transport
    ("device starts it", "SADD", taken_key("")),
    ("answer written", "EVALSHA", outcomes._SET_ONCE_SCRIPT.sha),
)


def watch(url: str, seen: list[tuple[float, str, str]], stop: threading.Event) -> None:
    """Every command Redis runs, with Redis's timestamp, until `stop`."""
    with redis.Redis.from_url(url).monitor() as m:
        for cmd in m.listen():
            parts = cmd["command"].split(" ", 2)
            seen.append((float(cmd["time"]), parts[0].upper(), parts[1] if len(parts) > 1 else ""))
            if stop.is_set():
                return


def paths(seen: list[tuple[float, str, str]], calls: list[tuple[float, float]]) -> list[list[float]]:
    """Each call's times: submit() called, every STEP in order, .get() returned. A call
    whose commands were not all seen (or came out of order) is left out."""
    out = []
    for start, end in calls:
        times = [start]
        for _, name, first in STEPS:
            hit = next((t for t, c, a in seen if times[-1] <= t <= end and c == name and a.startswith(first)), None)
            if hit is None:
                break
            times.append(hit)
        else:
            out.append([*times, end])
    return out


def _bare_waiter(url: str, n: int, took: Any) -> None:
    r = redis.Redis.from_url(url)
    for _ in range(n):
        _, values = r.blmpop(10, 1, BARE_KEY, direction="LEFT", count=1)
        took.put(time.time() - float(values[0]))


def bare_wake(url: str, n: int, pause_s: float) -> list[float]:
    """The floor: one process RPUSHes its clock onto a list that another waits on with
    BLMPOP, as the outcome script wakes a caller; ms until the waiter has it."""
    ctx = multiprocessing.get_context("spawn")
    took = ctx.Queue()
    waiter = ctx.Process(target=_bare_waiter, args=(url, n, took))
    waiter.start()
    r = redis.Redis.from_url(url)
    r.delete(BARE_KEY)
    time.sleep(1.0)
    for _ in range(n):
        r.rpush(BARE_KEY, repr(time.time()))
        threading.Event().wait(pause_s)
    out = [took.get(timeout=10) * 1000 for _ in range(n)]
    waiter.join(timeout=10)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    ap.add_argument("-n", type=int, default=100, help="requests, one at a time")
    ap.add_argument("--model", default=None, help="the model (default: the system's default)")
    ap.add_argument("--pause", type=float, default=0.03, help="seconds between requests")
    args = ap.parse_args()

    connect(args.redis_url)
    for i in range(5):  # warm connections and caches
        submit(f"warm up {i}", model=args.model).get(timeout=60)
    seen: list[tuple[float, str, str]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(args.redis_url, seen, stop), daemon=True)
    watcher.start()
    time.sleep(0.5)
    calls = []
    for i in tqdm(range(args.n), desc="idle requests", unit="req"):
        t0 = time.time()
        submit(f"an idle request {i} with a few words in it", model=args.model).get(timeout=60)
        calls.append((t0, time.time()))
        threading.Event().wait(args.pause)
    stop.set()
    redis.Redis.from_url(args.redis_url).ping()  # one more command, so the watcher sees stop
    watcher.join(timeout=5)

    bare = bare_wake(args.redis_url, args.n, args.pause)
    found = paths(seen, calls)
    names = ["submit() called", *(s for s, _, _ in STEPS), ".get() returned"]
    print(f"\n{len(found)} of {len(calls)} requests traced, ms on Redis's clock (ends on the caller's)\n")
    print("| hop | median ms | p90 ms |\n| --- | ---: | ---: |")
    rows: list[tuple[str, list[float]]] = [
        (f"{a} → {b}", [(p[k + 1] - p[k]) * 1000 for p in found])
        for k, (a, b) in enumerate(zip(names, names[1:], strict=False))
    ]
    rows.append(("**total**", [(p[-1] - p[0]) * 1000 for p in found]))
    for name, xs in rows:
        if xs:
            print(f"| {name} | {statistics.median(xs):.2f} | {sorted(xs)[int(0.9 * len(xs))]:.2f} |")
    print(
        f"\nThe floor, RPUSH in one process to BLMPOP returned in another: median {statistics.median(bare):.2f} ms, "
        f"p90 {sorted(bare)[int(0.9 * len(bare))]:.2f} ms"
    )


if __name__ == "__main__":
    main()
