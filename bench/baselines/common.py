"""What both baseline apps share: their Celery settings, the model that each worker
process loads once, and starting a worker as a real process.

The baselines run the same MiniLM runner as our device workers
(`dynamic_batching.gpu_workers.models`), so a difference in the numbers is the serving around the
model, never the model call itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from celery import Celery
from celery.signals import worker_process_init

#: The Redis the baseline apps use, broker and results alike. The bench points it at
#: its own server (a separate database per app, so queues never mix).
REDIS_ENV = "BENCH_REDIS_URL"
REPO = Path(__file__).resolve().parents[2]

_model: Any = None


def make_app(name: str) -> Celery:
    url = os.environ.get(REDIS_ENV, "redis://127.0.0.1:6379/1")
    app = Celery(name, broker=url, backend=url)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    return app


#: The model the baselines run, by its name in BATCHING_MODELS: MiniLM unless the bench
#: says otherwise (bench/accelerator.py runs them on the emulated accelerator).
MODEL_ENV = "BENCH_MODEL"


def model() -> Any:
    """This worker process's model runner (MiniLM unless BENCH_MODEL names another);
    loaded when the process starts (below), or on first use in a process that is not a
    pool child."""
    global _model
    if _model is None:
        from dynamic_batching.gpu_workers.models import get_spec

        # TORCH_THREADS in the worker's environment sets the threads per process.
        _model = get_spec(os.environ.get(MODEL_ENV, "minilm")).load("cpu")
    return _model


@worker_process_init.connect
def _load_in_pool_child(**_: Any) -> None:
    # Each prefork child loads its own copy once, before it takes a task; the parent
    # never imports torch, so no thread pool crosses the fork.
    if os.environ.get("BENCH_PRELOAD_MINILM") == "1":
        model()


def point_at(app: Celery, redis_url: str) -> None:
    """Make this (client) process send to and read results from `redis_url`."""
    app.conf.broker_url = redis_url
    app.conf.result_backend = redis_url
    app._local.__dict__.clear()  # per-thread result backends made for another address
    if app._pool is not None:
        app._pool.force_close_all()
        app._pool = None
    app.amqp._producer_pool = None


class Worker:
    """`celery -A <module> worker ...` as a real process group, for a `with` block."""

    def __init__(
        self,
        module: str,
        app: Celery,
        redis_url: str,
        *,
        args: list[str],
        env: dict[str, str] | None = None,
        log_path: Path,
    ) -> None:
        self.module = module
        self.app = app
        self.redis_url = redis_url
        self.args = args
        self.extra_env = env or {}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Worker:
        env = dict(os.environ)
        env.update(
            {
                REDIS_ENV: self.redis_url,
                "HF_HUB_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "PYTHONUNBUFFERED": "1",
                **self.extra_env,
            }
        )
        cmd = [sys.executable, "-m", "celery", "-A", self.module, "worker", "-l", "WARNING", *self.args]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        point_at(self.app, self.redis_url)
        self._wait_ready(120.0)
        return self

    def pids(self) -> list[int]:
        return [] if self.proc is None else [self.proc.pid]

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.module} worker exited with {self.proc.returncode}; see {self.log_path}")
            if self.app.control.ping(timeout=0.5):
                return
        raise TimeoutError(f"{self.module} worker not answering after {timeout:.0f}s; see {self.log_path}")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
