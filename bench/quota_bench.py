"""One client floods, another works: do quotas keep the second one's latency?

The system as `make run` starts it (web, collector, standby, two simulated devices,
under supervisord), driven over HTTP with two API tokens, as scripts would:

    quiet   token B alone: N sequential requests, each timed from POST to its answer
    flood   the same N from B while token A sends at FLOOD x its quota's rate from
            several threads (A's quota: --rate requests/s, burst 2x, in flight 4x)

It reports B's p50/p99 in both and their ratio, and A's accepted and refused (429)
counts. Target (issue 14): B's p99 under the flood within 1.5x of its quiet p99.

    .venv/bin/python bench/quota_bench.py                  # about 1 minute
    .venv/bin/python bench/quota_bench.py --requests 400 --flood 10
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
# Benchmarks drive the test model `synthetic`, here and in the processes they start.
os.environ.setdefault("BATCHING_TEST_MODELS", "1")

import django  # noqa: E402

django.setup()

from celery.result import AsyncResult  # noqa: E402
from tqdm import tqdm  # noqa: E402

from batching_site.celery import app  # noqa: E402
from batching_site.harness import LocalSystem  # noqa: E402
from dynamic_batching.store.connection import connect  # noqa: E402

SYNTHETIC_ENV = {"SYNTHETIC_OVERHEAD_S": "0.003", "SYNTHETIC_PER_TOKEN_S": "0.0002"}


def post(port: int, token: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], str | None]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/requests",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read()), None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}"), exc.headers.get("Retry-After")


def timed_requests(
    port: int, token: str, n: int, tag: str, progress: bool = True
) -> tuple[list[float], list[float], list[int]]:
    """`n` requests one after another: seconds from POST to answer, seconds the POST
    itself took, and the status of any that was not 202."""
    latencies, posts, refused = [], [], []
    for i in tqdm(range(n), desc=tag, leave=False, disable=not progress):
        started = time.perf_counter()
        status, body, _ = post(port, token, {"text": f"{tag} request {i} w w w", "model": "synthetic"})
        posted = time.perf_counter()
        if status != 202:
            refused.append(status)
            continue
        AsyncResult(body["ids"][0], app=app).get(timeout=60)
        latencies.append(time.perf_counter() - started)
        posts.append(posted - started)
    return latencies, posts, refused


def _flood_process(port: int, token: str, per_s: float, stop: Any, counts: Any, threads: int) -> None:
    """A's load, in a process of its own so that its threads never hold B's timer up on
    this process's GIL: `threads` senders at `per_s` in all until `stop`; answers are
    not awaited."""
    interval = threads / per_s
    lock = threading.Lock()

    def sender(k: int) -> None:
        next_at = time.perf_counter() + k * interval / threads
        i = 0
        while not stop.is_set():
            # Pacing an open-loop load generator, not waiting for a condition.
            delay = next_at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            next_at += interval
            status, _, retry = post(port, token, {"text": f"flood {k} {i} w w", "model": "synthetic"})
            i += 1
            key = {202: "accepted", 429: "refused"}.get(status, f"status {status}")
            with lock:
                counts[key] = counts.get(key, 0) + 1
                if retry:
                    counts[f"retry-after {retry}"] = 1

    workers = [threading.Thread(target=sender, args=(k,), daemon=True) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def measure(
    system: LocalSystem, *, requests: int, rate: float, flood_factor: float, progress: bool = True
) -> dict[str, Any]:
    quota = {"rate_per_s": rate, "burst": int(2 * rate), "max_in_flight": int(4 * rate), "tier_share": 0.5}
    a = system.user_token(f"flooder-{os.getpid()}-{time.monotonic_ns()}", quota=quota)
    b = system.user_token(f"worker-{os.getpid()}-{time.monotonic_ns()}")
    port = system.web_port
    assert port is not None
    timed_requests(port, b, 20, "warm-up", progress)
    quiet, quiet_posts, quiet_refused = timed_requests(port, b, requests, "quiet", progress)

    ctx = multiprocessing.get_context("fork")
    with ctx.Manager() as manager:
        stop, counts = manager.Event(), manager.dict()
        flooder = ctx.Process(target=_flood_process, args=(port, a, rate * flood_factor, stop, counts, 4), daemon=True)
        started = time.perf_counter()
        flooder.start()
        try:
            loaded, loaded_posts, loaded_refused = timed_requests(port, b, requests, "flood", progress)
        finally:
            stop.set()
            flooder.join(timeout=60)
        seconds = time.perf_counter() - started
        a_counts = dict(counts)
    accepted, refused = a_counts.pop("accepted", 0), a_counts.pop("refused", 0)
    return {
        "requests": requests,
        "a_quota": quota,
        "a_offered_per_s": rate * flood_factor,
        "a_accepted": accepted,
        "a_refused_429": refused,
        "a_other": a_counts,
        "a_accepted_per_s": accepted / seconds,
        "flood_s": seconds,
        "b_refused": quiet_refused + loaded_refused,
        "b_quiet_p50_ms": statistics.median(quiet) * 1000,
        "b_quiet_p99_ms": pct(quiet, 0.99),
        "b_flood_p50_ms": statistics.median(loaded) * 1000,
        "b_flood_p99_ms": pct(loaded, 0.99),
        "b_quiet_post_p99_ms": pct(quiet_posts, 0.99),
        "b_flood_post_p99_ms": pct(loaded_posts, 0.99),
        "p99_ratio": pct(loaded, 0.99) / pct(quiet, 0.99),
        "p50_ratio": statistics.median(loaded) / statistics.median(quiet),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300, help="B's requests in each phase")
    parser.add_argument("--rate", type=float, default=10.0, help="A's quota, requests/s")
    parser.add_argument("--flood", type=float, default=10.0, help="A sends at this multiple of its rate")
    args = parser.parse_args()
    with LocalSystem(preload="synthetic", web=True, env=SYNTHETIC_ENV) as system:
        connect(system.redis_url)
        result = measure(system, requests=args.requests, rate=args.rate, flood_factor=args.flood)
    print(json.dumps(result, indent=2))
    print(
        f"\nB p99: quiet {result['b_quiet_p99_ms']:.1f} ms, under A's flood {result['b_flood_p99_ms']:.1f} ms "
        f"({result['p99_ratio']:.2f}x; target <= 1.5x). A: {result['a_accepted']} accepted, "
        f"{result['a_refused_429']} refused with 429 at {result['a_offered_per_s']:.0f}/s offered."
    )


if __name__ == "__main__":
    main()
