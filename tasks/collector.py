"""The batch collector: request messages in, batch tasks out.

It runs as one thread inside a Celery worker started with `--collector` (see
`tasks/worker_steps.py`), the only collector of its Redis, and is the only code that
touches its state, so no lock is needed.

One turn of the loop:

    housekeeping            -> policy, live devices, heartbeat, ledger sweep (every 0.25 s)
    expire past-deadline    -> DeadlineExceeded outcome, strike off
    while a slot is free and Scheduler.next_batch():
        form a batch
    send them: one batch as a plain task, several as one chord whose callback records
        the round (tasks/rounds.py); their requests are struck off the held hashes
    wait until a request arrives (only while a slot is free) or a device reports done
    take every waiting request and event in one round trip -> Scheduler.add()

Hand-off: `request_queues.take` moves request messages from their queue into a held
hash in one script, and a batch task is pushed and its requests struck off in one
transaction, so a request is always in exactly one place: its queue, the held hash, or
a published batch. A collector that dies leaves its held requests in Redis and the next
one adopts them at start. The window per tier bounds how many are held.

Workers pull: the collector does not pick devices. It keeps at most
`devices x (1 + batches_ahead)` batches outstanding, and a device that finishes a batch
says so on `collector.events`. While a device is free the next batch leaves at once
(with `max_wait_ms=0`); while all are busy, requests wait in their queues and are taken
together when a device frees, into fuller batches.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from typing import Any

from celery import Celery
from django.conf import settings
from kombu import Exchange, Queue

from batching_site.celery import (
    BATCH_QUEUE,
    BATCH_TASK,
    EVENTS_QUEUE,
    REQUEST_TASK,
    device_queue_name,
    request_queue_name,
)

from . import flower_events, ledger, metrics, request_queues, rounds, shared_state, wire
from .core.clock import Clock, MonotonicClock
from .core.policy import PRIORITIES, BatchPolicy
from .core.scheduler import Batch, Item, Scheduler
from .core.slowness import CostModel, fingerprint
from .errors import DeadlineExceeded
from .intake import Request
from .outcomes import Outcome, OutcomeWriter

log = logging.getLogger(__name__)

#: How often the collector re-reads the policy and the live devices, and writes its own
#: heartbeat. A policy saved in the admin takes effect within this (plus one batch).
HOUSEKEEPING_S = 0.25
#: A batch a device has not reported done after this many times its expected time (and
#: at least STALE_MIN_S) is presumed lost with its device: its slot is reclaimed. The
#: batch itself is redelivered by the broker after the visibility timeout.
STALE_FACTOR = 4.0
STALE_MIN_S = 3.0


def events_queue() -> Queue:
    return Queue(EVENTS_QUEUE, Exchange(EVENTS_QUEUE, type="direct"), routing_key=EVENTS_QUEUE)


class Held:
    """A request the collector holds (in its tier's held hash until it is sent)."""

    __slots__ = ("request", "slow")

    def __init__(self, request: Request, slow: bool = False) -> None:
        self.request = request
        #: A device found this input too slow to share a batch: it runs alone.
        self.slow = slow


class Collector:
    def __init__(
        self,
        app: Celery,
        *,
        window: int = 256,
        batches_ahead: int = 0,
        clock: Clock | None = None,
    ) -> None:
        self.app = app
        self.window = window
        self.batches_ahead = batches_ahead
        self.clock = clock or MonotonicClock()
        self.policy = BatchPolicy()
        # One scheduler per model: a batch runs one model.
        self.schedulers: dict[str, Scheduler[Held]] = {}
        self.held: dict[str, Item[Held]] = {}
        # batch id -> (when sent, padded tokens): batches a device has not reported done.
        self.outstanding: dict[str, tuple[float, int]] = {}
        self.costs = CostModel()
        self.slow_inputs: set[str] = set()
        self._next_slow_refresh = 0.0
        self.devices = 0
        self.device_names: list[str] = []
        # "pull", or "push": the round-robin baseline of bench/devices_bench.py only.
        self.dispatch = settings.COLLECTOR_DISPATCH
        self._pushed = 0
        self.stats = {"dispatched_batches": 0, "dispatched_requests": 0, "expired": 0, "rejected": 0, "rounds": 0}
        self.outcomes = OutcomeWriter(app)
        self.metrics = metrics.CollectorMetrics()
        self._next_housekeeping = 0.0
        self.hostname = socket.gethostname()
        self.redis = shared_state.client()

    # --- the loop -----------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        with self.app.connection_for_write() as pconn:
            pconn.ensure_connection(max_retries=None)
            # Chords of batches (rounds) go through Celery's own producer.
            self.producer = pconn.Producer(serializer="json")
            # Done-events from before this collector started describe batches it never sent.
            self.redis.delete(EVENTS_QUEUE)
            self._housekeeping(force=True)
            self._adopt()
            log.info("collector ready: window %d per tier, %d device(s)", self.window, self.devices)
            while not stop.is_set():
                self._turn()
            self._drain_at_shutdown()

    def _turn(self) -> None:
        self._housekeeping()
        self._expire()
        self._dispatch()
        timeout = self._idle_timeout()
        if timeout > 0:
            # While every slot is busy, new requests wait in their queues: only a device
            # reporting done (or a timer) ends the wait, and then everything is taken.
            event = request_queues.wait(self.redis, timeout, requests=self._free_slots() > 0)
            if event is not None:
                self._on_event(event)
        self._take()

    def _take(self) -> None:
        tiers, events = request_queues.take(self.redis, self.window)
        for raw in events:
            self._on_event(raw)
        self._add(tiers)

    def _adopt(self) -> None:
        """Requests a previous collector took and never sent are ours now."""
        count = self._add(request_queues.held(self.redis))
        if count:
            log.warning("adopted %d request(s) held by a previous collector", count)

    def _add(self, tiers: dict[str, list[bytes]]) -> int:
        for priority, raws in tiers.items():
            for raw in raws:
                self._on_request(raw, priority)
        return sum(len(raws) for raws in tiers.values())

    def _idle_timeout(self) -> float:
        now = self.clock.now()
        wake = self._next_housekeeping
        for s in self.schedulers.values():
            w = s.next_wakeup() if self._free_slots() else s.next_deadline()
            if w is not None:
                wake = min(wake, w)
        return max(0.0, min(HOUSEKEEPING_S, wake - now))

    # --- messages in ----------------------------------------------------------------

    def _on_request(self, raw: bytes, priority: str) -> None:
        try:
            message = wire.decode(raw)
            task_id = message.task_id
            if not isinstance(task_id, str) or not task_id:
                raise ValueError("the message has no task id")
            if message.task != REQUEST_TASK:
                raise ValueError(f"not a request message: task {message.task!r}")
            request = Request.from_message(message.args[0])
            if request.priority != priority:
                raise ValueError(f"priority {request.priority!r} queued on the {priority!r} queue")
        except Exception as exc:  # noqa: BLE001 - a malformed message must not stop the loop
            task_id = wire.task_id_of(raw)
            log.error("rejecting malformed request message %s: %s", task_id, exc)
            if task_id:
                self.outcomes.write([Outcome(task_id, error=ValueError(f"malformed request message: {exc}"))])
                request_queues.ack(self.redis, [(priority, task_id)])
            self.stats["rejected"] += 1
            return
        if task_id in self.held:
            return  # queued again by the ledger sweep while we hold it: keep one copy
        now = self.clock.now()
        slow = fingerprint(request.model, request.text) in self.slow_inputs
        age = max(0.0, time.time() - request.submitted_at)
        deadline = None if request.deadline_at is None else now + (request.deadline_at - time.time())
        item: Item[Held] = Item(
            id=task_id,
            tokens=request.tokens,
            priority=request.priority,
            enqueued_at=now - age,
            deadline=deadline,
            payload=Held(request, slow),
            alone=request.alone or slow,
        )
        sched = self.schedulers.get(request.model)
        if sched is None:
            sched = self.schedulers[request.model] = Scheduler(self.policy, self.clock.now)
        sched.add(item)
        self.held[task_id] = item

    def _on_event(self, raw: bytes) -> None:
        try:
            body = wire.body(raw)
        except ValueError:
            log.error("ignoring a malformed message on %s: %r", EVENTS_QUEUE, raw[:200])
            return
        kind = body.get("kind") if isinstance(body, dict) else None
        if kind == "done":
            if self.outstanding.pop(body.get("batch_id"), None) is not None:
                self.costs.observe(int(body.get("padded_tokens") or 0), float(body.get("run_ms") or 0) / 1000)
        elif kind == "slow":
            self.slow_inputs.add(str(body.get("fingerprint")))
        elif kind == "hello":
            self._next_housekeeping = 0.0

    # --- messages out ---------------------------------------------------------------

    def _free_slots(self) -> int:
        return max(0, self.devices * (1 + self.batches_ahead) - len(self.outstanding))

    def _dispatch(self, *, force: bool = False) -> None:
        # Everything this turn can send leaves together: two or more batches form a round.
        formed: list[tuple[str, Batch[Held]]] = []
        while self._free_slots() > len(formed) or (force and self.devices):
            batch = self._next_batch(force=force)
            if batch is None:
                break
            formed.append(batch)
        if formed:
            self._send(formed)

    def _next_batch(self, *, force: bool) -> tuple[str, Batch[Held]] | None:
        # The model whose oldest request has waited longest goes first.
        ready = []
        for model, sched in self.schedulers.items():
            oldest = sched.oldest()
            if oldest is not None:
                ready.append((oldest.enqueued_at, model, sched))
        for _, model, sched in sorted(ready, key=lambda r: r[0]):
            batch = sched.next_batch(force=force)
            if batch is not None:
                return model, batch
        return None

    def _message(self, model_batch: tuple[str, Batch[Held]]) -> dict[str, Any]:
        model, batch = model_batch
        batch_id = str(uuid.uuid4())
        wall = time.time()
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
        body = {
            "batch_id": batch_id,
            "model": model,
            "requests": requests,
            "padded_tokens": batch.padded_tokens,
            "real_tokens": batch.real_tokens,
            "reason": batch.reason,
            "dispatched_at": wall,
            "lane": "slow" if any(i.payload and i.payload.slow for i in batch.items) else "normal",
        }
        return body

    def _send(self, formed: list[tuple[str, Batch[Held]]]) -> None:
        bodies = [self._message(mb) for mb in formed]
        items = [(item.priority, item.id) for _, batch in formed for item in batch.items]
        if len(bodies) == 1:
            # The batch task is pushed and its requests struck off in one transaction.
            body = bodies[0]
            queue = self._queue()
            argsrepr = f"<batch of {len(body['requests'])}>"
            # No caller waits on a lone batch's own result (each request has its own), so
            # the device does not store one; a round's batches keep theirs for the chord.
            raw = wire.task_message(
                self.app,
                BATCH_TASK,
                body["batch_id"],
                [body],
                queue,
                argsrepr=argsrepr,
                ignore_result=True,
            )
            events = None
            if settings.CELERY_TASK_SEND_SENT_EVENT:
                events = flower_events.sent(self.app, BATCH_TASK, [(body["batch_id"], argsrepr)], queue)
            request_queues.dispatch(self.redis, queue, raw, items, events)
        else:
            # A round: one chord, whose callback records the round (tasks/rounds.py).
            # Callers do not wait on it; each request is answered by its own batch.
            # Only once every batch is safely in the broker are their requests struck off.
            meta = {"round_id": str(uuid.uuid4()), "dispatched_at": time.time()}
            rounds.round_chord(self.app, [(b, self._queue()) for b in bodies], meta).apply_async(producer=self.producer)
            request_queues.ack(self.redis, items)
            self.stats["rounds"] += 1
        for (_, batch), body in zip(formed, bodies, strict=True):
            for item in batch.items:
                self.held.pop(item.id, None)
            self.outstanding[body["batch_id"]] = (self.clock.now(), batch.padded_tokens)
            self.stats["dispatched_batches"] += 1
            self.stats["dispatched_requests"] += len(batch)
            self.metrics.batch_sent(batch, self.policy.max_batch_size)

    def _queue(self) -> str:
        # BASELINE ONLY (COLLECTOR_DISPATCH=push, for bench/devices_bench.py): deal batches
        # round-robin onto the devices' own queues, the coordinator-push design that
        # worker-pull replaces. Pull sends everything to `batches`.
        if self.dispatch != "push" or not self.device_names:
            return BATCH_QUEUE
        name = self.device_names[self._pushed % len(self.device_names)]
        self._pushed += 1
        return device_queue_name(name)

    def _expire(self) -> None:
        expired: list[Item[Held]] = []
        for sched in self.schedulers.values():
            expired.extend(sched.expire())
        if not expired:
            return
        self.outcomes.write(
            [
                Outcome(
                    i.id,
                    error=DeadlineExceeded(i.id, "was not dispatched before its deadline, so it never ran"),
                    details={"expired": True, "priority": i.priority},
                )
                for i in expired
            ]
        )
        request_queues.ack(self.redis, [(item.priority, item.id) for item in expired])
        for item in expired:
            self.held.pop(item.id, None)
        self.stats["expired"] += len(expired)
        self.metrics.expired(expired)

    # --- housekeeping ---------------------------------------------------------------

    def _housekeeping(self, *, force: bool = False) -> None:
        now = self.clock.now()
        if not force and now < self._next_housekeeping:
            return
        self._next_housekeeping = now + HOUSEKEEPING_S
        r = shared_state.client()
        policy = shared_state.read_policy(r)
        if policy != self.policy:
            log.info("collector applies policy version %d", policy.version)
            self.policy = policy
            for sched in self.schedulers.values():
                sched.set_policy(policy)
        live = shared_state.live_devices(r)
        self.devices = len(live)
        self.device_names = sorted(str(info.get("device")) for info in live.values())
        for batch_id, (sent, padded) in list(self.outstanding.items()):
            expected = self.costs.expected_s(padded) or 0.0
            if now - sent > max(STALE_MIN_S, STALE_FACTOR * expected):
                log.warning("batch %s not reported done after %.1fs; reclaiming its slot", batch_id, now - sent)
                del self.outstanding[batch_id]
        if now >= self._next_slow_refresh:
            self._next_slow_refresh = now + 5.0
            self.slow_inputs = {m.decode() for m in r.smembers(shared_state.SLOW_INPUTS_KEY)}
            self._sweep_ledger(r)
        buffered = self._heartbeat(r)
        self.metrics.flush(r, buffered=buffered)

    def _sweep_ledger(self, r: Any) -> None:
        """Queue again any accepted request that has gone missing (see tasks/ledger.py).

        Missing means: unanswered for longer than any redelivery takes, not held here,
        and its queue is empty (so it is not simply waiting behind a backlog)."""
        empty = {p for p in PRIORITIES if r.llen(request_queue_name(p)) == 0}
        lost = []
        for task_id, raw in ledger.overdue(r, settings.LEDGER_GRACE_S):
            priority = request_queues.queue_of(raw)
            if task_id not in self.held and priority in empty:
                log.warning("request %s was accepted but went missing; queuing it again", task_id)
                lost.append((priority, task_id, raw))
        request_queues.republish(r, lost)
        self.stats["republished"] = self.stats.get("republished", 0) + len(lost)

    def _buffered(self) -> dict[str, int]:
        return {p: sum(s.depth(p) for s in self.schedulers.values()) for p in PRIORITIES}

    def _heartbeat(self, r: Any) -> dict[str, int]:
        buffered = self._buffered()
        shared_state.collector_heartbeat(
            {
                "hostname": self.hostname,
                "policy_version": self.policy.version,
                "devices": self.devices,
                "outstanding": len(self.outstanding),
                "buffered": buffered,
                "stats": self.stats,
                "at": time.time(),
            },
            r,
        )
        return buffered

    def _drain_at_shutdown(self) -> None:
        """Dispatch what is held if any device can run it; put the rest back at the
        head of its queue for the next collector."""
        if self.devices and self.held:
            log.info("collector shutting down: dispatching %d held request(s)", len(self.held))
            self._dispatch(force=True)
        rest = sorted(self.held.values(), key=lambda i: i.enqueued_at)
        if rest:
            request_queues.release(self.redis, [(i.priority, i.id) for i in rest])
            log.info("collector shutting down: %d held request(s) back in their queues", len(rest))
