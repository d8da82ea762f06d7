"""DISCARD_NEW (docs/quotas.md): a stream at its max_msgs or max_bytes refuses what would take
it past them with STREAM_FULL and a retry hint, keeps what it holds, and takes messages again
once room comes back. Over both message stores, like test_streams.py."""

from __future__ import annotations

import pytest

from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.stream_publish import Appended, draft
from raftlog.v1 import streams_pb2, types_pb2
from tests.engine.test_streams import Harness, Place, create, place, run

__all__ = ["place"]  # the fixture, over both stores


@pytest.mark.parametrize(("fields", "accepted"), [
    ({"max_msgs": 3}, 3),
    ({"max_bytes": 12}, 2),  # 6 bytes a message ("a" + 5 payload bytes)
])
def test_discard_new_refuses_past_the_limit_and_keeps_the_oldest(
        place: Place, fields: dict[str, int], accepted: int) -> None:
    async def body(h: Harness) -> None:
        await create(h, discard=types_pb2.DISCARD_NEW, **fields)
        outcomes = await h.engine.publish("s", [draft("a", b"xxxxx") for _ in range(5)])
        assert all(isinstance(o, Appended) for o in outcomes[:accepted]), outcomes
        for refused in outcomes[accepted:]:
            assert isinstance(refused, RaftlogError) and refused.reason is Reason.STREAM_FULL
            assert int(refused.metadata["retry_after_ms"]) > 0
        state = h.engine.info("s").state
        assert (state.first_seq, state.messages, state.last_seq) == (1, accepted, accepted)
        await h.engine.purge(streams_pb2.PurgeStreamRequest(name="s"))
        (again,) = await h.engine.publish("s", [draft("a", b"xxxxx")])
        assert isinstance(again, Appended) and again.seq == accepted + 1

    run(place, body)


def test_discard_old_is_the_default(place: Place) -> None:
    async def body(h: Harness) -> None:
        await create(h, max_msgs=3)
        outcomes = await h.engine.publish("s", [draft("a", b"x") for _ in range(5)])
        assert all(isinstance(o, Appended) for o in outcomes)
        assert h.engine.info("s").state.first_seq == 3

    run(place, body)
