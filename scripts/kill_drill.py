"""Kill drill against a running `make run`: N requests from 8 threads while one process
is killed with SIGKILL; every caller must get its own correct answer.

    .venv/bin/python scripts/kill_drill.py gpu-cpu0      # or collector, web, flower

and, against a `make run` that started its own Redis (`REDIS_PORT=6390 make run`):

    REDIS_URL=redis://127.0.0.1:6390/0 .venv/bin/python scripts/kill_drill.py redis

    .venv/bin/python scripts/kill_drill.py gpu-cpu0 --many 25   # callers use run_many

It kills the named supervised program's main process once a tenth of the answers are
in, and restarts nothing itself. Exits 0 only if every request got its own answer.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("program", help="supervised program to kill: gpu-cpu0, collector, web, flower, redis, ...")
    parser.add_argument("-n", type=int, default=300)
    parser.add_argument("--many", type=int, default=0, help="each caller sends chunks of this many by run_many")
    args = parser.parse_args()

    from tqdm import tqdm

    from dynamic_batching.edge.client import run_many, submit

    conf = ROOT / ".run" / "supervisord.conf"
    ctl = [sys.executable, "-m", "supervisor.supervisorctl", "-c", str(conf)]
    texts = [f"kill drill request {i}: " + "word " * (i % 40) for i in range(args.n)]
    answered = 0
    lock = threading.Lock()
    killed = threading.Event()

    def answers(chunk: list[str]) -> list[tuple[str, int]]:
        if args.many:
            vectors = run_many(chunk, timeout=300)
            failed = [v for v in vectors if isinstance(v, BaseException)]
            if failed:
                raise failed[0]
        else:
            vectors = [submit(chunk[0]).get(timeout=300)]
        count(len(chunk))
        return [(t, len(v)) for t, v in zip(chunk, vectors, strict=True)]

    def count(n: int) -> None:
        nonlocal answered
        with lock:
            answered += n
            if answered >= args.n // 10 and not killed.is_set():
                killed.set()
                pid = int(subprocess.run([*ctl, "pid", args.program], capture_output=True, text=True).stdout)
                os.kill(pid, signal.SIGKILL)
                print(f"\nkilled {args.program} (pid {pid}) after {answered} answers", flush=True)

    size = args.many or 1
    chunks = [texts[i : i + size] for i in range(0, len(texts), size)]
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        results = [a for chunk in tqdm(pool.map(answers, chunks), total=len(chunks), desc="calls") for a in chunk]
    took = time.monotonic() - started
    ok = all(n == 384 for _, n in results) and [t for t, _ in results] == texts
    status = subprocess.run([*ctl, "status"], capture_output=True, text=True).stdout
    print(f"{len(results)} answers in {took:.1f}s, all 384-dimensional and in order: {ok}\n{status}")
    return 0 if ok and killed.is_set() else 1


if __name__ == "__main__":
    sys.exit(main())
