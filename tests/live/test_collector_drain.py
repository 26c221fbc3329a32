"""A collector stopped with SIGTERM (supervisord's stop, `docker compose stop`) puts
what it holds back at the head of its queues before it lets the lease go, so nothing
waits for the next collector's adoption sweep (issue 41, "untested guarantees": the
collector's drain on SIGTERM)."""

from __future__ import annotations

from pathlib import Path

import pytest
from polling import poll_until

from dynamic_batching.edge.client import submit_many
from dynamic_batching.protocol import wire
from dynamic_batching.protocol.names import COLLECTOR_LEASE_KEY, held_key, request_queue_name
from dynamic_batching.store import shared_state

pytestmark = pytest.mark.live


def test_a_collector_stopped_with_sigterm_puts_what_it_held_back_in_its_queue(bare_redis) -> None:  # type: ignore[no-untyped-def]
    r = shared_state.client()
    results = submit_many([f"held when the collector stops {i}" for i in range(5)], model="synthetic")
    ids = {x.id for x in results}
    bare_redis.start_collector()  # no device: it takes them and holds them
    poll_until(lambda: len(r.hkeys(held_key("normal"))) == len(ids), "the collector to hold every request", timeout=60)
    assert r.llen(request_queue_name("normal")) == 0

    bare_redis.stop("collector")  # SIGTERM, and supervisord does not start it again

    assert r.hlen(held_key("normal")) == 0, "it let go of what it held"
    queued = [wire.task_id_of(raw) for raw in r.lrange(request_queue_name("normal"), 0, -1)]
    assert sorted(queued) == sorted(ids), "each back in its queue, once"
    assert r.get(COLLECTOR_LEASE_KEY) is None, "and released its lease"
    log = Path(bare_redis.log_dir, "collector.log").read_text()
    assert "5 held request(s) back in their queues" in log
