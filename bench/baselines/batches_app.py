"""celery-batches: the nearest peer. A worker buffers task messages and hands them to
one task call as a list, flushing every `flush_every` messages or `flush_interval`
seconds, whichever comes first.

    celery -A bench.baselines.batches_app worker -P prefork -c 2 --prefetch-multiplier 0

One task per setting, so a single worker serves the whole sweep; a caller picks the
setting by the task it sends to (`task_for(flush_every, flush_interval)`). Results are
written per request with `mark_as_done`, as the celery-batches docs show. The batch is
padded as it arrives: celery-batches knows nothing about lengths.
"""

from __future__ import annotations

from typing import Any

from celery import Task
from celery_batches import Batches, SimpleRequest

from .common import make_app, model

app = make_app("batches_app")

#: Every setting the bench sweeps: flush_every x flush_interval (seconds).
SETTINGS: tuple[tuple[int, float], ...] = tuple(
    (every, interval) for every in (8, 16, 32, 64) for interval in (0.01, 0.1)
)


def task_name(flush_every: int, flush_interval: float) -> str:
    return f"bench.batches.embed_{flush_every}_{round(flush_interval * 1000)}ms"


def _make_task(flush_every: int, flush_interval: float) -> Task:
    def embed(requests: list[SimpleRequest]) -> None:
        texts = [r.args[0] for r in requests]
        try:
            vectors: list[Any] = model().run_batch(texts)
        except Exception as exc:  # noqa: BLE001 - every caller gets the error, none stays PENDING
            for r in requests:
                app.backend.mark_as_failure(r.id, exc, request=r)
            return
        for r, v in zip(requests, vectors, strict=True):
            app.backend.mark_as_done(r.id, v, request=r)

    return app.task(
        base=Batches,
        name=task_name(flush_every, flush_interval),
        flush_every=flush_every,
        flush_interval=flush_interval,
    )(embed)


TASKS: dict[tuple[int, float], Task] = {s: _make_task(*s) for s in SETTINGS}


def task_for(flush_every: int, flush_interval: float) -> Task:
    return TASKS[(flush_every, flush_interval)]
