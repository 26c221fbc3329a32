"""The settings the batching app reads, with their defaults: a Django project takes them
all with one line in its settings module, and overrides any after it::

    from tasks.defaults import *  # noqa

Each is read from the environment first, so one deployment's processes can be tuned
without editing code, and a value out of range stops the process naming the variable.
"""

from __future__ import annotations

import environ
from django.core.exceptions import ImproperlyConfigured

env = environ.Env()


def _check(ok: bool, variable: str, value: object, rule: str) -> None:
    """Refuse to start with a knob out of range, naming the variable and its value."""
    if not ok:
        raise ImproperlyConfigured(f"{variable} must be {rule}, got {value!r}")


# --- Broker and results -------------------------------------------------------------

#: One Redis (or Valkey) serves as broker and result backend. `make run` finds or
#: starts one at this address; tests start their own on a free port.
REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:6379/0")

CELERY_BROKER_URL = REDIS_URL
#: Celery's Redis backend, whose connections retry through a Redis restart (tasks/store/result_backend.py).
CELERY_RESULT_BACKEND = f"tasks.store.result_backend:RetryingRedisBackend+{REDIS_URL}"
#: JSON only: pickle would let anyone who can write to the broker run code.
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
#: Answers live an hour: a caller that has not fetched its answer by then has gone, and
#: Redis holds at most an hour of answers (about 4 KB each for MiniLM; docs/reliability.md).
CELERY_RESULT_EXPIRES = env.int("RESULT_EXPIRES_S", default=3600)
_check(CELERY_RESULT_EXPIRES > 0, "RESULT_EXPIRES_S", CELERY_RESULT_EXPIRES, "a positive number of seconds")
#: Workers pull one message at a time: a device worker never hoards batches that an
#: idle device could run.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
#: An unacked batch message (a batch a device runs) goes back to its queue this long
#: after its device vanished, or as soon as a worker restarts under that device's id
#: (gpu_workers/taken.py). No batch runs nearly this long. (Requests the collector
#: holds are in Redis hashes that the next collector adopts at once: tasks/request_queues.py.)
VISIBILITY_TIMEOUT_S = env.int("VISIBILITY_TIMEOUT_S", default=30)
_check(VISIBILITY_TIMEOUT_S > 0, "VISIBILITY_TIMEOUT_S", VISIBILITY_TIMEOUT_S, "a positive number of seconds")
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": VISIBILITY_TIMEOUT_S,
    # Sweep for abandoned messages every 5 s, all of them, so a killed holder's
    # messages are back in their queue within visibility timeout + 5 s.
    "unacked_restore_interval": 5,
    "unacked_restore_throttle": 1,
    "unacked_restore_limit": 10000,
    # The restore sweep holds a Redis lock; a sweeper killed mid-sweep must not block
    # every other sweep for kombu's default 5 minutes.
    "unacked_mutex_expire": 10,
}
#: An accepted request untouched this long since it was queued or sent to a device, and
#: waiting nowhere, was lost between Redis and a killed consumer: the collector queues
#: it again (tasks/store/ledger.py). Longer than any redelivery by the broker takes.
LEDGER_GRACE_S = env.float("LEDGER_GRACE_S", default=2 * VISIBILITY_TIMEOUT_S + 10)
_check(LEDGER_GRACE_S > VISIBILITY_TIMEOUT_S, "LEDGER_GRACE_S", LEDGER_GRACE_S, "more than VISIBILITY_TIMEOUT_S")
#: How often a lost request is queued again before it is answered with RequestLost.
LEDGER_ATTEMPTS = env.int("LEDGER_ATTEMPTS", default=3)
_check(LEDGER_ATTEMPTS >= 1, "LEDGER_ATTEMPTS", LEDGER_ATTEMPTS, "at least 1")
#: Flower shows a request as "sent" the moment it is queued. The events are published
#: by the script that queues the requests, so they cost no round trip of their own.
CELERY_TASK_SEND_SENT_EVENT = env.bool("TASK_SENT_EVENTS", default=True)
CELERY_WORKER_SEND_TASK_EVENTS = True
#: Flower shows every request as a task of its own: sent when queued (with
#: TASK_SENT_EVENTS) and succeeded or failed when answered. Flower is one process and
#: handles every event, so at a few thousand requests a second it is the first limit of
#: the process set (docs/observability.md). Off, Flower shows the batch tasks only; the
#: API, /requests/<id> and the dashboard still show every request.
BATCHING_REQUEST_EVENTS = env.bool("REQUEST_EVENTS", default=True)

# --- Batching -----------------------------------------------------------------------

#: The Celery app the batching package sends and reads through, by dotted path (the
#: package never imports the project's modules; another project names its own app).
BATCHING_CELERY_APP = env("BATCHING_CELERY_APP", default="batching_site.celery.app")

