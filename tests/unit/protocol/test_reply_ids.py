"""Reply groups: ids that name the list their answers are pushed to."""

from __future__ import annotations

import uuid

import pytest

from dynamic_batching.protocol.names import reply_ids, reply_key


def test_reply_ids_are_uuids_that_name_their_group() -> None:
    key, ids = reply_ids(3)
    assert len(set(ids)) == 3
    assert all(uuid.UUID(t).version == 8 and uuid.UUID(t).variant == uuid.RFC_4122 for t in ids)
    assert {reply_key(t) for t in ids} == {key}
    assert reply_key(reply_ids(1)[1][0]) != key


def test_ordinary_request_ids_have_no_reply_list() -> None:
    assert all(reply_key(str(uuid.uuid4())) is None for _ in range(100))


@pytest.mark.parametrize("n", [0, 1 << 48])
def test_a_reply_group_holds_at_least_one_and_fewer_than_2_to_the_48_requests(n: int) -> None:
    with pytest.raises(ValueError, match="reply group"):
        reply_ids(n)
