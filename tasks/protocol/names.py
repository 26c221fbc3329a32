"""Every name two processes must agree on: queues, task names, priorities and Redis keys.

A name is spelled here and nowhere else (tests/unit/test_names.py greps the tree for
stray literals), so a queue or key can be renamed in one line.
"""

from __future__ import annotations

import uuid

from ..core.policy import PRIORITIES

__all__ = ["PRIORITIES"]

# --- Celery task names -------------------------------------------------------------------

#: One request: a Celery task message that the collector consumes itself.
REQUEST_TASK = "batching.request"
#: The batched model as a task a host calls (`infer.delay(text)`, canvas, `send_task`):
#: its apply_async admits a request through the edge (tasks/edge/task.py).
INFER_TASK = "batching.infer"
#: One batch, run by whichever device worker is free.
BATCH_TASK = "batching.run_batch"
#: Callback of a chord of batches sent in one collector turn (tasks/collector/rounds.py).
ROUND_TASK = "batching.round_done"

# --- queues --------------------------------------------------------------------------------

#: Every batching queue's name starts with this, so none meets a host project's own
#: queue (`batches` and `requests.high` are names a host may well use).
QUEUE_PREFIX = "batching."

#: collector -> any device worker.
BATCH_QUEUE = QUEUE_PREFIX + "batches"
#: Batches of the slow lane (tasks/core/slowlane.py): inputs known to be slow, one per
#: batch. Their own queue, so Flower (and anyone) can filter them out by queue.
SLOW_BATCH_QUEUE = QUEUE_PREFIX + "batches.slow"
#: Every queue of shared batch work a device worker pulls from.
SHARED_BATCH_QUEUES: tuple[str, ...] = (BATCH_QUEUE, SLOW_BATCH_QUEUE)


def batch_queue_name(lane: str) -> str:
    """The shared queue of a batch's lane ("normal" or "slow")."""
    return SLOW_BATCH_QUEUE if lane == "slow" else BATCH_QUEUE


#: device workers -> collector ("done", "yielding", "slow", "hello").
EVENTS_QUEUE = QUEUE_PREFIX + "collector.events"
#: Celery's own queue for the collector worker (remote control, round_done).
CONTROL_QUEUE = QUEUE_PREFIX + "collector.control"


def request_queue_name(priority: str) -> str:
    """client -> collector, one queue per priority tier."""
    return f"{QUEUE_PREFIX}requests.{priority}"


def device_queue_name(device: str) -> str:
    """collector -> one pinned device. Queue names become Redis keys: no ':'."""
    return QUEUE_PREFIX + "device." + device.replace(":", "")


# --- Redis keys ------------------------------------------------------------------------------

PREFIX = "batching:"

#: A list of at most one token: a request has arrived (wakes the collector).
WAKE_KEY = PREFIX + "wake"


def held_key(priority: str) -> str:
    """Hash: request id -> message, taken by the collector and not yet in a batch."""
    return f"{PREFIX}held:{priority}"


def queued_key(priority: str) -> str:
    """Set: the ids of the requests waiting in a tier's queue, written in the same
    scripts that push and take them, so an id here and not in the queue was removed by
    someone else (`celery purge`: tasks/collector/housekeeping.py::sweep_purged)."""
    return f"{PREFIX}queued:{priority}"


#: kombu's Redis transport keeps unacked messages in a hash, indexed by a sorted set and
#: swept under a lock, by default under names every consumer of the database shares.
#: The batching workers use their own (protocol/app.py configure_worker): their 30 s
#: visibility timeout then restores only batching's messages, never a host task's.
UNACKED_KEY = PREFIX + "unacked"
UNACKED_INDEX_KEY = PREFIX + "unacked_index"
UNACKED_MUTEX_KEY = PREFIX + "unacked_mutex"

#: Sorted set: accepted request id -> when it was (re)published (tasks/store/ledger.py).
LEDGER_KEY = PREFIX + "ledger"
#: Sorted set: accepted request id -> its deadline (Redis's clock), for requests that
#: have one: written at admission, struck with the answer, swept by the collector, so a
#: deadline binds wherever the request is (issue 41, finding 9).
DEADLINES_KEY = PREFIX + "deadlines"
#: Hash: accepted request id -> its task message, as it was queued.
LEDGER_PAYLOADS_KEY = PREFIX + "ledger:payloads"
#: Hash: accepted request id -> how often the ledger sweep has queued it again.
LEDGER_ATTEMPTS_KEY = PREFIX + "ledger:attempts"


def redeliveries_key(task_id: str) -> str:
    """Counter: how often the broker has handed this batch task out again (tasks/store/deliveries.py)."""
    return f"{PREFIX}redeliveries:{task_id}"


def tries_key(task_id: str) -> str:
    """Counter: how often this batch task, having come back, was put on a device again
    (tasks/store/deliveries.py)."""
    return f"{PREFIX}tries:{task_id}"


def taken_key(holder: str) -> str:
    """Hash: delivery tag -> delivery time, of the batch messages a device worker (by its
    device id) has taken from the broker and not yet finished (tasks/store/deliveries.py)."""
    return f"{PREFIX}taken:{holder}"


def owner_key(task_id: str) -> str:
    """String "<tier>|<owner>": who submitted this request (tasks/store/owners.py). It
    lives as long as the request's answer, and decides who may read it."""
    return f"{PREFIX}owner:{task_id}"


