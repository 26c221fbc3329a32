"""Plain Celery, one task per request: what users do today.

    celery -A bench.baselines.plain_celery worker -P prefork -c 2   (TORCH_THREADS=1)

Each worker process loads MiniLM once and encodes one text per task; the caller waits
with `embed.delay(text).get()`.
"""

from __future__ import annotations

from .common import make_app, model

app = make_app("plain_celery")


@app.task(name="bench.plain.embed")
def embed(text: str) -> list[float]:
    return model().run_batch([text])[0]


@app.task(name="bench.plain.noop")
def noop(text: str) -> int:
    """Does nothing, so the rate it runs at is Celery's own overhead per task."""
    return len(text)
