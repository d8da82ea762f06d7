"""Queues over a work-queue stream and its one consumer `pop` (collection_layout.py).

- Push publishes the value at `q`; its seq is its sequence. A bounded queue checks max_messages
  and max_bytes against the stream's state and expects the stream's last seq, so the check is
  exact when pushes race.
- Pop fetches one message from `pop` and acks it; the value is the caller's only if that ack
  changed its state (`AckResponse.applied` = 1). Two pops that were handed the same message
  (possible only once its ack wait ran out) both ack it, and only one of them counts: the
  other fetches again. Acks are committed through Raft before they are answered, so this holds
  across failover too. A work-queue stream removes the message on the ack.
- A pop that dies between the fetch and the ack (its node killed) leaves the message pending:
  it is handed out again after limits.queue_pop_ack_wait_ms (at-least-once, never lost). An
  ack that was committed but whose answer was lost (the primary died answering) leaves the
  value popped without anyone having it: the caller sees an UNAVAILABLE error.
- Count is the consumer's pending plus its handed-out-not-acked messages: what is still to be
  popped for good. Peek reads the stored messages from above the consumer's ack floor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import collection_layout as layout
from raftlog.node.ops.collection_base import CollectionBase, full, on, retrying
from raftlog.node.ops.collection_layout import QUEUE, Target
from raftlog.node.transport.calls import Call
from raftlog.v1 import collections_pb2 as pb
from raftlog.v1 import consumers_pb2, streams_pb2

T = TypeVar("T")


class QueueOps(CollectionBase):
    async def push(self, request: pb.PushQueueRequest, via: Call) -> pb.PushQueueResponse:
        collection = layout.target(QUEUE, request.collection)
        settings, _ = await self._stream_info(collection, via)
        publish = streams_pb2.PublishRequest(subject=layout.QUEUE_SUBJECT, payload=request.value)
        if not settings.bounded:
            ack = await self._publish(collection, publish, via)
            return pb.PushQueueResponse(sequence=ack.seq)

        async def bounded() -> pb.PushQueueResponse:
            _, stream = await self._stream_info(collection, via)
            state = stream.state
            if settings.max_messages and state.messages + 1 > settings.max_messages:
                raise full(collection, "values", limit=settings.max_messages,
                           would_be=state.messages + 1)
            would_be = state.bytes + layout.stored_bytes(layout.QUEUE_SUBJECT, request.value)
            if settings.max_bytes and would_be > settings.max_bytes:
                raise full(collection, "bytes", limit=settings.max_bytes, would_be=would_be)
            publish.expected_last_seq = state.last_seq
            ack = await self._publish(collection, publish, via)
            return pb.PushQueueResponse(sequence=ack.seq)

        return await retrying(bounded, what="PushQueue")

    async def pop(self, request: pb.PopQueueRequest, via: Call) -> pb.QueueItem:
        collection = layout.target(QUEUE, request.collection)
        if request.max_wait_ms > limits.fetch_wait_ms_max:
            raise RaftlogError(Reason.INVALID_ARGUMENT,
                               f"max_wait_ms may be at most {limits.fetch_wait_ms_max}",
                               field="max_wait_ms", limit=limits.fetch_wait_ms_max)
        for _ in range(limits.queue_pop_attempts_max):
            fetched = await self._on_pop(collection, via, lambda: self._consumers.fetch(
                consumers_pb2.FetchRequest(stream=collection.stream,
                                           consumer=layout.POP_CONSUMER, batch=1,
                                           max_wait_ms=request.max_wait_ms), via))
            if not fetched.messages:
                raise RaftlogError(Reason.QUEUE_EMPTY,
                                   f"queue {collection.name!r} has no value to pop",
                                   collection=collection.name)
            (message,) = fetched.messages
            if await self._settle(collection, message.seq, via):
                return pb.QueueItem(sequence=message.seq, value=message.payload)
        raise RaftlogError(Reason.COLLECTION_CONFLICT,
                           f"every value this pop was handed was settled by another pop first "
                           f"({limits.queue_pop_attempts_max} times); retry",
                           attempts=limits.queue_pop_attempts_max)

    async def _settle(self, collection: Target, seq: int, via: Call) -> bool:
        """Acks `seq`: True when this ack is the one that settled it."""
        answer = await self._on_pop(collection, via, lambda: self._consumers.ack(
            consumers_pb2.AckRequest(stream=collection.stream, consumer=layout.POP_CONSUMER,
                                     seqs=[seq]), via))
        (result,) = answer.results
        if result.HasField("error"):
            if result.error.reason == Reason.NOT_DELIVERED.name:
                return False  # no longer awaiting an ack: settled by another pop
            reason = Reason.__members__.get(result.error.reason, Reason.INTERNAL)
            raise RaftlogError(reason, result.error.message, **dict(result.error.metadata))
        return answer.applied == 1

    async def peek(self, request: pb.PeekQueueRequest, via: Call) -> pb.PeekQueueResponse:
        collection = layout.target(QUEUE, request.collection)
        if request.limit > limits.queue_peek_limit_max:
            raise RaftlogError(Reason.INVALID_ARGUMENT,
                               f"limit may be at most {limits.queue_peek_limit_max}",
                               field="limit", limit=limits.queue_peek_limit_max)
        state = await self._pop_state(collection, via)
        reply = await on(collection, self._streams.scan_subject(
            streams_pb2.ScanExactAtSubjectRequest(
                stream=collection.stream, subject=layout.QUEUE_SUBJECT,
                from_seq=max(request.from_sequence, state.ack_floor + 1),
                limit=request.limit or limits.queue_peek_limit_default), via))
        return pb.PeekQueueResponse(
            items=[pb.QueueItem(sequence=m.seq, value=m.payload) for m in reply.messages],
            next_sequence=reply.next_seq)

    async def count(self, request: pb.CountQueueRequest, via: Call) -> pb.CollectionCount:
        collection = layout.target(QUEUE, request.collection)
        state = await self._pop_state(collection, via)
        return pb.CollectionCount(count=state.num_pending + state.num_ack_pending)

    async def _pop_state(self, collection: Target, via: Call) -> consumers_pb2.ConsumerState:
        info = await self._on_pop(collection, via, lambda: self._consumers.info(
            consumers_pb2.GetConsumerInfoRequest(stream=collection.stream,
                                                 consumer=layout.POP_CONSUMER), via))
        return info.state

    async def _on_pop(self, collection: Target, via: Call, call: Callable[[], Awaitable[T]]
                      ) -> T:
        """`call()` on the pop consumer. A queue whose consumer is missing (its creation was
        cut short after the stream was made) gets it now, and `call()` is made again."""
        try:
            return await on(collection, call())
        except RaftlogError as err:
            if err.reason is not Reason.CONSUMER_NOT_FOUND:
                raise
        await self._stream_info(collection, via)  # a queue's stream, not one made by hand
        await self._create_pop_consumer(collection, via)
        return await on(collection, call())

    async def _create_pop_consumer(self, collection: Target, via: Call) -> None:
        """Creates the queue's pop consumer; one that exists with this config is kept."""
        await on(collection, self._consumers.create(consumers_pb2.CreateConsumerRequest(
            stream=collection.stream, config=layout.pop_consumer()), via))
