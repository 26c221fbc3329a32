"""Rounds: the batches one collector turn sends together, run as one Celery chord.

When the collector has more than one batch to send in the same turn (several devices
freed at once, a burst after a quiet spell, a device joining), it sends them as a chord:
the header is a group of `batching.run_batch` tasks, each on the queue it would have
had alone (`batching.batches`, or a device queue), and the body is `batching.round_done`, which runs
on the collector worker (queue `batching.collector.control`) once every batch of the round has
returned. It records the round (tasks/store/rounds.py), newest first:

    {"round_id", "batches", "requests", "sizes", "devices", "run_ms",
     "dispatched_at", "finished_at", "wall_ms", "skew_ms"}

Callers never wait on it: every request's answer is written by its device worker before
the batch task returns, and the chord only costs the device that finishes a round last
one Lua call on the result backend (Celery's native Redis join) and one publish. A single
batch is sent as a plain task and makes no round.

It works with our JSON-only configuration: the body's signature travels in the header
messages as a plain dict, and the header results are run_batch's small summary dicts.

A round is published in the same script that strikes its requests off the held hashes
(tasks/store/request_queues.py::dispatch): `round_messages` builds the header messages
exactly as Celery's chord would (group id, index and the callback in each) and the
chord's size for the result backend, so the whole round goes out, or none of it, and no
round can run twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from celery import Celery, chord, shared_task
from celery.canvas import Signature

from ..protocol import wire
from ..protocol.names import BATCH_TASK, CONTROL_QUEUE, ROUND_TASK
from ..store import clock
from ..store.request_queues import Chord
from ..store.rounds import recent, record

__all__ = ["recent", "round_chord", "round_done", "round_messages", "shown", "summarize"]


def summarize(results: Sequence[dict[str, Any]], meta: dict[str, Any], finished_at: float) -> dict[str, Any]:
    """What a round did, from its batches' run_batch summaries (in dispatch order) and
    the collector's note of when it sent them. Pure."""
    dispatched_at = float(meta.get("dispatched_at") or finished_at)
    run_ms = [float(r.get("run_ms") or 0.0) for r in results]
    return {
        "round_id": meta.get("round_id"),
        "batches": len(results),
        "requests": sum(int(r.get("size") or 0) for r in results),
        "sizes": [int(r.get("size") or 0) for r in results],
        "devices": [str(r.get("device") or "") for r in results],
        "run_ms": run_ms,
        "dispatched_at": dispatched_at,
        "finished_at": finished_at,
        # From sending the round to its last batch returning.
        "wall_ms": round(max(0.0, finished_at - dispatched_at) * 1000, 3),
        # How unevenly the round's batches ran: longest minus shortest model time.
        "skew_ms": round(max(run_ms) - min(run_ms), 3) if run_ms else 0.0,
    }


def shown(body: dict[str, Any]) -> str:
    """What Flower shows as a batch's arguments: its size, and why a slow-lane batch
    runs alone."""
    if body.get("lane") == "slow":
        return "<slow lane: an input confirmed too slow to share a batch, run alone>"
    return f"<batch of {len(body['requests'])}>"


def round_chord(app: Celery, batches: Sequence[tuple[dict[str, Any], str]], meta: dict[str, Any]) -> chord:
    """A chord of run_batch tasks, one per (batch body, queue), with round_done as body.
    Each batch keeps its batch id as task id, as it would when sent alone."""
    header = [app.signature(BATCH_TASK, args=[body], task_id=body["batch_id"], queue=queue) for body, queue in batches]
    return chord(header, round_callback(app, meta))


def round_callback(app: Celery, meta: dict[str, Any]) -> Signature:
    """round_done for one round, on the collector worker's queue."""
    return app.signature(ROUND_TASK, args=[meta], queue=CONTROL_QUEUE)


def round_messages(
    app: Celery, batches: Sequence[tuple[dict[str, Any], str]], meta: dict[str, Any]
) -> tuple[list[tuple[str, str]], Chord]:
    """The round's (queue, task message) pairs, and its chord size for the result
    backend: what `round_chord(...).apply_async()` would publish, as data."""
    group_id = str(uuid.uuid4())
    callback = round_callback(app, meta)
    callback.freeze(group_id=group_id)
    messages = [
        (
            queue,
            wire.task_message(
                app,
                BATCH_TASK,
                body["batch_id"],
                [body],
                queue,
                argsrepr=shown(body),
                group_id=group_id,
                group_index=i,
                chord=callback,
            ),
        )
        for i, (body, queue) in enumerate(batches)
    ]
    backend = app.backend
    chord_size = Chord(backend.get_key_for_group(group_id, ".s"), len(batches), int(backend.chord_expires or 0))
    return messages, chord_size


@shared_task(name=ROUND_TASK, ignore_result=True)
def round_done(results: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    record(summarize(results, meta, clock.now()))
