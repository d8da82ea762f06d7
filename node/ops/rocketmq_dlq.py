"""RocketMQ's retry and dead-letter rules on raftlog topics, for every RocketMQ front-end
(node/api/rocketmq_v1.py; v2 to follow): the back-off a nacked message waits before it comes
back, how many deliveries a group allows, and the move of a message to its group's dead-letter
topic `%DLQ%<group>` (raftlog topic `.DLQ.<group>`, docs/rocketmq-v1.md).

The back-off is RocketMQ's: a nack of delivery attempt n waits the delay of level 3 + n in the
broker's level table (so the first nack waits 30 s), the last level (2 h) for every attempt past
the table. A group allows 16 deliveries unless its client says otherwise.

A dead-lettered message is copied first and settled after: the copy is published with a msg_id
made from (topic, queue, seq), so a move that is retried (the client calls again after a lost
answer, or a failover cut the first try short) stores it once, and only then is the original
terminated (ConsumerOps.term), so it is never delivered to the group again. A crash between the
two leaves the original pending: it comes back and its next move finds the copy already stored.
"""

from __future__ import annotations

import json

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import rocketmq
from raftlog.node.ops.operations import Operations
from raftlog.node.transport.calls import Call
from raftlog.v1 import consumers_pb2, streams_pb2, topics_pb2, types_pb2

# RocketMQ's delay levels 1..18 (the broker's messageDelayLevel).
DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
RETRY_LEVEL_DELTA = 3  # a nack of attempt n waits level RETRY_LEVEL_DELTA + n
ORIGIN_HEADER = "Rmq-Dlq-Origin"  # JSON {"topic", "queue", "seq", "message_id"} of the original
DLQ_PREFIX = "%DLQ%"

_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000}


def _level_ms(text: str) -> int:
    return int(text[:-1]) * _UNIT_MS[text[-1]]


DELAY_LEVELS_MS = tuple(_level_ms(level) for level in DELAY_LEVELS.split())


def nack_delay_ms(delivery_attempt: int) -> int:
    """How long a message nacked on its `delivery_attempt`-th delivery (1 = first; anything
    lower counts as 1) stays invisible before it is delivered again."""
    level = RETRY_LEVEL_DELTA + max(delivery_attempt, 1)
    return DELAY_LEVELS_MS[min(level, len(DELAY_LEVELS_MS)) - 1]


def max_attempts(max_delivery_attempts: int) -> int:
    """The deliveries a group allows: its policy's number, or limits.rocketmq_attempts_default
    (RocketMQ's 16) for 0 (or less)."""
    return (max_delivery_attempts if max_delivery_attempts > 0
            else limits.rocketmq_attempts_default)


def dlq_topic(group: str) -> str:
    """The RocketMQ name of `group`'s dead-letter topic."""
    return f"{DLQ_PREFIX}{rocketmq.group_name(group)}"


def dlq_msg_id(topic: str, partition: int, seq: int) -> str:
    """The msg_id of the dead-letter copy of message `seq` of `topic`'s queue `partition`."""
    return f"dlq:{topic}:{partition}:{seq}"


async def _ensure_topic(ops: Operations, topic: str, via: Call) -> None:
    """Creates `topic` with one partition unless it exists (made on demand, as RocketMQ
    makes a group's DLQ topic on its first dead letter)."""
    try:
        await ops.topics.partitions(topic, via)
        return
    except RaftlogError as err:
        if err.reason != Reason.TOPIC_NOT_FOUND:
            raise
    try:
        await ops.topics.create(topics_pb2.CreateTopicRequest(name=topic, partitions=1), via)
    except RaftlogError as refused:
        if refused.reason != Reason.TOPIC_EXISTS:  # made meanwhile by another move
            raise


async def dead_letter(ops: Operations, *, topic: str, group: str, partition: int, seq: int,
                      via: Call) -> topics_pb2.PublishToTopicResponse:
    """Moves message `seq` of queue `partition` of raftlog topic `topic` to `group`'s
    dead-letter topic, then terminates it for `group`. Answers where the copy landed.
    NOT_DELIVERED (from the term) when the group was never given that message."""
    stream = await ops.topics.stream(topic, partition, via)
    original = await ops.streams.get_message(
        streams_pb2.GetMessageRequest(stream=stream, seq=seq), via)
    target = rocketmq.raftlog_topic(dlq_topic(group))
    await _ensure_topic(ops, target, via)
    origin = json.dumps({"topic": rocketmq.rocketmq_topic(topic), "queue": partition,
                         "seq": seq, "message_id": original.msg_id}, sort_keys=True)
    headers = [header for header in original.headers if header.key != ORIGIN_HEADER]
    headers.append(types_pb2.Header(key=ORIGIN_HEADER, value=origin))
    copied = await ops.topics.publish(topics_pb2.PublishToTopicRequest(
        topic=target, partition=0, payload=original.payload, headers=headers,
        msg_id=dlq_msg_id(topic, partition, seq)), via)
    settled = await ops.consumers.term(consumers_pb2.TermRequest(
        stream=stream, consumer=group, seqs=[seq], reason=f"moved to {dlq_topic(group)}"), via)
    for result in settled.results:
        if result.HasField("error"):
            reason = Reason.__members__.get(result.error.reason, Reason.INTERNAL)
            raise RaftlogError(reason, result.error.message, **result.error.metadata)
    return copied
