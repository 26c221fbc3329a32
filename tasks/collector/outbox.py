"""What leaves the collector: batch tasks for the devices, alone or as a round."""

from __future__ import annotations

import time
import uuid
from typing import Any

from celery import Celery
from django.conf import settings

from ..core.scheduler import Batch
from ..protocol import events as flower_events
from ..protocol import wire
from ..protocol.names import BATCH_QUEUE, BATCH_TASK, device_queue_name
from ..store import request_queues
from . import rounds
from .inbox import Held


def batch_body(model: str, batch: Batch[Held]) -> dict[str, Any]:
    """The argument of one run_batch task: plain JSON, every request's own fields."""
    requests = []
    for item in batch.items:
        assert item.payload is not None
        r = item.payload.request
        requests.append(
            {
                "id": item.id,
                "text": r.text,
                "tokens": r.tokens,
                "priority": r.priority,
                "submitted_at": r.submitted_at,
                "deadline_at": r.deadline_at,
                "truncated": r.truncated,
                "waited_s": max(0.0, batch.formed_at - item.enqueued_at),
            }
        )
    return {
        "batch_id": str(uuid.uuid4()),
        "model": model,
        "requests": requests,
        "padded_tokens": batch.padded_tokens,
        "real_tokens": batch.real_tokens,
        "reason": batch.reason,
        "dispatched_at": time.time(),
        "lane": "slow" if any(i.payload and i.payload.slow for i in batch.items) else "normal",
    }


class Outbox:
    def __init__(self, app: Celery, redis: Any, *, dispatch: str = "pull") -> None:
        self.app = app
        self.redis = redis
        #: Chords of batches (rounds) go through Celery's own producer; set by the loop.
        self.producer: Any = None
        # "pull", or "push": the round-robin baseline of bench/devices_bench.py only.
        self.dispatch = dispatch
        self.device_names: list[str] = []
        self._pushed = 0

    def send(self, bodies: list[dict[str, Any]], items: list[tuple[str, str]]) -> bool:
        """Publish batches and strike their (priority, id) requests off the held
        hashes. Returns True if they went as a round."""
        if len(bodies) == 1:
            # The batch task is pushed and its requests struck off in one transaction.
            body = bodies[0]
            queue = self.queue()
            argsrepr = f"<batch of {len(body['requests'])}>"
            # No caller waits on a lone batch's own result (each request has its own), so
            # the device does not store one; a round's batches keep theirs for the chord.
            raw = wire.task_message(
                self.app, BATCH_TASK, body["batch_id"], [body], queue, argsrepr=argsrepr, ignore_result=True
            )
            events = None
            if settings.CELERY_TASK_SEND_SENT_EVENT:
                events = flower_events.sent(self.app, BATCH_TASK, [(body["batch_id"], argsrepr)], queue)
            request_queues.dispatch(self.redis, queue, raw, items, events)
            return False
        # A round: one chord, whose callback records the round (tasks/collector/rounds.py).
        # Callers do not wait on it; each request is answered by its own batch.
        # Only once every batch is safely in the broker are their requests struck off.
        meta = {"round_id": str(uuid.uuid4()), "dispatched_at": time.time()}
        rounds.round_chord(self.app, [(b, self.queue()) for b in bodies], meta).apply_async(producer=self.producer)
        request_queues.ack(self.redis, items)
        return True

    def queue(self) -> str:
        # BASELINE ONLY (COLLECTOR_DISPATCH=push, for bench/devices_bench.py): deal batches
        # round-robin onto the devices' own queues, the coordinator-push design that
        # worker-pull replaces. Pull sends everything to `batches`.
        if self.dispatch != "push" or not self.device_names:
            return BATCH_QUEUE
        name = self.device_names[self._pushed % len(self.device_names)]
        self._pushed += 1
        return device_queue_name(name)
