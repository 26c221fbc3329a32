"""Issue 41, finding 13: a host crash with `appendfsync everysec` loses the last second of
Redis's append-only file. A request admitted in that second is gone with its ledger
entry, and its caller waited for ever. The fault is injected: Redis is stopped, its
append-only file cut back to where it stood before the admission, and started again."""

from __future__ import annotations

import glob
import os
import time

import pytest

from dynamic_batching.core.errors import RequestLost
from dynamic_batching.edge.client import submit
from dynamic_batching.protocol.names import LEDGER_KEY
from dynamic_batching.store import shared_state

pytestmark = pytest.mark.live


def incr_file(data_dir: str) -> str:
    """The append-only file Redis writes to now (Redis 7: a manifest, a base file, and
    the incremental file new writes go to)."""
    [path] = glob.glob(os.path.join(data_dir, "appendonlydir", "*.incr.aof"))
    return path


def test_finding_13_a_request_redis_lost_ends_its_callers_wait_with_request_lost(bare_redis) -> None:  # type: ignore[no-untyped-def]
    kept = submit("admitted before the last second", model="synthetic")
    r = shared_state.client()
    r.ping()
    path = incr_file(bare_redis._tmp)
    size = os.path.getsize(path)
    lost = submit("admitted in the last second", model="synthetic")
    assert r.zscore(LEDGER_KEY, lost.id) is not None
    assert os.path.getsize(path) > size, "the admission is not in the file"

    bare_redis.stop("redis")
    with open(path, "r+b") as f:
        f.truncate(size)  # the host crashed before this was synced
    bare_redis.start_redis()
    assert r.zscore(LEDGER_KEY, lost.id) is None, "the fault did not land"
    assert r.zscore(LEDGER_KEY, kept.id) is not None

    t0 = time.monotonic()
    with pytest.raises(RequestLost, match="neither an answer nor a place in the ledger"):
        lost.get(timeout=30)
    print(f"RequestLost after {time.monotonic() - t0:.2f} s")
    assert not kept.ready()  # still queued, still waited for
