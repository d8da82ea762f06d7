"""The pull consumer's side of apache.rocketmq.v2 (docs/rocketmq.md): QueryOffset, PullMessage,
GetOffset and UpdateOffset, a mixin of RocketMQService (rocketmq_v2.py, which holds the RPC
entry points and turns errors into statuses). The offset rules are node/ops/rocketmq_offsets.py:
an offset is the partition's seq, a group's committed offset its raftlog ack floor + 1.

Also here, because both halves of the service use them and this module must not import
rocketmq_v2.py: `Refused`, a request refused with a v2 status, and the filter and long-poll
readings of a request.
"""

from __future__ import annotations

from typing import Any

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.compat import rocketmq_v2_definition_pb2 as rmq
from raftlog.compat import rocketmq_v2_service_pb2 as svc
from raftlog.node.ops import rocketmq, rocketmq_offsets, rocketmq_time
from raftlog.node.ops.operations import Operations
from raftlog.node.ops.partitions import TopicOps
from raftlog.node.ops.rocketmq import RocketGroups
from raftlog.node.ops.rocketmq_receive import header
from raftlog.node.transport.calls import Call
from raftlog.v1 import types_pb2


class Refused(Exception):
    """A request refused with a v2 status before (or instead of) an operation's answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.status = rmq.Status(code=code, message=message)  # type: ignore[arg-type]


def wanted_tags(expression: rmq.FilterExpression) -> frozenset[str] | None:
    """The tags a receive or pull asks for; None: every message."""
    if expression.type == rmq.SQL:
        raise Refused(rmq.ILLEGAL_FILTER_EXPRESSION, "SQL92 filters are not supported; use "
                      "a TAG filter (\"*\" or \"a || b\")")
    text = expression.expression.strip()
    if not text or text == "*":
        return None
    return frozenset(tag.strip() for tag in text.split("||") if tag.strip())


def poll_ms(timeout: Any, present: bool, via: Call) -> int:
    """How long a long poll may wait: the client's timeout (limits.rocketmq_long_poll_ms_max
    when it names none, and at most that), ending before the call's own deadline."""
    wait_ms = int(timeout.ToMilliseconds()) if present else limits.rocketmq_long_poll_ms_max
    wait_ms = min(max(wait_ms, 0), limits.rocketmq_long_poll_ms_max)
    remaining = via.remaining_s()
    if remaining is not None:
        wait_ms = max(min(wait_ms, int(remaining * 1000) - limits.rocketmq_poll_reserve_ms), 0)
    return wait_ms


