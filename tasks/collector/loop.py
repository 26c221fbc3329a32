"""The batch collector: request messages in, batch tasks out.

It runs as one thread inside a Celery worker (tasks/collector/worker.py), the only
collector of its Redis, and is the only code that touches its state, so no lock is
needed.

One turn of the loop:

    housekeeping            -> policy, live devices, heartbeat (every HOUSEKEEPING_S);
                               slow inputs and the ledger sweep (every SWEEP_EVERY_S)
    expire past-deadline    -> DeadlineExceeded outcome, strike off
    while a slot is free and Scheduler.next_batch():
        form a batch
    send them: one batch as a plain task, several as one chord whose callback records
        the round (tasks/collector/rounds.py); their requests are struck off the held hashes
    wait until a request arrives (only while a slot is free) or a device reports done
    take every waiting request and event in one round trip -> Scheduler.add()

Why a request is always in exactly one place (its queue, the held hash, or a published
batch): `take` moves messages into the held hash in one script, and a batch is pushed
and its requests struck off in one transaction. A collector that dies leaves its held
requests in Redis and the next one adopts them at start.

Workers pull: the collector does not pick devices. It keeps at most
`devices x (1 + batches_ahead)` batches outstanding, a batch ahead sent only as a device
is predicted to free (tasks/core/slots.py), and a device that finishes a batch says so
on the events queue. While a device is free the next batch leaves at once
(with `max_wait_ms=0`); while all are busy, requests wait in their queues and are taken
together when a device frees, into fuller batches.
"""

from __future__ import annotations

import logging
import socket
import threading

from celery import Celery
from celery.exceptions import TaskRevokedError

from dynamic_batching.conf import conf

from .. import metrics
from ..core.clock import Clock, MonotonicClock
from ..core.errors import DeadlineExceeded
from ..core.policy import BatchPolicy
from ..core.scheduler import Batch, Item, Scheduler
from ..core.slots import Slots
from ..core.slowlane import SlowLane
from ..core.slowness import fingerprint
from ..protocol import wire
from ..protocol.names import EVENTS_QUEUE
from ..protocol.results import Outcome
from ..store import clock, ledger, request_queues, shared_state
from ..store.lease import Lease, LeaseLost
from ..store.outcomes import OutcomeWriter
from . import housekeeping, inbox
from .inbox import Held
from .outbox import Outbox, batch_body
from .revocations import Revocations

log = logging.getLogger(__name__)

