"""RocketMQ names and receipt handles on raftlog (node/ops/rocketmq.py; docs/rocketmq.md)."""

from __future__ import annotations

import pytest

from raftlog.base import topics
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import rocketmq
from raftlog.node.ops.rocketmq import Receipt


def test_topic_names_map_both_ways_and_dlq_topics_are_valid_raftlog_topics() -> None:
    assert rocketmq.raftlog_topic("orders") == "orders"
    assert rocketmq.raftlog_topic("%DLQ%billing") == ".DLQ.billing"
    assert rocketmq.rocketmq_topic(".DLQ.billing") == "%DLQ%billing"
    assert topics.validate_topic(rocketmq.raftlog_topic("%RETRY%billing")) == ".RETRY.billing"
    with pytest.raises(RaftlogError) as info:
        rocketmq.raftlog_topic("a|b")
    assert info.value.reason is Reason.INVALID_NAME


def test_groups_are_consumer_names() -> None:
    assert rocketmq.group_name("billing-1_a") == "billing-1_a"
    for bad in ("", "%RETRY%billing", "a.b", "x" * 129):
        with pytest.raises(RaftlogError):
            rocketmq.group_name(bad)


def test_receipt_handles_round_trip_and_forged_ones_are_refused() -> None:
    receipt = Receipt(partition=2, seq=41, delivery=3)
    assert receipt.handle() == "2.41.3"
    assert Receipt.parse(receipt.handle()) == receipt
    for forged in ("", "forged", "1.2", "1.2.3.4", "-1.2.3", "a.b.c"):
        with pytest.raises(RaftlogError) as info:
            Receipt.parse(forged)
        assert info.value.reason is Reason.INVALID_ARGUMENT