class PullCalls:
    """QueryOffset, PullMessage, GetOffset, UpdateOffset. Each answers its response or raises
    Refused / RaftlogError, which RocketMQService's entry points turn into the status."""

    _ops: Operations
    _topics: TopicOps
    _groups: RocketGroups

    def _message(self, message: types_pb2.Message, topic: rmq.Resource, partition: int,
                 invisible_ms: int) -> rmq.Message:
        raise NotImplementedError  # RocketMQService's: a raftlog message as a v2 message

    async def _queue(self, queue: rmq.MessageQueue, via: Call) -> tuple[str, int, str]:
        """The raftlog topic, partition and stream of a message queue a client names."""
        topic = rocketmq.raftlog_topic(queue.topic.name)
        partition = rocketmq.queue_partition(queue.id, queue.broker.name)
        return topic, partition, await self._topics.stream(topic, partition, via)

    async def query_offset(self, request: svc.QueryOffsetRequest, via: Call
                           ) -> svc.QueryOffsetResponse:
        """BEGINNING: the queue's first stored offset; END: the offset its next send gets;
        TIMESTAMP: the first message stored at or after the time (END when none is)."""
        _, _, stream = await self._queue(request.message_queue, via)
        policy = request.query_offset_policy
        if policy == rmq.TIMESTAMP:
            if not request.HasField("timestamp"):
                raise Refused(rmq.BAD_REQUEST, "the TIMESTAMP policy needs a timestamp")
            offset = await rocketmq_offsets.offset_at(
                self._ops, stream=stream, at_ms=rocketmq_time.timestamp_ms(request.timestamp),
                via=via)
        elif policy in (rmq.BEGINNING, rmq.END):
            queue = await rocketmq_offsets.ends(self._ops, stream=stream, via=via)
            offset = queue.first if policy == rmq.BEGINNING else queue.end
        else:
            raise Refused(rmq.BAD_REQUEST, f"query_offset_policy {policy} is not one of "
                                           "BEGINNING, END, TIMESTAMP")
        return svc.QueryOffsetResponse(status=rmq.Status(code=rmq.OK, message="OK"),
                                       offset=offset)

    async def pull(self, request: svc.PullMessageRequest, via: Call
                   ) -> tuple[list[rmq.Message], int]:
        """The messages of the queue from `offset` on that pass the tag filter, and the offset
        to pull from next (past every message looked at, filtered out or not). Nothing is
        delivered to the group or acknowledged: the client commits with UpdateOffset.
        ILLEGAL_OFFSET for a negative offset or one past the queue's end."""
        rocketmq.group_name(request.group.name)
        wanted = wanted_tags(request.filter_expression)
        queue = request.message_queue
        _, partition, stream = await self._queue(queue, via)
        try:
            read = await rocketmq_offsets.pull(
                self._ops, stream=stream, offset=request.offset, batch=request.batch_size,
                wait_ms=poll_ms(request.long_polling_timeout,
                                request.HasField("long_polling_timeout"), via), via=via)
        except RaftlogError as err:
            if err.reason == Reason.INVALID_ARGUMENT and err.metadata.get("field") == "offset":
                raise Refused(rmq.ILLEGAL_OFFSET, err.message) from None
            raise
        kept = [m for m in read.messages
                if wanted is None or header(m, rocketmq.TAG_HEADER) in wanted]
        return [self._pulled(m, queue.topic, partition) for m in kept], read.next_seq

    def _pulled(self, message: types_pb2.Message, topic: rmq.Resource, partition: int
                ) -> rmq.Message:
        """A pulled message: as a receive gives it, less what only a delivery has."""
        out = self._message(message, topic, partition, 0)
        for field in ("receipt_handle", "invisible_duration", "delivery_attempt"):
            out.system_properties.ClearField(field)  # type: ignore[arg-type]
        return out

    async def get_offset(self, request: svc.GetOffsetRequest, via: Call
                         ) -> svc.GetOffsetResponse:
        """The offset the group consumes next in the queue (its raftlog ack floor + 1);
        OFFSET_NOT_FOUND when the topic has no such group."""
        group = rocketmq.group_name(request.group.name)
        topic, partition, _ = await self._queue(request.message_queue, via)
        try:
            offset = await rocketmq_offsets.committed_offset(
                self._ops, topic=topic, group=group, partition=partition, via=via)
        except RaftlogError as err:
            if err.reason == Reason.CONSUMER_NOT_FOUND:
                raise Refused(rmq.OFFSET_NOT_FOUND, err.message) from None
            raise
        return svc.GetOffsetResponse(status=rmq.Status(code=rmq.OK, message="OK"),
                                     offset=offset)

    async def update_offset(self, request: svc.UpdateOffsetRequest, via: Call
                            ) -> svc.UpdateOffsetResponse:
        """The group consumes the queue from `offset` on: its raftlog ack floor becomes
        offset - 1, Raft-committed (the group is made on first use, as a receive makes it);
        ILLEGAL_OFFSET for a negative offset or one past the queue's end."""
        group = rocketmq.group_name(request.group.name)
        topic, partition, _ = await self._queue(request.message_queue, via)
        await self._groups.ensure(topic, group, limits.rocketmq_invisible_ms_default, via)
        try:
            await rocketmq_offsets.commit_offset(self._ops, topic=topic, group=group,
                                                 partition=partition, offset=request.offset,
                                                 via=via)
        except RaftlogError as err:
            if err.reason == Reason.INVALID_ARGUMENT and err.metadata.get("field") == "offset":
                raise Refused(rmq.ILLEGAL_OFFSET, err.message) from None
            raise
        return svc.UpdateOffsetResponse(status=rmq.Status(code=rmq.OK, message="OK"))
