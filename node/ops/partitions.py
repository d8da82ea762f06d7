"""Topics: N partition streams under one name (docs/partitions.md), for raftlog.v1's Topics
service and for the front-ends whose protocols have partitions (Kafka-Pixy topics, RocketMQ
queues, Numaflow partitions). Built on the stream and consumer operations only, so forwarding,
failover and the Raft-first metadata hold for each partition unchanged.

The topic is not a record of its own: each partition stream's Raft-held config carries
`partition {topic, index, count}` (base/topics.py names the stream). A topic exists while any
of its partition streams does, and is complete when all `count` do; a create cut short leaves
it incomplete, which every call that needs the whole topic refuses (TOPIC_INCOMPLETE) until a
create with the same count and config fills the gap. The count never changes.

Front-ends call:
- `partition_for_key(key, partitions)`          sarama's hash partitioner (None: random)
- `partition_for(key=, msg_id=, partitions=)`   where a publish without a named partition
  goes: by its key, else by its msg_id (the same hash), else random
- `TopicOps.create / delete / info / list`      canonical Topics requests
- `TopicOps.partitions(topic, via) -> int`      the count, cached for limits.topic_cache_ms
- `TopicOps.publish(request, via)`              -> PublishToTopicResponse (partition, seq)
- `TopicOps.stream(topic, partition, via) -> str`   the partition's stream, range-checked,
  for ConsumerOps.fetch / ack / nak / subscribe and StreamOps.read_messages
- `TopicOps.create_group / delete_group / offsets / set_offsets`   one consumer per partition
- `key_of(message) -> bytes | None`             the key a message was published with
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from raftlog.base import limits, subjects, topics
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import canonical, route
from raftlog.node.ops.batches import expand_results
from raftlog.node.ops.consumer_state import ConsumerStateOps
from raftlog.node.ops.consumers import ConsumerOps
from raftlog.node.ops.route import Route
from raftlog.node.ops.streams import StreamOps
from raftlog.node.transport.calls import Call
from raftlog.v1 import cluster_pb2, consumers_pb2, streams_pb2, topics_pb2, types_pb2

T = TypeVar("T")

KEY_HEADER = "Raftlog-Key"  # the message's key, base64 (absent: published without a key)


def partition_for_key(key: bytes | None, partitions: int, *,
                      choose: Callable[[int], int] | None = None) -> int:
    """The partition of `key` among `partitions`, as sarama's HashPartitioner picks it: a nil
    key gets a random partition (`choose(n)`, default random), any other key (empty included)
    int32(FNV-1a-32(key)) % n made non-negative."""
    topics.validate_partitions(partitions)
    if key is None:
        return (choose or random.randrange)(partitions)
    return topics.hash_partition(key, partitions)


def partition_for(*, key: bytes | None, msg_id: str, partitions: int,
                  choose: Callable[[int], int] | None = None) -> int:
    """The partition of a publish that names none, for every front-end: its key's
    (`partition_for_key`) when it has a key; else, with a msg_id, the same sarama hash over
    the id's UTF-8 bytes, so a retry of the send lands on the partition of the first one
    whichever node takes it, and that partition's dedupe window stores it once; random
    (`choose(n)`) only with neither. The cost: such a send goes to its partition's primary,
    forwarded when that is another node."""
    if key is None and msg_id:
        return topics.hash_partition(msg_id.encode(), topics.validate_partitions(partitions))
    return partition_for_key(key, partitions, choose=choose)


def key_of(message: types_pb2.Message) -> bytes | None:
    """The key `message` was published to its topic with; None when it had none."""
    for header in message.headers:
        if header.key == KEY_HEADER:
            return base64.b64decode(header.value)
    return None


def _answer(partition: int, ack: streams_pb2.PublishAck) -> topics_pb2.PublishToTopicResponse:
    return topics_pb2.PublishToTopicResponse(
        partition=partition, stream=ack.stream, seq=ack.seq, duplicate=ack.duplicate,
        epoch=ack.epoch, primary=ack.primary, scheduled=ack.scheduled,
        deliver_at_ms=ack.deliver_at_ms)


def _not_found(topic: str) -> RaftlogError:
    return RaftlogError(Reason.TOPIC_NOT_FOUND, f"no topic named {topic!r}", topic=topic)


def _default_subject(topic: str) -> str:
    try:
        return subjects.validate_subject(topic)
    except RaftlogError:
        return topics.partition_stream(topic, 0)


async def _each(calls: Sequence[Awaitable[T]]) -> list[T]:
    """Every call at once, at most limits.topic_fanout_max in flight."""
    gate = asyncio.Semaphore(limits.topic_fanout_max)

    async def one(call: Awaitable[T]) -> T:
        async with gate:
            return await call

    return list(await asyncio.gather(*(one(call) for call in calls)))


class TopicOps:
    def __init__(self, streams: StreamOps, consumers: ConsumerOps, *, where: Route,
                 consumer_state: ConsumerStateOps | None, clock: Clock) -> None:
        self._streams = streams
        self._consumers = consumers
        self._where = where
        self._consumer_state = consumer_state
        self._clock = clock
        self._counts: dict[str, tuple[int, float]] = {}  # topic -> (count, read at, s)

    # ------------------------------------------------------------------ metadata

    async def create(self, request: topics_pb2.CreateTopicRequest, via: Call
                     ) -> topics_pb2.TopicInfo:
        topic = topics.validate_topic(request.name)
        count = topics.validate_partitions(request.partitions)
        if request.config.name or request.config.HasField("partition"):
            raise RaftlogError(Reason.INVALID_CONFIG, "a topic's config leaves name and "
                               "partition empty: the server sets them per partition")
        existing = await self._partition_infos(topic, via)
        for info in existing.values():
            if info.config.partition.count != count:
                raise RaftlogError(Reason.TOPIC_EXISTS, f"topic {topic!r} exists with "
                                   f"{info.config.partition.count} partitions; a topic's "
                                   "partition count never changes", topic=topic,
                                   partitions=info.config.partition.count)

        async def make(index: int) -> None:
            config = types_pb2.StreamConfig()
            config.CopyFrom(request.config)
            config.name = topics.partition_stream(topic, index)
            config.partition.topic, config.partition.index = topic, index
            config.partition.count = count
            try:
                await self._streams.create(streams_pb2.CreateStreamRequest(config=config), via)
            except RaftlogError as err:
                if err.reason == Reason.STREAM_EXISTS:
                    raise RaftlogError(Reason.TOPIC_EXISTS, f"topic {topic!r} exists with "
                                       "another config", topic=topic) from None
                raise

        await _each([make(index) for index in range(count)])
        self._counts.pop(topic, None)
        return await self.info(topics_pb2.GetTopicRequest(name=topic), via)

    async def delete(self, request: topics_pb2.DeleteTopicRequest, via: Call
                     ) -> topics_pb2.DeleteTopicResponse:
        topic = topics.validate_topic(request.name)
        info = await self.info(topics_pb2.GetTopicRequest(name=topic), via)
        self._counts.pop(topic, None)

        async def remove(stream: str) -> int:
            try:
                await self._streams.delete(streams_pb2.DeleteStreamRequest(name=stream), via)
            except RaftlogError as err:
                if err.reason == Reason.STREAM_NOT_FOUND:
                    return 0  # removed meanwhile
                raise
            return 1

        removed = await _each([remove(part.stream) for part in info.partition_infos
                               if part.HasField("info")])
        return topics_pb2.DeleteTopicResponse(deleted=sum(removed))

    async def info(self, request: topics_pb2.GetTopicRequest, via: Call
                   ) -> topics_pb2.TopicInfo:
        """Each partition as its primary has it now (a list may hold a replica's view, and
        this node's metadata may not have seen a topic created through another node yet)."""
        topic = topics.validate_topic(request.name)
        found = await self._partition_infos(topic, via)
        if found:
            count = max(info.config.partition.count for info in found.values())
        else:
            count = (await self._partition_zero(topic, via)).config.partition.count

        async def served(index: int) -> types_pb2.StreamInfo | None:
            try:
                return await self._streams.info(streams_pb2.GetStreamInfoRequest(
                    name=topics.partition_stream(topic, index)), via)
            except RaftlogError as err:
                if err.reason == Reason.STREAM_NOT_FOUND:
                    return None
                if err.status_name == "UNAVAILABLE" and index in found:
                    return found[index]  # a primary between owners: what the list saw
                raise

        current = await _each([served(index) for index in range(count)])
        return _topic_info(topic, count, {index: info for index, info in enumerate(current)
                                          if info is not None})

    async def _partition_zero(self, topic: str, via: Call) -> types_pb2.StreamInfo:
        """Partition 0's stream from its primary; TOPIC_NOT_FOUND or TOPIC_INCOMPLETE when
        it is missing."""
        try:
            return await self._streams.info(
                streams_pb2.GetStreamInfoRequest(name=topics.partition_stream(topic, 0)), via)
        except RaftlogError as err:
            if err.reason != Reason.STREAM_NOT_FOUND:
                raise
            if await self._partition_infos(topic, via):
                raise RaftlogError(Reason.TOPIC_INCOMPLETE, f"partition 0 of topic {topic!r} "
                                   "is missing (its create was cut short?)", topic=topic,
                                   partition=0) from None
            raise _not_found(topic) from None

    async def list(self, request: topics_pb2.ListTopicsRequest, via: Call
                   ) -> topics_pb2.ListTopicsResponse:
        listed = await self._streams.list(
            streams_pb2.ListStreamsRequest(prefix=topics.PARTITION_PREFIX), via)
        by_topic: dict[str, dict[int, types_pb2.StreamInfo]] = {}
        for info in listed.streams:
            if info.config.HasField("partition"):
                part = info.config.partition
                by_topic.setdefault(part.topic, {})[part.index] = info
        return topics_pb2.ListTopicsResponse(
            topics=[_topic_info(topic, max(i.config.partition.count for i in found.values()),
                                found) for topic, found in sorted(by_topic.items())])

    async def _partition_infos(self, topic: str, via: Call) -> dict[int, types_pb2.StreamInfo]:
        """The partition streams of `topic` the cluster knows, by index."""
        prefix = topics.partition_stream(topic, 0)[:-1]  # "TOPIC_<escaped>_p"
        listed = await self._streams.list(streams_pb2.ListStreamsRequest(prefix=prefix), via)
        return {info.config.partition.index: info for info in listed.streams
                if info.config.partition.topic == topic}

    # ------------------------------------------------------------------ routing

    async def partitions(self, topic: str, via: Call) -> int:
        """The topic's partition count: from partition 0's config, remembered for
        limits.topic_cache_ms. TOPIC_NOT_FOUND when it has no partition 0."""
        topics.validate_topic(topic)
        now_s = self._clock.monotonic_s()
        cached = self._counts.get(topic)
        if cached is not None and now_s - cached[1] < limits.topic_cache_ms / 1000:
            return cached[0]
        count = (await self._partition_zero(topic, via)).config.partition.count
        if len(self._counts) >= limits.topics_cached_max:
            self._counts.clear()
        self._counts[topic] = (count, now_s)
        return count

    async def stream(self, topic: str, partition: int, via: Call) -> str:
        """The stream of `partition` of `topic`; PARTITION_OUT_OF_RANGE past its count."""
        count = await self.partitions(topic, via)
        if not 0 <= partition < count:
            raise RaftlogError(Reason.PARTITION_OUT_OF_RANGE, f"topic {topic!r} has partitions "
                               f"0 to {count - 1}, not {partition}", topic=topic,
                               partitions=count)
        return topics.partition_stream(topic, partition)

    async def _on_partition(self, topic: str, partition: int, call: Callable[[str], Awaitable[T]]
                            ) -> T:
        """`call(stream)`, its missing stream answered as the topic's gap."""
        stream = topics.partition_stream(topic, partition)
        try:
            return await call(stream)
        except RaftlogError as err:
            if err.reason != Reason.STREAM_NOT_FOUND:
                raise
            self._counts.pop(topic, None)
            raise RaftlogError(Reason.TOPIC_INCOMPLETE, f"partition {partition} of topic "
                               f"{topic!r} is missing (deleted, or its create was cut short)",
                               topic=topic, partition=partition) from None

    # ------------------------------------------------------------------ publish

    async def publish(self, request: topics_pb2.PublishToTopicRequest, via: Call
                      ) -> topics_pb2.PublishToTopicResponse:
        partition, entry = await self._entry(request, via)

        async def publish(stream: str) -> streams_pb2.PublishAck:
            return await self._streams.publish(streams_pb2.PublishRequest(
                stream=stream, subject=entry.subject, payload=entry.payload,
                headers=entry.headers, msg_id=entry.msg_id,
                deliver_at_ms=request.deliver_at_ms), via)

        ack = await self._on_partition(request.topic, partition, publish)
        return _answer(partition, ack)

    async def _entry(self, request: topics_pb2.PublishToTopicRequest, via: Call
                     ) -> tuple[int, streams_pb2.PublishEntry]:
        """The partition a publish goes to and the entry stored there."""
        count = await self.partitions(request.topic, via)
        target = request.WhichOneof("target")
        if target == "partition":
            partition = request.partition
            await self.stream(request.topic, partition, via)
        else:
            partition = partition_for(key=request.key if target == "key" else None,
                                      msg_id=request.msg_id, partitions=count)
        headers = list(request.headers)
        if target == "key":
            headers.append(types_pb2.Header(key=KEY_HEADER,
                                            value=base64.b64encode(request.key).decode()))
        return partition, streams_pb2.PublishEntry(
            subject=request.subject or _default_subject(request.topic), payload=request.payload,
            headers=headers, msg_id=request.msg_id)

    async def publish_many(self, requests: Sequence[topics_pb2.PublishToTopicRequest],
                           via: Call
                           ) -> Sequence[topics_pb2.PublishToTopicResponse | RaftlogError]:
        """Several publishes, each answered as `publish` answers it (or with its error):
        those for one partition go as one PublishBatch in their order (one group commit),
        the partitions' batches at once; a scheduled one (deliver_at_ms) on its own."""
        out: builtins.list[topics_pb2.PublishToTopicResponse | RaftlogError | None] = [None] * len(
            requests)
        batches: dict[tuple[str, int], builtins.list[tuple[int, streams_pb2.PublishEntry]]] = {}
        singles: builtins.list[int] = []
        for index, request in enumerate(requests):
            if request.deliver_at_ms:
                singles.append(index)
                continue
            try:
                partition, entry = await self._entry(request, via)
            except RaftlogError as err:
                out[index] = err
                continue
            batches.setdefault((request.topic, partition), []).append((index, entry))

        async def single(index: int) -> None:
            try:
                out[index] = await self.publish(requests[index], via)
            except RaftlogError as err:
                out[index] = err

        async def batch(topic: str, partition: int,
                        items: builtins.list[tuple[int, streams_pb2.PublishEntry]]) -> None:
            async def publish(stream: str) -> streams_pb2.PublishBatchResponse:
                return await self._streams.publish_batch(streams_pb2.PublishBatchRequest(
                    stream=stream, entries=[entry for _, entry in items]), via)
            try:
                reply = await self._on_partition(topic, partition, publish)
            except RaftlogError as err:
                for index, _ in items:
                    out[index] = err
                return
            for (index, _), result in zip(items, expand_results(reply), strict=True):
                if result.HasField("ack"):
                    out[index] = _answer(partition, result.ack)
                else:
                    reason = Reason.__members__.get(result.error.reason, Reason.INTERNAL)
                    out[index] = RaftlogError(reason, result.error.message,
                                              **dict(result.error.metadata))

        await _each([*(single(index) for index in singles),
                     *(batch(topic, partition, items)
                       for (topic, partition), items in batches.items())])
        return [answer if answer is not None else RaftlogError(
            Reason.INTERNAL, "a publish of the batch was not answered") for answer in out]

    # ------------------------------------------------------------------ groups

    async def _every_partition(self, topic: str, via: Call,
                               call: Callable[[str], Awaitable[T]]) -> Sequence[T]:
        count = await self.partitions(topic, via)
        return await _each([self._on_partition(topic, index, call) for index in range(count)])

    async def create_group(self, request: topics_pb2.CreateTopicGroupRequest, via: Call
                           ) -> topics_pb2.TopicGroupInfo:
        subjects.validate_name(request.config.name, what="consumer")

        async def create(stream: str) -> consumers_pb2.ConsumerInfo:
            return await self._consumers.create(consumers_pb2.CreateConsumerRequest(
                stream=stream, config=request.config), via)

        made = await self._every_partition(request.topic, via, create)
        return topics_pb2.TopicGroupInfo(topic=request.topic, group=request.config.name,
                                         consumers=made)

    async def delete_group(self, request: topics_pb2.DeleteTopicGroupRequest, via: Call
                           ) -> topics_pb2.DeleteTopicGroupResponse:
        subjects.validate_name(request.group, what="consumer")

        async def delete(stream: str) -> bool:
            try:
                await self._consumers.delete(consumers_pb2.DeleteConsumerRequest(
                    stream=stream, consumer=request.group), via)
            except RaftlogError as err:
                if err.reason == Reason.CONSUMER_NOT_FOUND:
                    return False
                raise
            return True

        if not any(await self._every_partition(request.topic, via, delete)):
            raise RaftlogError(Reason.CONSUMER_NOT_FOUND, f"topic {request.topic!r} has no "
                               f"group {request.group!r}", consumer=request.group)
        return topics_pb2.DeleteTopicGroupResponse()

    async def offsets(self, request: topics_pb2.GetTopicOffsetsRequest, via: Call
                      ) -> topics_pb2.TopicOffsets:
        subjects.validate_name(request.group, what="consumer")
        count = await self.partitions(request.topic, via)
        return await self._offsets(request.topic, request.group, range(count), via)

    async def _offsets(self, topic: str, group: str, partitions: Sequence[int], via: Call
                       ) -> topics_pb2.TopicOffsets:
        async def one(partition: int) -> topics_pb2.PartitionOffsets:
            async def read(stream: str) -> topics_pb2.PartitionOffsets:
                stream_info, consumer = await asyncio.gather(
                    self._streams.info(streams_pb2.GetStreamInfoRequest(name=stream), via),
                    self._consumers.info(consumers_pb2.GetConsumerInfoRequest(
                        stream=stream, consumer=group), via))
                state = consumer.state
                return topics_pb2.PartitionOffsets(
                    partition=partition, first_seq=stream_info.state.first_seq,
                    last_seq=stream_info.state.last_seq, ack_floor=state.ack_floor,
                    delivered_seq=state.delivered_seq, num_pending=state.num_pending,
                    num_ack_pending=state.num_ack_pending)

            return await self._on_partition(topic, partition, read)

        found = await _each([one(partition) for partition in partitions])
        return topics_pb2.TopicOffsets(topic=topic, group=group, partitions=found)

    async def set_offsets(self, request: topics_pb2.SetTopicOffsetsRequest, via: Call
                          ) -> topics_pb2.TopicOffsets:
        """Each named partition's group restarts after `ack_floor`: every seq at or below is
        acknowledged, every seq above is delivered again (a consumer that is being served
        picks the change up at once). Each partition's change is made by its primary (the
        request, cut down to that partition, is forwarded there) and committed through Raft
        (ops/consumer_state.py)."""
        subjects.validate_name(request.group, what="consumer")
        if self._consumer_state is None:
            raise RaftlogError(Reason.INVALID_ARGUMENT, "setting a group's offsets needs a "
                               "cluster member (a node on its own keeps no committed state)")
        if not request.offsets:
            raise RaftlogError(Reason.INVALID_ARGUMENT, "offsets is empty", field="offsets")
        indexes = [offset.partition for offset in request.offsets]
        if len(set(indexes)) != len(indexes):
            raise RaftlogError(Reason.INVALID_ARGUMENT, "a partition is named twice",
                               field="offsets")
        for index in indexes:
            await self.stream(request.topic, index, via)
        state_ops = self._consumer_state

        async def one(offset: topics_pb2.PartitionFloor) -> None:
            async def set_floor(stream: str) -> None:
                async def here() -> topics_pb2.TopicOffsets:
                    await state_ops.set_state(cluster_pb2.SetConsumerStateRequest(
                        stream=stream, consumer=request.group, ack_floor=offset.ack_floor,
                        delivered_seq=offset.ack_floor), via)
                    return topics_pb2.TopicOffsets()

                single = topics_pb2.SetTopicOffsetsRequest(topic=request.topic,
                                                           group=request.group, offsets=[offset])
                await route.unary(self._where, self._where.primary(stream),
                                  canonical.SET_TOPIC_OFFSETS, single, via, here)

            await self._on_partition(request.topic, offset.partition, set_floor)

        await _each([one(offset) for offset in request.offsets])
        if len(request.offsets) == 1 and via.hops:
            # One partition's part, forwarded here: the node that split the request reads
            # the offsets back.
            return topics_pb2.TopicOffsets(topic=request.topic, group=request.group)
        return await self._offsets(request.topic, request.group, sorted(indexes), via)


def _topic_info(topic: str, count: int, found: dict[int, types_pb2.StreamInfo]
                ) -> topics_pb2.TopicInfo:
    info = topics_pb2.TopicInfo(name=topic, partitions=count, complete=len(found) == count)
    for index in range(count):
        entry = info.partition_infos.add(partition=index,
                                         stream=topics.partition_stream(topic, index))
        if index in found:
            entry.info.CopyFrom(found[index])
    return info
