"""A stream's max_subscriptions: the per-stream count of open Subscribe calls on the node that
serves them (node/transport/subscriptions.py, StreamSubscriptions) and the config field's
update (node/engine/stream_config.py)."""

from __future__ import annotations

import pytest

from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.stream_config import apply_update
from raftlog.node.transport.subscriptions import StreamSubscriptions
from raftlog.v1 import streams_pb2, types_pb2


def refused(counts: StreamSubscriptions, stream: str) -> RaftlogError:
    with pytest.raises(RaftlogError) as caught:
        counts.take(stream)
    assert caught.value.reason is Reason.TOO_MANY_SUBSCRIPTIONS
    assert caught.value.metadata["stream"] == stream
    assert int(caught.value.metadata["retry_after_ms"]) > 0
    return caught.value


def test_a_stream_at_its_limit_refuses_one_more_and_a_refusal_holds_nothing() -> None:
    limit = {"orders": 2}
    counts = StreamSubscriptions(lambda stream: limit.get(stream, 0))
    first, second = counts.take("orders"), counts.take("orders")
    assert refused(counts, "orders").metadata["limit"] == "2"
    assert counts.open("orders") == 2
    other = counts.take("audit")  # another stream has its own count (and no limit)
    first()
    third = counts.take("orders")  # a slot came back
    for give_back in (second, third, other):
        give_back()
    assert counts.open("orders") == 0 and counts.open("audit") == 0


def test_subscriptions_are_counted_without_a_limit_so_a_limit_set_later_applies() -> None:
    limit = {"orders": 0}
    counts = StreamSubscriptions(lambda stream: limit[stream])
    held = [counts.take("orders") for _ in range(3)]
    limit["orders"] = 3  # the operator sets a limit while three are open
    refused(counts, "orders")
    held.pop()()
    counts.take("orders")()
    limit["orders"] = 0  # lifted
    counts.take("orders")()


def test_update_sets_and_lifts_max_subscriptions_and_keeps_it_otherwise() -> None:
    current = types_pb2.StreamConfig(name="orders", subjects=["orders.>"], replicas=3)
    limited = apply_update(current, streams_pb2.UpdateStreamRequest(name="orders",
                                                                    max_subscriptions=5))
    assert limited.max_subscriptions == 5
    kept = apply_update(limited, streams_pb2.UpdateStreamRequest(name="orders", max_msgs=10))
    assert (kept.max_subscriptions, kept.max_msgs) == (5, 10)
    lifted = apply_update(kept, streams_pb2.UpdateStreamRequest(name="orders",
                                                                max_subscriptions=0))
    assert lifted.max_subscriptions == 0