#: How often a standby collector tries to take the lease.
LEASE_POLL_S = 0.25


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
        self.slots = Slots(self.clock.now, timed=conf.COLLECTOR_AHEAD_TIMED)
        self.slow_inputs: set[str] = set()
        #: Known-slow inputs wait here, apart, until the policy lets one take a device.
        self.slow_lane: SlowLane[Held] = SlowLane(self.clock.now)
        self.devices = 0
        self.stats = {"dispatched_batches": 0, "dispatched_requests": 0, "expired": 0, "rejected": 0, "rounds": 0}
        self.outcomes = OutcomeWriter(app)
        self.metrics = metrics.CollectorMetrics()
        self.next_housekeeping = 0.0
        self.next_sweep = 0.0
        self.hostname = socket.gethostname()
        self.redis = shared_state.client()
        self.lease = Lease(self.redis, conf.COLLECTOR_LEASE_S)
        self.outbox = Outbox(app, self.redis, lease=self.lease, dispatch=conf.COLLECTOR_DISPATCH)
        #: Ids revoked through Celery, heard by this worker's control thread.
        self.revocations = Revocations()
        #: A request whose answer is stored under this prefix is dropped when taken.
        self._answered_prefix = app.backend.task_keyprefix

    # The dispatch mode and the devices' names belong to the outbox; these let a test
    # or a benchmark set them on the collector.
    @property
    def dispatch(self) -> str:
        return self.outbox.dispatch

    @dispatch.setter
    def dispatch(self, mode: str) -> None:
        self.outbox.dispatch = mode

    @property
    def device_names(self) -> list[str]:
        return self.outbox.device_names

    @device_names.setter
    def device_names(self, names: list[str]) -> None:
        self.outbox.device_names = names

    def _queue(self) -> str:
        return self.outbox.queue()

    # --- the loop -----------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Stand by until this collector holds the lease, then collect until `stop`.
        Raises LeaseLost if another collector took over meanwhile."""
        if not self._stand_by(stop):
            return
        try:
            # Done-events from before this collector started describe batches it never sent.
            self.redis.delete(EVENTS_QUEUE)
            # The first turn adopts what the previous collector held, then sweeps.
            self._housekeeping(force=True)
            log.info(
                "collector active (lease %s): window %d per tier, %d device(s)",
                self.lease.token,
                self.window,
                self.devices,
            )
            while not stop.is_set():
                self._turn()
            self._drain_at_shutdown()
        finally:
            self.lease.release()

    def _token(self) -> str:
        if self.lease.token is None:
            raise LeaseLost("this collector is not active")
        return self.lease.token

    def _stand_by(self, stop: threading.Event) -> bool:
        """Wait until this collector takes the lease (another collector may be active).
        False if stopped first."""
        said = False
        while not stop.is_set():
            if self.lease.acquire():
                return True
            if not said:
                log.info("another collector is active: standing by to take over")
                said = True
            stop.wait(LEASE_POLL_S)
        return False

    def _turn(self) -> None:
        self._revoke()
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

    def _housekeeping(self, *, force: bool = False) -> None:
        now = self.clock.now()
        if not force and now < self.next_housekeeping:
            return
        self.next_housekeeping = now + housekeeping.HOUSEKEEPING_S
        housekeeping.run(self, self.redis, now)

    def _take(self) -> None:
        tiers, events, dropped = request_queues.take(self.redis, self.window, self._token(), self._answered_prefix)
        for raw in events:
            self._on_event(raw)
        if dropped:
            # Answered while queued (revoked): the write is refused, and strikes each
            # one's ledger entry and frees its owner's slot.
            self.outcomes.write([Outcome(t, error=TaskRevokedError("revoked")) for t in dropped])
        self._add(tiers)

    def adopt(self) -> int:
        """Every request in the held hashes that this collector does not hold is ours
        now: at start, what a previous collector took and never sent; on each sweep
        after that, what a take whose reply was lost put there unseen (the client ran the
        script again, and only the second run's messages came back; issue 41, finding 1).
        Left there, they were never sent, and counted against the window for good."""
        count = 0
        for priority, items in request_queues.held_items(self.redis).items():
            for task_id, raw in items:
                if task_id in self.held:
                    continue
                count += 1
                self._on_request(raw, priority)
                if task_id not in self.held and wire.task_id_of(raw) != task_id:
                    # An id the take script read but the wire cannot (issue 41, finding 1):
                    # it can be answered and struck off by that id alone.
                    error = ValueError("malformed request message: its id cannot be read")
                    self.outcomes.write([Outcome(task_id, error=error)])
                    request_queues.ack(self.redis, self._token(), [(priority, task_id)])
        if count:
            log.warning("adopted %d held request(s) this collector did not know", count)
            self.stats["adopted"] = self.stats.get("adopted", 0) + count
        return count

    def _add(self, tiers: dict[str, list[bytes]]) -> int:
        for priority, raws in tiers.items():
            for raw in raws:
                self._on_request(raw, priority)
        return sum(len(raws) for raws in tiers.values())

    def _idle_timeout(self) -> float:
        now = self.clock.now()
        wake = self.next_housekeeping
        for s in self.schedulers.values():
            w = s.next_wakeup() if self._free_slots() else s.next_deadline()
            if w is not None:
                wake = min(wake, w)
        if any(len(s) for s in self.schedulers.values()):
            # A batch ahead is due when a device is about to free, not at a report.
            ahead = self.slots.next_free_at(self.devices, self.batches_ahead)
            if ahead is not None:
                wake = min(wake, ahead)
        return max(0.0, min(housekeeping.HOUSEKEEPING_S, wake - now))

    # --- messages in ----------------------------------------------------------------

    def _on_request(self, raw: bytes, priority: str) -> None:
        # Anything about one message's content that raises (a malformed envelope, a lone
        # surrogate in its text, a field of the wrong type) is that request's own error:
        # the loop goes on, and a message that is adopted again cannot crash it again.
        try:
            task_id, request = inbox.parse_request(raw, priority)
            if task_id in self.held:
                return  # queued again by the ledger sweep while we hold it: keep one copy
            slow = fingerprint(request.model, request.input) in self.slow_inputs
            item = inbox.to_item(task_id, request, now=self.clock.now(), wall=clock.now(), slow=slow)
        except Exception as exc:  # noqa: BLE001 - a malformed message must not stop the loop
            bad_id = wire.task_id_of(raw)
            log.error("rejecting malformed request message %s: %s", bad_id, exc)
            if bad_id:
                self.outcomes.write([Outcome(bad_id, error=ValueError(f"malformed request message: {exc}"))])
                request_queues.ack(self.redis, self._token(), [(priority, bad_id)])
            self.stats["rejected"] += 1
            return
        if slow and self.slow_lane.add(request.model, item):
            self.held[task_id] = item
            return
        sched = self.schedulers.get(request.model)
        if sched is None:
            costs = self.slots.costs_of(request.model) if conf.COST_PACKING else None
            sched = self.schedulers[request.model] = Scheduler(
                self.policy.for_model(request.model), self.clock.now, costs=costs
            )
        sched.add(item)
        self.held[task_id] = item

    def _on_event(self, raw: bytes) -> None:
        body = inbox.parse_event(raw)
        if body is None:
            log.error("ignoring a malformed message on %s: %r", EVENTS_QUEUE, raw[:200])
            return
        kind = body.get("kind")
        if kind == "done":
            # parse_event checked these fields' types.
            run_s = body["run_ms"] / 1000
            self.slots.done(body["batch_id"], body["padded_tokens"], run_s, started_at=body["started_at"])
            self.slow_lane.ran(body["lane"], run_s)
        elif kind == "yielding":
            # The device runs other batches inside this one now: send it the next.
            self.slots.yielded(body.get("batch_id"))
        elif kind == "slow":
            self.slow_inputs.add(str(body.get("fingerprint")))
        elif kind == "hello":
            self.next_housekeeping = 0.0

    # --- messages out ---------------------------------------------------------------

    def _free_slots(self) -> int:
        return self.slots.free(self.devices, self.batches_ahead)

    def _dispatch(self, *, force: bool = False) -> None:
        # Everything this turn can send leaves together: two or more batches form a round.
        formed: list[tuple[str, Batch[Held]]] = []
        while self._free_slots() > len(formed) or (force and self.devices):
            batch = self._next_batch(force=force)
            if batch is None:
                break
            formed.append(batch)
        # A free device left over may take a slow input, if the lane's policy says so.
        slow_free = self.slots.slow_free(self.devices)
        while self.slow_lane and slow_free and (self._free_slots() > len(formed) or (force and self.devices)):
            slow_free -= 1
            others = any(len(sched) for sched in self.schedulers.values())
            slow = self.slow_lane.next_batch(self.policy, others_waiting=others)
            if slow is None:
                break
            formed.append(slow)
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

    def _send(self, formed: list[tuple[str, Batch[Held]]]) -> None:
        bodies = [batch_body(model, batch) for model, batch in formed]
        items = [(item.priority, item.id) for _, batch in formed for item in batch.items]
        if self.outbox.send(bodies, items):
            self.stats["rounds"] += 1
        for (model, batch), body in zip(formed, bodies, strict=True):
            for item in batch.items:
                self.held.pop(item.id, None)
            self.slots.sent(
                body["batch_id"],
                batch.padded_tokens,
                lane=body["lane"],
                model=model,
                requests=[i.id for i in batch.items],
                devices=self.devices,
                dispatched_at=body["dispatched_at"],
            )
            self.stats["dispatched_batches"] += 1
            self.stats["dispatched_requests"] += len(batch)
            self.metrics.batch_sent(batch, self.policy.for_model(model).max_batch_size)

    def _revoke(self) -> None:
        """Apply the revocations heard since the last turn (collector/revocations.py)."""
        ids = list(dict.fromkeys(self.revocations.take()))
        if not ids:
            return
        running = {task_id for requests in self.slots.requests.values() for task_id in requests}
        for task_id in (i for i in ids if i in running):
            log.info("request %s is revoked but already in a running batch: it finishes", task_id)
        ids = [i for i in ids if i not in running]
        unheld = [i for i in ids if i not in self.held]
        payloads = dict(zip(unheld, self.redis.hmget(ledger.PAYLOADS_KEY, unheld), strict=True)) if unheld else {}
        waiting = dict(zip(unheld, ledger.scores(self.redis, unheld), strict=True))
        outcomes, acks = [], []
        for task_id in ids:
            item = self.held.pop(task_id, None)
            if item is not None:
                assert item.payload is not None
                request = item.payload.request
                sched = self.schedulers.get(request.model)
                if not (sched is not None and sched.cancel(item)):
                    self.slow_lane.cancel(item)
                acks.append((item.priority, task_id))
                fields = request.celery
            elif waiting.get(task_id) is not None:
                fields = inbox.celery_of(payloads.get(task_id))  # still in its queue
            else:
                continue  # answered already, or not a batching request
            error = TaskRevokedError("revoked")
            outcomes.append(Outcome(task_id, error=error, details={"revoked": True}, celery=fields))
        if outcomes:
            self.outcomes.write(outcomes)
            log.info("revoked %d request(s) before they ran", len(outcomes))
        if acks:
            request_queues.ack(self.redis, self._token(), acks)
        self.stats["revoked"] = self.stats.get("revoked", 0) + len(outcomes)

    def _expire(self) -> None:
        expired: list[Item[Held]] = self.slow_lane.expire()
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
                    celery=i.payload.request.celery if i.payload is not None else None,
                )
                for i in expired
            ]
        )
        request_queues.ack(self.redis, self._token(), [(item.priority, item.id) for item in expired])
        for item in expired:
            self.held.pop(item.id, None)
        self.stats["expired"] += len(expired)
        self.metrics.expired(expired)

    def _drain_at_shutdown(self) -> None:
        """Dispatch what is held if any device can run it; put the rest back at the
        head of its queue for the next collector. (Only while still active: a standby
        that took over has adopted all of it.)"""
        self.lease.renew()
        if self.devices and self.held:
            log.info("collector shutting down: dispatching %d held request(s)", len(self.held))
            self._dispatch(force=True)
        rest = sorted(self.held.values(), key=lambda i: i.enqueued_at)
        if rest:
            request_queues.release(self.redis, [(i.priority, i.id) for i in rest])
            log.info("collector shutting down: %d held request(s) back in their queues", len(rest))
