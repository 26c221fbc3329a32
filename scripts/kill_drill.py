"""Kill drill against a running `make run`: N requests from 8 threads while one process
is killed with SIGKILL; every caller must get its own correct answer.

    .venv/bin/python scripts/kill_drill.py gpu-cpu0      # or collector, web, flower

and, against a `make run` that started its own Redis (`REDIS_PORT=6390 make run`):

    REDIS_URL=redis://127.0.0.1:6390/0 .venv/bin/python scripts/kill_drill.py redis

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
    args = parser.parse_args()

    from tqdm import tqdm

    from tasks.edge.client import submit

    conf = ROOT / ".run" / "supervisord.conf"
    ctl = [sys.executable, "-m", "supervisor.supervisorctl", "-c", str(conf)]
    texts = [f"kill drill request {i}: " + "word " * (i % 40) for i in range(args.n)]
    answered = 0
    lock = threading.Lock()
    killed = threading.Event()

    def one(text: str) -> tuple[str, int]:
        nonlocal answered
        vector = submit(text).get(timeout=300)
        with lock:
            answered += 1
            if answered >= args.n // 10 and not killed.is_set():
                killed.set()
                pid = int(subprocess.run([*ctl, "pid", args.program], capture_output=True, text=True).stdout)
                os.kill(pid, signal.SIGKILL)
                print(f"\nkilled {args.program} (pid {pid}) after {answered} answers", flush=True)
        return text, len(vector)

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        results = list(tqdm(pool.map(one, texts), total=len(texts), desc="answers"))
    took = time.monotonic() - started
    ok = all(n == 384 for _, n in results) and [t for t, _ in results] == texts
    status = subprocess.run([*ctl, "status"], capture_output=True, text=True).stdout
    print(f"{len(results)} answers in {took:.1f}s, all 384-dimensional and in order: {ok}\n{status}")
    return 0 if ok and killed.is_set() else 1


if __name__ == "__main__":
    sys.exit(main())
