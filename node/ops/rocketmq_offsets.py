"""RocketMQ's offset calls (apache.rocketmq.v2 PullMessage, QueryOffset, GetOffset,
UpdateOffset) and the recall of a delayed send, over topic, stream and schedule operations.
node/api/rocketmq_v2.py turns the answers into v2 messages and statuses.

Offsets (docs/rocketmq.md): a queue's offset IS the partition's seq, as SendMessage and
ReceiveMessage already report it. So a queue's first offset is its first stored seq (1 for a
queue that never dropped a message), its end offset the seq the next send gets (last seq + 1),
and a group's committed offset, the one it consumes next, is its raftlog ack floor + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops.operations import Operations
from raftlog.node.transport.calls import Call
from raftlog.v1 import streams_pb2, topics_pb2


@dataclass(frozen=True)
class QueueEnds:
    """A queue's offsets when it was read: `first` the oldest stored message's, `end` the
    one the next send gets (first == end: the queue holds nothing)."""

    first: int
    end: int


async def ends(ops: Operations, *, stream: str, via: Call) -> QueueEnds:
    state = (await ops.streams.info(streams_pb2.GetStreamInfoRequest(name=stream), via)).state
    return QueueEnds(first=max(state.first_seq, 1), end=state.last_seq + 1)


async def offset_at(ops: Operations, *, stream: str, at_ms: int, via: Call) -> int:
    """The offset of the first message stored at or after `at_ms` (unix ms); the end offset
    when every message is older."""
    found = await ops.streams.read_messages(streams_pb2.ReadMessagesRequest(
        stream=stream, start_time_ms=max(at_ms, 1), limit=1), via)
    return found.messages[0].seq if found.messages else found.last_seq + 1


async def pull(ops: Operations, *, stream: str, offset: int, batch: int, wait_ms: int,
               via: Call) -> streams_pb2.ReadMessagesResponse:
    """Up to `batch` messages from `offset` on (an offset below the queue's first: from the
    first), waiting up to `wait_ms` when there is none yet. Nothing is marked delivered.
    INVALID_ARGUMENT (the front-end's ILLEGAL_OFFSET) for an offset past the end."""
    if offset < 0:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"offset {offset} is negative",
                           field="offset")
    read = await ops.streams.read_messages(streams_pb2.ReadMessagesRequest(
        stream=stream, from_seq=offset, limit=min(max(batch, 1), limits.rocketmq_batch_max),
        max_wait_ms=wait_ms), via)
    end = read.last_seq + 1
    if not read.messages and offset > end:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"offset {offset} is past the queue's end "
                           f"offset {end}", field="offset")
    return read


async def committed_offset(ops: Operations, *, topic: str, group: str, partition: int,
                           via: Call) -> int:
    """The offset `group` consumes next in queue `partition`: its ack floor + 1.
    CONSUMER_NOT_FOUND when the group does not exist."""
    found = await ops.topics.offsets(topics_pb2.GetTopicOffsetsRequest(topic=topic,
                                                                       group=group), via)
    for queue in found.partitions:
        if queue.partition == partition:
            return queue.ack_floor + 1
    raise RaftlogError(Reason.PARTITION_OUT_OF_RANGE, f"topic {topic!r} has no queue "
                       f"{partition}", topic=topic, partition=partition)


async def commit_offset(ops: Operations, *, topic: str, group: str, partition: int,
                        offset: int, via: Call) -> None:
    """`group` consumes queue `partition` from `offset` on: every seq below it counts as
    acknowledged (the ack floor becomes offset - 1, Raft-committed), every seq at or above is
    delivered to the group's receives again. INVALID_ARGUMENT for a negative offset or one
    past the queue's end."""
    queue = await ends(ops, stream=await ops.topics.stream(topic, partition, via), via=via)
    if not 0 <= offset <= queue.end:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"offset {offset} is outside 0 to the "
                           f"queue's end offset {queue.end}", field="offset")
    await ops.topics.set_offsets(topics_pb2.SetTopicOffsetsRequest(
        topic=topic, group=group, offsets=[topics_pb2.PartitionFloor(
            partition=partition, ack_floor=max(offset - 1, 0))]), via)


@dataclass(frozen=True)
class RecallHandle:
    """What the recall handle of a delayed send names: the message's place in the schedule
    stream of its queue (docs/scheduled.md), `r<partition>.<schedule seq>`."""

    partition: int
    schedule_seq: int

    def handle(self) -> str:
        return f"r{self.partition}.{self.schedule_seq}"

    @classmethod
    def parse(cls, handle: str) -> RecallHandle:
        partition, dot, seq = handle.removeprefix("r").partition(".")
        if (not handle.startswith("r") or not dot or not all(
                part.isascii() and part.isdigit() for part in (partition, seq))
                or int(seq) == 0):
            raise RaftlogError(Reason.INVALID_ARGUMENT, f"recall handle {handle!r} is not one "
                               "this server issued", field="recall_handle")
        return cls(int(partition), int(seq))


async def recall(ops: Operations, *, topic: str, handle: RecallHandle, via: Call) -> str:
    """Cancels the scheduled message `handle` names in `topic` before it is due; answers its
    message id. MESSAGE_NOT_FOUND once it was delivered or cancelled (or was never there)."""
    stream = await ops.topics.stream(topic, handle.partition, via)  # or out of range
    cancelled = await ops.streams.scheduled().cancel(streams_pb2.CancelScheduledRequest(
        stream=stream, schedule_seq=handle.schedule_seq), via)
    return cancelled.message.msg_id
