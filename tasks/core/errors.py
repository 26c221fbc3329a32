"""Errors a caller can receive, from `submit` or from `AsyncResult.get()`.

They travel through the JSON result backend as (type, module, args), and Celery rebuilds
them on the caller's side by importing this module: so each keeps its constructor
arguments in `args` and imports nothing but the standard library.
"""

from __future__ import annotations


class BatchingError(Exception):
    """Base class for every error this system raises on purpose."""


class Overloaded(BatchingError):
    """A priority's queue is at its cap; try again after `retry_after` seconds."""

    def __init__(self, queue: str, cap: int, retry_after: float) -> None:
        super().__init__(queue, cap, retry_after)
        self.queue, self.cap, self.retry_after = queue, cap, retry_after

    def __str__(self) -> str:
        return (
            f"queue {self.queue!r} is full ({self.cap} requests waiting, its cap); retry after {self.retry_after:.2f}s"
        )


class QuotaExceeded(Overloaded):
    """One client's quota (tasks/core/quota.py) refused its requests: the others still
    get in. `limit` says which: "rate", "in_flight" or "share"."""

    _WHAT = {
        "rate": "you are sending faster than your rate limit",
        "in_flight": "you have as many requests waiting for answers as your quota allows",
        "share": "you hold your share of the {tier} tier's queue",
        "stats": "you are reading the dashboard's numbers faster than its rate limit (2 a second, 10 at once)",
    }

    def __init__(self, owner: str, limit: str, tier: str, retry_after: float) -> None:
        BatchingError.__init__(self, owner, limit, tier, retry_after)
        self.owner, self.limit, self.tier, self.retry_after = owner, limit, tier, retry_after
        self.queue, self.cap = tier, 0

    def __str__(self) -> str:
        what = self._WHAT.get(self.limit, "your quota is used up").format(tier=self.tier)
        return (
            f"{what}; retry after {self.retry_after:.2f}s, or wait for your pending answers "
            "(an operator can raise your quota in the admin)"
        )


class BurstExceeded(BatchingError, ValueError):
    """One call holds more inputs than the caller's quota lets in at once (its burst):
    no wait would ever let it in, so it is refused at once, not told to retry."""

    def __init__(self, owner: str, inputs: int, burst: int) -> None:
        super().__init__(owner, inputs, burst)
        self.owner, self.inputs, self.burst = owner, inputs, burst

    def __str__(self) -> str:
        return (
            f"{self.inputs} inputs in one call is more than your quota's burst of {self.burst}: "
            f"send at most {self.burst} a call (an operator can raise the burst in the admin)"
        )


class PriorityNotAllowed(BatchingError):
    """The caller asked for a tier above its quota's highest (`max_priority`)."""

    def __init__(self, owner: str, priority: str, allowed: str) -> None:
        super().__init__(owner, priority, allowed)
        self.owner, self.priority, self.allowed = owner, priority, allowed

    def __str__(self) -> str:
        return (
            f"priority {self.priority!r} is above what your quota allows ({self.allowed!r} at most): "
            f"send {self.allowed!r} or lower (an operator can raise it in the admin, Client quotas)"
        )


class RequestTooLarge(BatchingError, ValueError):
    """A request is longer than the model or the batch token budget allows."""

    def __init__(self, tokens: int, limit: int, what: str = "limit") -> None:
        super().__init__(tokens, limit, what)
        self.tokens, self.limit, self.what = tokens, limit, what

    def __str__(self) -> str:
        return (
            f"request has {self.tokens} tokens, over the {self.what} of {self.limit}; "
            "shorten it, or ask an operator to set the oversized policy to truncate or run_alone"
        )


class DeadlineExceeded(BatchingError, TimeoutError):
    """A request was not dispatched before its deadline, so it was never run."""

    def __init__(self, request_id: str, detail: str = "not dispatched before its deadline") -> None:
        super().__init__(request_id, detail)
        self.request_id, self.detail = request_id, detail

    def __str__(self) -> str:
        return f"request {self.request_id} {self.detail}"


class BatchOutputMismatch(BatchingError):
    """The model returned a different number of outputs from the inputs it was given."""

    def __init__(self, inputs: int, outputs: int) -> None:
        super().__init__(inputs, outputs)
        self.inputs, self.outputs = inputs, outputs

    def __str__(self) -> str:
        return f"batch function returned {self.outputs} outputs for {self.inputs} inputs"


class InferenceError(BatchingError):
    """The model failed on this request; the message names the cause."""


class RequestLost(BatchingError):
    """A request went missing between hand-offs more often than the system retries, so
    it was given up on rather than left waiting forever."""

    def __init__(self, request_id: str, attempts: int) -> None:
        super().__init__(request_id, attempts)
        self.request_id, self.attempts = request_id, attempts

    def __str__(self) -> str:
        if self.attempts == 0:
            return (
                f"request {self.request_id} has neither an answer nor a place in the ledger of accepted "
                "requests: Redis lost it (a restart that lost the last writes of its append-only file); "
                "submit it again, and see docs/reliability.md for running Redis with appendfsync always"
            )
        return (
            f"request {self.request_id} went missing {self.attempts} times between the queue and a device "
            "and was given up on; submit it again, and if this repeats, check the device workers' logs"
        )


class WorkerCrashed(BatchingError):
    """Every time this request was tried alone, its device worker did not finish it: the
    process died (a segfault, an abort, an out-of-memory kill), hung in native code, or
    ran out of the batch's time bound."""

    def __init__(self, request_id: str, crashes: int, device: str) -> None:
        super().__init__(request_id, crashes, device)
        self.request_id, self.crashes, self.device = request_id, crashes, device

    def __str__(self) -> str:
        return (
            f"request {self.request_id}: its device worker died, hung or ran out of time {self.crashes} times "
            f"running this input alone (last on {self.device}); it was not tried again. Its batch-mates were answered"
        )


class ModelUnavailable(BatchingError):
    """A device could not load the model a request asked for."""

    def __init__(self, model: str, device: str, cause: str) -> None:
        super().__init__(model, device, cause)
        self.model, self.device, self.cause = model, device, cause

    def __str__(self) -> str:
        return f"model {self.model!r} could not be loaded on {self.device}: {self.cause}"
