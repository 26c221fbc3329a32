"""The collector's periodic chores, each a small function of its state: the policy and
the live devices it reads, the device slots it reclaims, the slow inputs it learns, the
ledger it sweeps and the heartbeat and metrics it writes."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from celery.exceptions import TaskRevokedError

from dynamic_batching.conf import conf

from ..core.errors import DeadlineExceeded, RequestLost
from ..protocol.names import DEADLINES_KEY, PRIORITIES, SHARED_BATCH_QUEUES, device_queue_name
from ..protocol.results import Outcome
from ..store import clock, deliveries, ledger, request_queues, shared_state
from . import inbox

if TYPE_CHECKING:
    from .loop import Collector

log = logging.getLogger(__name__)

#: How often the collector re-reads the policy and the live devices, and writes its own
#: heartbeat. A policy saved in the admin takes effect within this (plus one batch).
HOUSEKEEPING_S = 0.25
#: How often it re-reads the slow inputs and sweeps the ledger.
SWEEP_EVERY_S = 5.0


#: A request still unanswered this long past its deadline, and not held here (the
#: scheduler expires those itself), is answered DeadlineExceeded wherever it is: waiting
#: behind the window, or in a batch whose device died or hung. Its batch's answer, if it
#: comes later, is refused by the write-once outcome.
DEADLINE_GRACE_S = 1.0
#: Most requests answered so per turn.
DEADLINE_PAGE = 500


def expire_overdue(c: Collector, r: Any) -> None:
    """Answer every request past its deadline (plus the grace) that this collector does
    not hold (issue 41, finding 9: deadlines bound only held requests)."""
    cutoff = clock.now() - DEADLINE_GRACE_S
    rows = r.zrangebyscore(DEADLINES_KEY, "-inf", cutoff, start=0, num=DEADLINE_PAGE)
    ids = [i.decode() if isinstance(i, bytes) else i for i in rows]
    ids = [i for i in ids if i not in c.held]
    if not ids:
        return
    log.warning("answering %d request(s) past their deadline outside this collector with DeadlineExceeded", len(ids))
    detail = "passed its deadline before it was answered (queued, or in a batch that did not finish in time)"
    payloads = r.hmget(ledger.PAYLOADS_KEY, ids)
    c.outcomes.write(
        [
            Outcome(i, error=DeadlineExceeded(i, detail), celery=inbox.celery_of(raw))
            for i, raw in zip(ids, payloads, strict=True)
        ]
    )
    c.stats["expired_elsewhere"] = c.stats.get("expired_elsewhere", 0) + len(ids)


def run(c: Collector, r: Any, now: float) -> None:
    c.lease.renew()  # raises LeaseLost if another collector took over
    apply_policy(c, shared_state.read_policy(r))
    read_devices(c, r)
    stale = c.slots.reclaim_stale()
    for batch_id, age in stale:
        log.warning("batch %s not reported done after %.1fs; reclaiming its slot", batch_id, age)
    if stale:
        recover_vanished(c, r, [batch_id for batch_id, _ in stale])
    sweep_purged(c, r)  # before the ledger sweep, which would queue them again
    if now >= c.next_sweep:
        c.next_sweep = now + SWEEP_EVERY_S
        c.slow_inputs = shared_state.slow_inputs(r)
        # Anything held that this collector does not know is adopted before anything is
        # judged lost: at start (next_sweep is 0), what the previous collector held
        # (issue 41, finding 2); later, what a take whose reply was lost left (finding 1).
        c.adopt()
        sweep_ledger(c, r)
    expire_overdue(c, r)  # after the adoption: a held request is the scheduler's to expire
    buffered = heartbeat(c, r)
    c.metrics.flush(r, buffered=buffered)


def apply_policy(c: Collector, policy: Any) -> None:
    if policy != c.policy:
        log.info("collector applies policy version %d", policy.version)
        c.policy = policy
        for model, sched in c.schedulers.items():
            sched.set_policy(policy.for_model(model))


def read_devices(c: Collector, r: Any) -> None:
    live = shared_state.live_devices(r)
    c.devices = len(live)
    c.outbox.device_names = sorted(str(info.get("device")) for info in live.values())


def recover_vanished(c: Collector, r: Any, batch_ids: list[str]) -> None:
    """Batches not reported done in time that are nowhere, neither queued nor held
    unacked by a device, died with the device that took them (between kombu's BRPOP and
    its unacked write): no broker redelivery will bring them back. Their requests are
    made overdue in the ledger (touched at time 0) and the sweep runs at once, instead of after
    LEDGER_GRACE_S. A batch still somewhere (running long, or handed back by a
    restarted device: gpu_workers/taken.py) is left to run."""
    queues = [*SHARED_BATCH_QUEUES, *(device_queue_name(name) for name in c.outbox.device_names)]
    requests = {batch_id: c.slots.requests.pop(batch_id, []) for batch_id in batch_ids}
    gone = deliveries.nowhere(r, batch_ids, queues)
    ids = [task_id for batch_id in gone for task_id in requests[batch_id]]
    if ids:
        log.warning(
            "batch(es) %s vanished with the device that took them; their %d request(s) go back now", gone, len(ids)
        )
        ledger.touch(r, ids, 0.0)  # overdue at once
        c.next_sweep = 0.0


def sweep_purged(c: Collector, r: Any) -> None:
    """A request purged from its queue (`celery purge -Q batching.requests.normal`)
    stays purged: it ends REVOKED, as a revoked one does (its ledger entry struck off
    and its owner's slots freed by the outcome's write), instead of being found lost by
    the ledger sweep and queued again."""
    gone = [task_id for _, task_id in request_queues.purged(r)]
    if not gone:
        return
    payloads = dict(zip(gone, r.hmget(ledger.PAYLOADS_KEY, gone), strict=True))
    ended = [t for t in gone if payloads[t] is not None]  # the rest were answered already
    log.warning("%d request(s) were purged from their queue; they end REVOKED and never run", len(ended))
    c.outcomes.write(
        [
            Outcome(
                t,
                error=TaskRevokedError("purged"),
                details={"revoked": True, "purged": True},
                celery=inbox.celery_of(payloads[t]),
            )
            for t in ended
        ]
    )
    c.stats["purged"] = c.stats.get("purged", 0) + len(ended)


def sweep_ledger(c: Collector, r: Any, now: float | None = None) -> None:
    """Queue again any accepted request that has gone missing, or answer it with
    `RequestLost` once it has been queued again `LEDGER_ATTEMPTS` times (the rule is in
    tasks/store/ledger.py)."""
    now = clock.now() if now is None else now
    overdue = ledger.overdue(r, now - conf.LEDGER_GRACE_S)
    if not overdue:
        return
    tiers = {task_id: (raw, request_queues.queue_of(raw)) for task_id, _, raw in overdue}
    missing = ledger.lost(
        ((task_id, touched, tiers[task_id][1]) for task_id, touched, _ in overdue),
        c.held,
        request_queues.oldest_waiting(r),
    )
    again, give_up = [], []
    for task_id, attempts in zip(missing, ledger.count_attempts(r, missing), strict=True):
        (again if attempts <= conf.LEDGER_ATTEMPTS else give_up).append((task_id, attempts))
    for task_id, attempts in again:
        log.warning("request %s was accepted but went missing; queuing it again (attempt %d)", task_id, attempts)
    request_queues.republish(r, [(tiers[t][1], t, tiers[t][0]) for t, _ in again])  # type: ignore[misc]
    if give_up:
        log.error("giving up on %d request(s) that went missing more than %d times", len(give_up), conf.LEDGER_ATTEMPTS)
        c.outcomes.write(
            [
                Outcome(t, error=RequestLost(t, n), details={"lost": True}, celery=inbox.celery_of(tiers[t][0]))
                for t, n in give_up
            ]
        )
    c.stats["republished"] = c.stats.get("republished", 0) + len(again)
    c.stats["given_up"] = c.stats.get("given_up", 0) + len(give_up)


def heartbeat(c: Collector, r: Any) -> dict[str, int]:
    """Write the collector's heartbeat; returns what it buffers per tier."""
    buffered = {p: sum(s.depth(p) for s in c.schedulers.values()) for p in PRIORITIES}
    shared_state.collector_heartbeat(
        {
            "hostname": c.hostname,
            "pid": os.getpid(),
            "lease": c.lease.token,
            "policy_version": c.policy.version,
            "devices": c.devices,
            "outstanding": len(c.slots),
            "buffered": buffered,
            "slow_lane": {
                "depth": len(c.slow_lane),
                "oldest_wait_s": round(c.slow_lane.oldest_wait_s(), 3),
                "device_share": round(c.slow_lane.share(), 4),
            },
            "stats": c.stats,
            # What a batch of each model costs, as the scheduler weighs padding against
            # a second batch: fixed ms per batch and us per padded token.
            "costs": {
                model: {
                    "batch_ms": round(line[0] * 1000, 3),
                    "token_us": round(line[1] * 1e6, 3),
                    "batches": costs.observed,
                    "used": costs.warm,
                }
                for model, costs in c.slots.costs.items()
                if (line := costs.line()) is not None
            },
            "at": clock.now(),
        },
        r,
    )
    return buffered