#: Devices that `make run` starts one worker for: "cuda:0,cuda:1", or "cpu:0,cpu:1".
#: Empty means every CUDA device, or two CPU devices when there is no CUDA.
DEVICES = env.list("DEVICES", default=[])
#: The models this system serves: name -> {"spec": dotted path of a ModelSpec class,
#: its options...}. From the environment as JSON, e.g.
#: BATCHING_MODELS='{"minilm": {"spec": "gpu_workers.models.minilm.MiniLMSpec"}}'.
#: docs/models.md lists the built-in adapters and how to write a spec.
BATCHING_MODELS = env.json("BATCHING_MODELS", default={"minilm": {"spec": "gpu_workers.models.minilm.MiniLMSpec"}})
#: The model a request gets when it names none; one of BATCHING_MODELS.
DEFAULT_MODEL = env("DEFAULT_MODEL", default="minilm")
#: The test model `synthetic` and its directives (!fail, !slow, !hang, !crash) are
#: refused unless this is on. Tests and benchmarks turn it on; `check --deploy` warns.
BATCHING_TEST_MODELS = env.bool("BATCHING_TEST_MODELS", default=False)

# --- Who may submit, and how much (tasks/core/quota.py, batching_site/web/access.py) ---

#: Open `/` and `/submit` to visitors who are not logged in. They share one small quota
#: (ANONYMOUS_QUOTA) and each reads only what its own browser session submitted.
BATCHING_OPEN_DEMO = env.bool("BATCHING_OPEN_DEMO", default=False)
#: A logged-in user's quota unless the admin sets one for the user or a group:
#: "rate_per_s=50,burst=200,max_in_flight=500,tier_share=0.5".
DEFAULT_QUOTA = env.dict("BATCHING_DEFAULT_QUOTA", cast={"value": float}, default={})
#: What all anonymous demo visitors share, together.
ANONYMOUS_QUOTA = env.dict(
    "BATCHING_ANONYMOUS_QUOTA",
    cast={"value": float},
    default={"rate_per_s": 2.0, "burst": 10, "max_in_flight": 20, "tier_share": 0.05},
)
#: The collector weighs a request's padding against a second batch's fixed cost, both
#: learned from the batches the devices ran (docs/scheduling.md). COST_PACKING=0 packs
#: by the length spreads alone.
COST_PACKING = env.bool("COST_PACKING", default=True)
#: Requests the collector holds per tier before it stops taking from that queue.
#: Bigger windows give the scheduler a fuller view to pack from.
COLLECTOR_WINDOW = env.int("COLLECTOR_WINDOW", default=256)
#: Batches queued per device beyond the one it runs. 0 forms each batch only when a
#: device is free (fullest batches); 1 hides the hand-off latency on fast GPUs.
COLLECTOR_BATCHES_AHEAD = env.int("COLLECTOR_BATCHES_AHEAD", default=0)
#: "pull" (the design): batches go to the shared `batches` queue and whichever device is
#: free takes the next one. "push" exists only as the baseline for bench/devices_bench.py:
#: the collector deals batches round-robin onto each device's own queue.
COLLECTOR_DISPATCH = env.str("COLLECTOR_DISPATCH", default="pull")
_check(COLLECTOR_WINDOW >= 1, "COLLECTOR_WINDOW", COLLECTOR_WINDOW, "at least 1")
_check(COLLECTOR_BATCHES_AHEAD >= 0, "COLLECTOR_BATCHES_AHEAD", COLLECTOR_BATCHES_AHEAD, "0 or more")
_check(COLLECTOR_DISPATCH in ("pull", "push"), "COLLECTOR_DISPATCH", COLLECTOR_DISPATCH, '"pull" or "push"')

#: The active collector's lease: a standby takes over this long after the active one
#: dies. The active one renews it every quarter second (tasks/store/lease.py).
COLLECTOR_LEASE_S = env.float("COLLECTOR_LEASE_S", default=2.0)
_check(COLLECTOR_LEASE_S >= 1, "COLLECTOR_LEASE_S", COLLECTOR_LEASE_S, "at least 1 second")

#: Tests only: pretend this process's host clock is off by this many seconds (decisions
#: read Redis's clock, tasks/store/clock.py, so nothing may change).
CLOCK_SKEW_S = env.float("CLOCK_SKEW_S", default=0.0)

# --- Device workers -----------------------------------------------------------------

