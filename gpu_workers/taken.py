"""The batch messages this device worker holds, handed straight back to the broker by
the worker started in its place.

A batch task is acked only once every request in it is answered (acks_late), so when
its worker is killed (kill -9, the OOM killer, a segfault) the message stays in kombu's
unacked hash until the visibility timeout (30 s, plus the 5 s restore sweep) hands it
out again; its callers waited all that time. Here the worker notes the delivery tag of
each batch message it takes, from the consumer (Celery's `task_received`) or between
a long batch's layers (gpu_workers/preempt.py), and releases it when the batch task
returns. supervisord, or docker, restarts a killed worker in place under the same
device id; before it loads its models it restores every tag its predecessor left with
the same steps as kombu's `restore_by_tag`. The message comes back marked redelivered, exactly as
after the timeout, and is counted and split the same way (DeviceRunner._came_back).

Why nothing runs twice: only a message still unacked as the same delivery is restored.
kombu keeps a message's tag for life, so a message the broker handed to another device
meanwhile has the same tag: the note holds the delivery's time in kombu's unacked index
too, and deliveries.restore checks it in one transaction. And the old worker is dead
(gpu_workers/step.py refuses a second live worker under one device id).
A hung worker hands its batch back itself, so it drops that note before it dies.
Two live workers given the same device id would hand each other's batches back; the
outcome store still keeps only a first answer.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery

from dynamic_batching.protocol.names import BATCH_TASK
from dynamic_batching.store import deliveries, shared_state

log = logging.getLogger(__name__)


class Taken:
    def __init__(self, app: Celery, holder: str) -> None:
        self.app = app
        self.holder = holder
        self._tags: dict[str, str] = {}

    def took(self, task_id: str, tag: str) -> None:
        self._tags[task_id] = tag
        try:
            deliveries.hold(shared_state.client(), self.holder, tag)
        except Exception:  # noqa: BLE001 - without the note, the visibility timeout still brings it back
            log.warning("could not note batch %s as taken by %s", task_id, self.holder, exc_info=True)

    def finished(self, task_id: str) -> None:
        tag = self._tags.pop(task_id, None)
        if tag is None:
            return
        try:
            deliveries.release(shared_state.client(), self.holder, tag)
        except Exception:  # noqa: BLE001 - a stale note restores nothing: the tag is gone from the broker
            log.warning("could not release batch %s of %s", task_id, self.holder, exc_info=True)

    def tag_of(self, task_id: str) -> str | None:
        """The delivery tag this worker took `task_id` under, while it holds it."""
        return self._tags.get(task_id)

    def reclaim(self) -> int:
        """Hand back to the broker the batch messages a killed worker under this device
        id left unacked and nobody took since; returns how many it handed back."""
        try:
            r = shared_state.client()
            noted = deliveries.held(r, self.holder)
            back = sum(
                1
                for tag, delivered_at in noted.items()
                if delivered_at is not None and deliveries.restore(r, tag, delivered_at)
            )
        except Exception:  # noqa: BLE001 - the visibility timeout still brings them back
            log.warning("could not hand back the batches %s left", self.holder, exc_info=True)
            return 0
        if back:
            log.warning("handed back %d batch message(s) that %s held when it died", back, self.holder)
        return back

    def on_received(self, sender: Any = None, request: Any = None, **_: Any) -> None:
        """Celery's `task_received`: note a batch task's delivery tag."""
        if request is not None and request.name == BATCH_TASK and request.message is not None:
            self.took(request.id, request.message.delivery_tag)