#: Sorted sets "<prefix><owner>:<tier>": a client's requests accepted and not yet
#: answered, scored by when to forget them if no answer ever comes. The admission script
#: counts them and the outcome script (set_once.lua) removes an answered one.
IN_FLIGHT_PREFIX = PREFIX + "in_flight:"


def in_flight_key(owner: str, priority: str) -> str:
    return f"{IN_FLIGHT_PREFIX}{owner}:{priority}"


#: Counter per client address or username: failed logins in the current window
#: (batching_site/logins.py).
LOGIN_FAILURES_PREFIX = PREFIX + "login_failures:"

#: String per ticket nonce: a ticket to Flower's host name, used (batching_site/gate.py).
FLOWER_TICKETS_PREFIX = PREFIX + "flower_tickets:"

#: Sorted set: owner -> when it last had a request admitted (the dashboard's clients).
OWNERS_INDEX_KEY = PREFIX + "owners"


def rate_key(owner: str) -> str:
    """Hash {tokens, at}: a client's rate bucket (tasks/core/quota.py)."""
    return f"{PREFIX}rate:{owner}"


def stats_rate_key(owner: str) -> str:
    """Hash {tokens, at}: a client's bucket for reading the dashboard's numbers."""
    return f"{PREFIX}stats-rate:{owner}"


#: Hash: counters of first answers and of refused second answers.
ANSWERS_KEY = PREFIX + "answers"

#: Lists "<prefix><group>": the answers of one `submit_many` or `run_many` call
#: (tasks/edge/client.py), pushed by the outcome script (set_once.lua) as each is
#: stored, so the caller pops them instead of listening for each on its own channel.
REPLIES_PREFIX = PREFIX + "replies:"
#: The version digit that marks a request id as one of a reply group (reply_ids), and
#: where it stands in the id. Requests nobody waits for (the web's) have version 4 ids
#: and no reply list.
REPLY_ID_VERSION, REPLY_ID_VERSION_AT = "8", 14
#: How many leading characters of a grouped id name its group.
REPLY_GROUP_CHARS = 23


def reply_ids(n: int) -> tuple[str, list[str]]:
    """`n` fresh request ids that share one reply list, and that list's key.

    They are UUIDs of version 8 (RFC 9562's layout for custom ids): 74 random bits that
    the group shares, then each request's index in the last 48 bits. Any UUID parser
    takes them, so they serve everywhere a version 4 id does (task ids, URLs)."""
    if not 0 < n < 1 << 48:
        raise ValueError(f"a reply group holds 1 to 2**48 - 1 requests, not {n}")
    base = (uuid.uuid4().int >> 48) << 48
    base = (base & ~(0xF << 76)) | (int(REPLY_ID_VERSION, 16) << 76)  # the version digit
    base = (base & ~(0x3 << 62)) | (0x2 << 62)  # RFC 9562's variant
    ids = [str(uuid.UUID(int=base | i)) for i in range(n)]
    return reply_key(ids[0]), ids


def reply_key(task_id: str) -> str | None:
    """The reply list a request's answer is pushed to, or None for an ordinary id.
    set_once.lua applies the same rule."""
    if task_id[REPLY_ID_VERSION_AT : REPLY_ID_VERSION_AT + 1] != REPLY_ID_VERSION:
        return None
    return REPLIES_PREFIX + task_id[:REPLY_GROUP_CHARS]


#: JSON of the active BatchPolicy (the admin writes it).
POLICY_KEY = PREFIX + "policy"
#: One key per live device worker, with a TTL (its heartbeat).
DEVICE_PREFIX = PREFIX + "device:"
#: Sorted set: device id -> time of its last heartbeat, an index of DEVICE_PREFIX keys.
DEVICES_INDEX = PREFIX + "devices"
#: The active collector's own heartbeat.
COLLECTOR_KEY = PREFIX + "collector"
#: The active collector's lease: its fencing token, expiring unless renewed.
COLLECTOR_LEASE_KEY = PREFIX + "collector:lease"
#: Counter: the last fencing token handed out; each new active collector gets the next.
COLLECTOR_EPOCH_KEY = PREFIX + "collector:epoch"
#: Sorted set: fingerprint of an input confirmed too slow to share a batch -> when to
#: forget it. Such inputs go to the slow lane.
SLOW_INPUTS_KEY = PREFIX + "slow_inputs_until"
#: Capped list of recorded rounds, newest first.
ROUNDS_KEY = PREFIX + "rounds"

#: Everything under this is a metric (tasks/metrics/).
METRICS_PREFIX = PREFIX + "metrics:"
METRICS_COUNTERS_KEY = METRICS_PREFIX + "counters"
METRICS_HIST_PREFIX = METRICS_PREFIX + "hist:"
METRICS_RUN_DEVICES_KEY = METRICS_PREFIX + "run_devices"
METRICS_SERIES_KEY = METRICS_PREFIX + "series"
METRICS_RECENT_FAILED_KEY = METRICS_PREFIX + "recent:failed"
METRICS_RECENT_SLOW_KEY = METRICS_PREFIX + "recent:slow"
#: Hash: owner -> requests refused at the edge (its quota or the tier's cap).
METRICS_REFUSED_BY_OWNER_KEY = METRICS_PREFIX + "refused_by_owner"

# --- Celery's event stream (what Flower reads) ------------------------------------------------

EVENTS_EXCHANGE = "celeryev"
EVENTS_ROUTING_KEY = "task.multi"
