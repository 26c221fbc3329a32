"""What leaves the collector: batch tasks for the devices, alone or as a round."""

from __future__ import annotations

import uuid
from typing import Any

from celery import Celery

from dynamic_batching.conf import conf

from ..core.scheduler import Batch
from ..protocol import events as flower_events
from ..protocol import wire
from ..protocol.names import BATCH_TASK, batch_queue_name, device_queue_name
from ..store import clock, request_queues
from ..store.lease import Lease, LeaseLost
from . import rounds
from .inbox import Held


def batch_body(model: str, batch: Batch[Held]) -> dict[str, Any]:
    """The argument of one run_batch task: plain JSON, every request's own fields."""
    requests = []
    for item in batch.items:
        assert item.payload is not None
        r = item.payload.request
        body = {
            "id": item.id,
            "input": r.input,
            "tokens": r.tokens,
            "priority": r.priority,
            "submitted_at": r.submitted_at,
            "deadline_at": r.deadline_at,
            "truncated": r.truncated,
            "waited_s": max(0.0, batch.formed_at - item.enqueued_at),
        }
        if r.celery is not None:
            body["celery"] = r.celery
        requests.append(body)
    return {
        "batch_id": str(uuid.uuid4()),
        "model": model,
        "requests": requests,
        "padded_tokens": batch.padded_tokens,
        "real_tokens": batch.real_tokens,
        "reason": batch.reason,
        "dispatched_at": clock.now(),
        "lane": "slow" if any(i.payload and i.payload.slow for i in batch.items) else "normal",
    }


class Outbox:
    def __init__(self, app: Celery, redis: Any, lease: Lease | None = None, *, dispatch: str = "pull") -> None:
        self.app = app
        self.redis = redis
        #: Every dispatch carries this lease's fencing token.
        self.lease = lease
        # "pull", or "push": the round-robin baseline of bench/devices_bench.py only.
        self.dispatch = dispatch
        self.device_names: list[str] = []
        self._pushed = 0

    def send(self, bodies: list[dict[str, Any]], items: list[tuple[str, str]]) -> bool:
        """Publish batches and strike their (priority, id) requests off the held
        hashes, in one script. Returns True if they went as a round."""
        if self.lease is None or self.lease.token is None:
            raise LeaseLost("only the active collector dispatches")
        argsrepr = [rounds.shown(b) for b in bodies]
        queues = [self.queue(b["lane"]) for b in bodies]
        events = None
        if conf.TASK_SENT_EVENTS:
            sent = [(b["batch_id"], r) for b, r in zip(bodies, argsrepr, strict=True)]
            events = flower_events.sent(self.app, BATCH_TASK, sent, queues)
        if len(bodies) == 1:
            # No caller waits on a lone batch's own result (each request has its own), so
            # the device does not store one; a round's batches keep theirs for the chord.
            body = bodies[0]
            raw = wire.task_message(
                self.app, BATCH_TASK, body["batch_id"], [body], queues[0], argsrepr=argsrepr[0], ignore_result=True
            )
            request_queues.dispatch(self.redis, self.lease.token, [(queues[0], raw)], items, events)
            return False
        # A round: one chord, whose callback records the round (tasks/collector/rounds.py).
        # Callers do not wait on it; each request is answered by its own batch.
        meta = {"round_id": str(uuid.uuid4()), "dispatched_at": clock.now()}
        messages, chord = rounds.round_messages(self.app, list(zip(bodies, queues, strict=True)), meta)
        request_queues.dispatch(self.redis, self.lease.token, messages, items, events, chord)
        return True

    def queue(self, lane: str = "normal") -> str:
        # BASELINE ONLY (COLLECTOR_DISPATCH=push, for bench/devices_bench.py): deal batches
        # round-robin onto the devices' own queues, the coordinator-push design that
        # worker-pull replaces. Pull sends a lane's batches to its shared queue.
        if self.dispatch != "push" or not self.device_names:
            return batch_queue_name(lane)
        name = self.device_names[self._pushed % len(self.device_names)]
        self._pushed += 1
        return device_queue_name(name)
