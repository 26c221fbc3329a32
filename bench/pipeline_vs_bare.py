"""The whole pipeline against a bare loop on the same device: how much of the model's
throughput survives serving? What bench/gpu_check.sh runs on a CUDA machine.

    .venv/bin/python bench/pipeline_vs_bare.py --device cuda:0            # minilm, 20000 texts
    .venv/bin/python bench/pipeline_vs_bare.py --device cpu:0 -n 300      # a dry run without a GPU

1. Bare loop (bench/model_ceiling.py's logic): the model in this process on the device,
   the seeded mixed-length corpus in batches of --batch, sorted by length and in arrival
   order; texts/s. The model is then closed, so the GPU is free for step 2.
2. Pipeline: Redis, the collector and one device worker on the same device
   (DEVICES=<device>, BATCHING_COLLECTOR_BATCHES_AHEAD=1), the same corpus submitted by
   --clients threads through the client API, all at once; texts/s from the first
   submit to the last answer, and on the device alone (first batch start to last end).

Prints both and their ratios, measured in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # runnable as a plain script
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "batching_site.settings")
# Benchmarks drive the test model `synthetic`, here and in the processes they start.
os.environ.setdefault("BATCHING_TEST_MODELS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import django  # noqa: E402

django.setup()

from tqdm import tqdm  # noqa: E402

from batching_site.celery import app  # noqa: E402
from batching_site.harness import LocalSystem  # noqa: E402
from bench.model_ceiling import chunks, make_corpus, time_batches  # noqa: E402
from dynamic_batching.core.policy import BatchPolicy  # noqa: E402
from dynamic_batching.edge import client as client_api  # noqa: E402
from dynamic_batching.edge.client import submit_many  # noqa: E402
from dynamic_batching.gpu_workers.models import get_spec, model_names  # noqa: E402
from dynamic_batching.store import shared_state  # noqa: E402
from dynamic_batching.store.connection import connect  # noqa: E402


def bare_loop(model: str, device: str, texts: list[str], batch: int) -> dict[str, float]:
    spec = get_spec(model)
    runner = spec.load(device)
    try:
        by_length = sorted(texts, key=spec.count_tokens)
        runner.run_batch(by_length[-batch:])  # untimed: allocator growth for the largest shape
        out = {}
        for label, order in (("sorted", by_length), ("arrival order", texts)):
            seconds = time_batches(runner, chunks(order, batch))
            out[f"bare loop, batch {batch}, {label}"] = len(texts) / seconds
        return out
    finally:
        runner.close()
        if device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def pipeline(model: str, device: str, texts: list[str], batch: int, clients: int) -> dict[str, Any]:
    system = LocalSystem(
        devices=[device],
        preload=model,
        env={"BATCHING_COLLECTOR_BATCHES_AHEAD": "1", "BATCHING_DEFAULT_MODEL": model},
    )
    try:
        system.start(timeout=300)
        assert system.redis_url
        connect(system.redis_url)
        caps = {p: 10 * len(texts) for p in ("high", "normal", "low")}
        policy = BatchPolicy(
            max_batch_size=batch,
            max_batch_tokens=batch * get_spec(model).max_tokens,
            queue_caps=caps,
            version=1,
            # The bare loop's model truncates long texts itself; so does the pipeline.
            oversized="truncate",
        )
        shared_state.publish_policy(policy)
        client_api._policy._read_at = float("-inf")
        system._wait(lambda: shared_state.read_collector()["policy_version"] == 1, "the collector's policy", 10)
        ids: list[str] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def client(k: int) -> None:
            mine = texts[k::clients]
            try:
                for i in range(0, len(mine), 256):
                    results = submit_many(mine[i : i + 256], model=model)
                    with lock:
                        ids.extend(r.id for r in results)
            except BaseException as exc:
                errors.append(exc)
                raise

        t0 = time.time()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        backend = app.backend
        details: dict[str, dict[str, Any]] = {}
        with tqdm(total=len(texts), desc=f"pipeline on {device}", unit="text") as bar:
            while len(details) < len(texts):
                with lock:
                    waiting = [i for i in ids if i not in details]
                for task_id, raw in zip(
                    waiting, backend.client.mget([backend.get_key_for_task(t) for t in waiting]), strict=True
                ):
                    if raw is not None:
                        meta = json.loads(raw)
                        if meta["status"] != "SUCCESS":
                            raise RuntimeError(f"request {task_id} failed: {meta['result']}")
                        details[task_id] = meta["batching"]
                        bar.update(1)
                if errors:
                    raise RuntimeError("a client thread failed") from errors[0]
                if time.time() - t0 > 600:
                    raise TimeoutError(f"only {len(details)} of {len(texts)} answered in 600 s")
                time.sleep(0.02)
        t_end = time.time()
        for t in threads:
            t.join()
        first = min(d["started_at"] for d in details.values())
        last = max(d["started_at"] + d["run_ms"] / 1000 for d in details.values())
        batches = {d["batch_id"]: (d["batch_size"], d["run_ms"]) for d in details.values()}
        return {
            "pipeline, end to end": len(texts) / (t_end - t0),
            "pipeline, on the device": len(texts) / (last - first),
            "batches": len(batches),
            "mean batch": len(texts) / len(batches),
            "device busy": sum(ms for _, ms in batches.values()) / 1000 / (last - first),
        }
    finally:
        system.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=model_names, default="minilm")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("-n", type=int, default=20000, help="texts")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--clients", type=int, default=4, help="client threads submitting")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    texts = make_corpus(args.n, args.seed)
    t0 = time.perf_counter()
    bare = bare_loop(args.model, args.device, texts, args.batch)
    print(f"bare loop done in {time.perf_counter() - t0:.0f}s", flush=True)
    piped = pipeline(args.model, args.device, texts, args.batch, args.clients)

    print(f"\nmodel={args.model} device={args.device} texts={args.n} batch={args.batch} clients={args.clients}")
    for label, rate in bare.items():
        print(f"  {label:<44}{rate:>10.1f} texts/s")
    for label in ("pipeline, end to end", "pipeline, on the device"):
        print(f"  {label:<44}{piped[label]:>10.1f} texts/s")
    print(
        f"  pipeline: {piped['batches']} batches, mean {piped['mean batch']:.1f}, device busy {piped['device busy']:.0%}"
    )
    best = max(bare.values())
    print(f"\n  pipeline end to end / best bare loop:   {piped['pipeline, end to end'] / best:.3f}")
    print(f"  pipeline on the device / best bare loop: {piped['pipeline, on the device'] / best:.3f}")


if __name__ == "__main__":
    main()
