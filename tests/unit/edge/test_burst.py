"""A call of more inputs than the caller's burst can never be let in by the token
bucket: it is refused at once, naming the burst, before any input is parsed or Redis
is asked (issue 42, finding 4: it was refused as "rate" with a Retry-After that never
helped)."""

from __future__ import annotations

import pytest

from dynamic_batching.core.errors import BurstExceeded
from dynamic_batching.core.quota import Quota
from dynamic_batching.edge.client import submit_many
from dynamic_batching.web.errors import refusal


def test_a_call_over_the_burst_is_refused_at_once_naming_it() -> None:
    quota = Quota(burst=3)
    with pytest.raises(
        BurstExceeded, match="4 inputs in one call is more than your quota's burst of 3: send at most 3"
    ):
        submit_many(["a", "b", "c", "d"], owner="user:1", quota=quota)
    answer = refusal(BurstExceeded("user:1", 4, 3))
    assert answer is not None and answer.status == 422 and "Retry-After" not in answer.headers
