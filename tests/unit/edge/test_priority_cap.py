"""A client may ask only for tiers up to its quota's `max_priority` (issue 42, finding
2: anyone could claim `high`, and the tiers meant nothing). Above it: refused, 403,
before any input is parsed or Redis is asked."""

from __future__ import annotations

import pytest

from dynamic_batching.conf import conf
from dynamic_batching.core.errors import PriorityNotAllowed
from dynamic_batching.core.quota import Quota
from dynamic_batching.edge.client import submit_many
from dynamic_batching.web.errors import refusal


def test_a_tier_above_the_quotas_highest_is_refused_with_403() -> None:
    with pytest.raises(
        PriorityNotAllowed, match=r"priority 'high' is above what your quota allows \('normal' at most\)"
    ):
        submit_many(["urgent"], priority="high", owner="user:1", quota=Quota())
    answer = refusal(PriorityNotAllowed("user:1", "high", "normal"))
    assert answer is not None and answer.status == 403


def test_the_defaults_users_normal_demo_visitors_low() -> None:
    assert Quota().max_priority == "normal"
    anonymous = Quota.from_mapping(conf.ANONYMOUS_QUOTA)
    assert anonymous.max_priority == "low" and not anonymous.allows("normal") and anonymous.allows("low")
    assert Quota(max_priority="high").allows("high")
    with pytest.raises(ValueError, match="max_priority must be one of high, normal, low"):
        Quota(max_priority="urgent")