#: Device failures in a row that open a device's circuit (it stops pulling work), and
#: how long it stays open before it tries one batch.
CIRCUIT_THRESHOLD = env.int("CIRCUIT_THRESHOLD", default=3)
CIRCUIT_COOLDOWN_S = env.float("CIRCUIT_COOLDOWN_S", default=30.0)
#: A batch handed back this many times runs anyway, so that with every device broken
#: its callers still get errors instead of waiting forever.
MAX_BOUNCES = env.int("MAX_BOUNCES", default=8)
#: A lone request whose batch the broker has handed out this many times again (its
#: worker died running it, or could not finish it) is answered with WorkerCrashed.
#: A batch of several that comes back is split in halves first, so the input at
#: fault ends up alone and its batch-mates are answered.
POISON_REDELIVERIES = env.int("POISON_REDELIVERIES", default=2)
_check(POISON_REDELIVERIES >= 1, "POISON_REDELIVERIES", POISON_REDELIVERIES, "at least 1")
#: 0 turns slow-request isolation off (no learned time limit, no slow lane): a
#: benchmark baseline.
SLOW_ISOLATION = env.bool("SLOW_ISOLATION", default=True)
#: A batch is cut off after SLOW_FACTOR times its expected time, never before
#: SLOW_FLOOR_S. Tighter catches slow inputs sooner but cuts more batches on a noisy host.
#: With preemption a batch past its cut-off no longer holds the queue, but its
#: batch-mates still wait for it: tighter answers them sooner.
SLOW_FACTOR = env.float("SLOW_FACTOR", default=2.0)
#: An input that made its batch too slow is remembered as slow only if, run alone, it is
#: SLOW_CONFIRM_FACTOR times slower than a batch-mate run alone just before it (each
#: against its expected time): a busy machine slows both alike.
SLOW_CONFIRM_FACTOR = env.float("SLOW_CONFIRM_FACTOR", default=4.0)
SLOW_FLOOR_S = env.float("SLOW_FLOOR_S", default=0.02)
#: A batch that has run PREEMPT_AFTER times its expected time (and a slow-lane batch at
#: once) lets waiting batches run between its layers (gpu_workers/preempt.py). Lower
#: spares the queue behind a slow input sooner; a batch that yields finishes later.
#: PREEMPTION=0 turns it off.
PREEMPTION = env.bool("PREEMPTION", default=True)
PREEMPT_AFTER = env.float("PREEMPT_AFTER", default=2.0)
#: One time bound for a whole batch, bisection and isolation included: each model call
#: gets at most what is left of it, and what it leaves unrun goes back to the queue. By
#: default 20 s, or two thirds of a shorter visibility timeout.
BATCH_HARD_LIMIT_S = env.float("BATCH_HARD_LIMIT_S", default=min(20.0, VISIBILITY_TIMEOUT_S * 2 / 3))
#: A model call still running this long past its hard limit is stuck in native code (a
#: hung kernel): the device worker hands its batch back and kills itself, and the
#: supervisor starts a fresh one (gpu_workers/watchdog.py).
HANG_GRACE_S = env.float("HANG_GRACE_S", default=min(2.0, VISIBILITY_TIMEOUT_S / 6))
_check(CIRCUIT_THRESHOLD >= 1, "CIRCUIT_THRESHOLD", CIRCUIT_THRESHOLD, "at least 1")
_check(CIRCUIT_COOLDOWN_S > 0, "CIRCUIT_COOLDOWN_S", CIRCUIT_COOLDOWN_S, "a positive number of seconds")
_check(MAX_BOUNCES >= 0, "MAX_BOUNCES", MAX_BOUNCES, "0 or more")
_check(SLOW_FACTOR > 1, "SLOW_FACTOR", SLOW_FACTOR, "over 1")
_check(SLOW_CONFIRM_FACTOR > 1, "SLOW_CONFIRM_FACTOR", SLOW_CONFIRM_FACTOR, "over 1")
_check(SLOW_FLOOR_S > 0, "SLOW_FLOOR_S", SLOW_FLOOR_S, "a positive number of seconds")
_check(PREEMPT_AFTER >= 0, "PREEMPT_AFTER", PREEMPT_AFTER, "0 or more (times the expected batch time)")
_check(HANG_GRACE_S > 0, "HANG_GRACE_S", HANG_GRACE_S, "a positive number of seconds")
# A batch still running (or hung and not yet found) when the broker hands it to another
# device would run twice.
_check(
    BATCH_HARD_LIMIT_S > 0 and BATCH_HARD_LIMIT_S + HANG_GRACE_S < VISIBILITY_TIMEOUT_S,
    "BATCH_HARD_LIMIT_S",
    BATCH_HARD_LIMIT_S,
    f"positive, and with HANG_GRACE_S ({HANG_GRACE_S}) under VISIBILITY_TIMEOUT_S ({VISIBILITY_TIMEOUT_S})",
)

# --- API tokens ----------------------------------------------------------------------

#: Days an API token from `manage.py create_api_token` works unless --expires-days says
#: otherwise; 0: tokens never expire. `manage.py api_tokens list` shows each one's expiry.
API_TOKEN_DEFAULT_EXPIRY_DAYS = env.int("API_TOKEN_DEFAULT_EXPIRY_DAYS", default=90)
_check(API_TOKEN_DEFAULT_EXPIRY_DAYS >= 0, "API_TOKEN_DEFAULT_EXPIRY_DAYS", API_TOKEN_DEFAULT_EXPIRY_DAYS, "0 or more")


#: `from tasks.defaults import *` hands a settings module the settings only, not the
#: helpers above.
__all__ = [name for name in dir() if name.isupper()]
