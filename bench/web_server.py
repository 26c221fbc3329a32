"""The web role as ASGI (uvicorn workers, batching_site/asgi.py) against the threaded
WSGI workers it replaced, on the same process set in the same run: status reads (the
async view) and submits (a sync view) from 8 concurrent clients over HTTP, as scripts
call the API. Each server runs `--rounds` times, alternating, so the hour's noise
falls on both.

    .venv/bin/python bench/web_server.py              # about 4 minutes
    .venv/bin/python bench/web_server.py --rounds 1 --calls 1000

The baseline is `make run`'s web command with the WSGI application and gthread
workers (8 threads) put back, everything else the same.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("BATCHING_TEST_MODELS", "1")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")

import django  # noqa: E402

django.setup()

from systems import running  # noqa: E402

from batching_site import processes  # noqa: E402
from batching_site.harness import LocalSystem  # noqa: E402

ASGI = processes.web_command
CLIENTS = 8


def threaded_wsgi(**kwargs: Any) -> list[str]:
    """The web command as it was: the WSGI application on gthread workers."""
    cmd = ASGI(**kwargs)
    cmd[cmd.index("batching_site.asgi:application")] = "batching_site.wsgi:application"
    cmd[cmd.index("--worker-class") + 1] = "gthread"
    at = cmd.index("--worker-connections")
    cmd[at : at + 2] = ["--threads", "8"]
    return cmd


def call(port: int, token: str, method: str, path: str, body: object = None) -> dict[str, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method=method,
    )
    with urllib.request.urlopen(req, timeout=60) as reply:
        return json.loads(reply.read())


def measure(server: str, calls: int) -> dict[str, dict[str, float]]:
    processes.web_command = ASGI if server == "asgi" else threaded_wsgi
    out: dict[str, dict[str, float]] = {}
    try:
        with running(LocalSystem(devices=["cpu:0"], preload="synthetic", web=True), timeout=180) as system:
            assert system.web_port is not None
            port = system.web_port
            quota = {"rate_per_s": 1e6, "burst": 1e6, "max_in_flight": 10**6, "tier_share": 1.0}
            token = system.user_token(f"bench-{server}-{time.monotonic_ns()}", quota=quota)
            [request_id] = call(port, token, "POST", "/api/v1/requests", {"text": "x", "model": "synthetic"})["ids"]

            def read(_: int) -> float:
                t = time.perf_counter()
                call(port, token, "GET", f"/api/v1/requests/{request_id}")
                return time.perf_counter() - t

            def submit(i: int) -> float:
                t = time.perf_counter()
                call(port, token, "POST", "/api/v1/requests", {"text": f"text {i}", "model": "synthetic"})
                return time.perf_counter() - t

            for name, fn in (("read", read), ("submit", submit)):
                with ThreadPoolExecutor(CLIENTS) as pool:
                    list(pool.map(fn, range(calls // 10)))  # warm up
                    started = time.perf_counter()
                    took = sorted(pool.map(fn, range(calls)))
                    elapsed = time.perf_counter() - started
                out[name] = {
                    "per_s": round(calls / elapsed, 1),
                    "p50_ms": round(1000 * took[len(took) // 2], 1),
                    "p99_ms": round(1000 * took[int(len(took) * 0.99)], 1),
                }
    finally:
        processes.web_command = ASGI
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"wsgi": [], "asgi": []}
    for _ in range(args.rounds):
        for server in ("wsgi", "asgi"):
            runs[server].append(measure(server, args.calls))
            print(server, json.dumps(runs[server][-1]), flush=True)
    for name in ("read", "submit"):
        ratio = statistics.median(r[name]["per_s"] for r in runs["asgi"]) / statistics.median(
            r[name]["per_s"] for r in runs["wsgi"]
        )
        print(f"{name}: ASGI at {ratio:.2f}x the threaded WSGI workers' calls/s (median of {args.rounds})")


if __name__ == "__main__":
    main()
