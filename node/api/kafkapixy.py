"""Kafka-Pixy's `KafkaPixy` service (no proto package: the paths are `/KafkaPixy/Produce` and so
on) over the topic and consumer operations (docs/kafkapixy.md). A Kafka topic is a raftlog
topic, a partition its partition stream, offset = seq - 1, a group one durable consumer per
partition (node/ops/kafkapixy_groups.py).

Errors follow Kafka-Pixy's codes, not raftlog.v1's: the call's RaftlogError is translated by
`_kafka_errors` (an unknown topic is INVALID_ARGUMENT on Produce, ConsumeNAck and Ack and
NOT_FOUND on the admin calls; what Kafka-Pixy has no code for is INTERNAL, the raftlog reason
kept in the ErrorInfo metadata as `cause`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import grpc

from raftlog.base import limits, topics
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.compat import kafkapixy_pb2, kafkapixy_pb2_grpc
from raftlog.node.ops.kafkapixy_groups import Delivery, KafkaGroups, consumer_name, group_of
from raftlog.node.ops.operations import ClusterOperations, Operations
from raftlog.node.ops.partitions import KEY_HEADER, key_of
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.v1 import cluster_pb2, consumers_pb2, topics_pb2, types_pb2

log = logging.getLogger(__name__)
Context = grpc.aio.ServicerContext[Any, Any]
SERVICE_NAME = kafkapixy_pb2.DESCRIPTOR.services_by_name["KafkaPixy"].full_name
CLUSTER_NAMES = ("", "default")  # raftlog serves one cluster; "" is Kafka-Pixy's default
_KEPT = frozenset({"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "UNAVAILABLE",
                   "UNAUTHENTICATED", "PERMISSION_DENIED"})  # credentials: docs/auth.md


@contextlib.contextmanager
def _kafka_errors(*, admin: bool) -> Iterator[None]:
    """RaftlogErrors as Kafka-Pixy answers them. `admin`: the offsets and metadata calls,
    where an unknown topic or group is NOT_FOUND (on the data calls an unknown topic is
    INVALID_ARGUMENT, as sarama's ErrUnknownTopicOrPartition is there)."""
    try:
        yield
    except RaftlogError as err:
        status = err.status_name
        if status in _KEPT or err.reason is Reason.LONG_POLL_TIMEOUT:
            raise
        if status == "NOT_FOUND" and admin:
            raise
        if err.reason is Reason.TOPIC_NOT_FOUND or status == "OUT_OF_RANGE":
            raise RaftlogError(Reason.INVALID_ARGUMENT, err.message, cause=err.reason.name,
                               **err.metadata) from err
        raise RaftlogError(Reason.INTERNAL, err.message, cause=err.reason.name,
                           **err.metadata) from err


def _check_cluster(cluster: str) -> None:
    if cluster not in CLUSTER_NAMES:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"cluster {cluster!r} not found: this "
                           "raftlog cluster answers to \"\" and \"default\"", field="cluster")


def _headers_in(headers: Any) -> list[types_pb2.Header]:
    out = []
    for header in headers:
        if header.key.lower() == KEY_HEADER.lower():
            raise RaftlogError(Reason.INVALID_ARGUMENT, f"header {KEY_HEADER!r} is reserved: "
                               "it carries the message's key", field="headers")
        try:
            value = header.value.decode()
        except UnicodeDecodeError:
            raise RaftlogError(Reason.INVALID_ARGUMENT, f"header {header.key!r}: raftlog keeps "
                               "header values as UTF-8 text", field="headers") from None
        out.append(types_pb2.Header(key=header.key, value=value))
    return out


def _cons_rs(found: Delivery) -> kafkapixy_pb2.ConsRs:
    message = found.message
    key = key_of(message)
    return kafkapixy_pb2.ConsRs(
        partition=found.partition, offset=found.offset, key_value=key or b"",
        key_undefined=key is None, message=message.payload,
        headers=[kafkapixy_pb2.RecordHeader(key=header.key, value=header.value.encode())
                 for header in message.headers if header.key != KEY_HEADER])


def _partition_offset(part: topics_pb2.PartitionOffsets) -> kafkapixy_pb2.PartitionOffset:
    end = part.last_seq  # the offset the next message gets (offset = seq - 1)
    begin = min(max(part.first_seq, 1) - 1, end)
    return kafkapixy_pb2.PartitionOffset(
        partition=part.partition, begin=begin, end=end, count=end - begin,
        offset=part.ack_floor, lag=max(end - part.ack_floor, 0))


class KafkaPixyService(kafkapixy_pb2_grpc.KafkaPixyServicer):
    def __init__(self, ops: Operations, *, clock: Clock) -> None:
        self._ops = ops
        self._groups = KafkaGroups(ops.topics, ops.consumers, clock=clock)
        self._writes: set[asyncio.Task[None]] = set()  # async_mode produces in flight

    # ------------------------------------------------------------------ produce

    @rpc.unary
    async def Produce(self, request: kafkapixy_pb2.ProdRq, context: Context
                      ) -> kafkapixy_pb2.ProdRs:
        via = Call.from_grpc(context)
        with _kafka_errors(admin=False):
            _check_cluster(request.cluster)
            publish = topics_pb2.PublishToTopicRequest(
                topic=topics.validate_topic(request.topic), payload=request.message,
                headers=_headers_in(request.headers))
            if not request.key_undefined:
                publish.key = request.key_value  # an empty key is a key (sets the oneof)
            if not request.async_mode:
                ack = await self._ops.topics.publish(publish, via)
                return kafkapixy_pb2.ProdRs(partition=ack.partition, offset=ack.seq - 1)
            await self._ops.topics.partitions(request.topic, via)  # unknown topic: say so now
            self._write_later(publish, Call(hops=via.hops, metadata=via.metadata))
            return kafkapixy_pb2.ProdRs(partition=-1, offset=-1)

    def _write_later(self, publish: topics_pb2.PublishToTopicRequest, via: Call) -> None:
        """The async_mode write: not durable when the caller is answered (lost if this node
        dies first), and a failure is only logged."""
        if len(self._writes) >= limits.kafkapixy_async_writes_max:
            raise RaftlogError(Reason.OVERLOADED, f"{limits.kafkapixy_async_writes_max} "
                               "async_mode produces are in flight on this node",
                               limit=limits.kafkapixy_async_writes_max)

        async def write() -> None:
            try:
                await self._ops.topics.publish(publish, via)
            except RaftlogError as err:
                log.warning("async_mode produce to %s lost: %s", publish.topic, err)

        task = asyncio.get_running_loop().create_task(write())
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    # ------------------------------------------------------------------ consume

    @rpc.unary
    async def ConsumeNAck(self, request: kafkapixy_pb2.ConsNAckRq, context: Context
                          ) -> kafkapixy_pb2.ConsRs:
        via = Call.from_grpc(context)
        with _kafka_errors(admin=False):
            _check_cluster(request.cluster)
            topic, group = topics.validate_topic(request.topic), request.group
            consumer_name(group)
            if not request.no_ack and not request.auto_ack:
                await self._ack_quietly(topic, group, request.ack_partition,
                                        request.ack_offset, via)
            found = await self._groups.consume(topic, group, wait_ms=self._wait_ms(via),
                                               via=via)
            if found is None:
                raise RaftlogError(Reason.LONG_POLL_TIMEOUT, "long polling timeout",
                                   topic=topic, group=group)
            if request.auto_ack and not request.no_ack:
                await self._groups.ack(topic, group, partition=found.partition,
                                       offset=found.offset, via=via)
            return _cons_rs(found)

    async def _ack_quietly(self, topic: str, group: str, partition: int, offset: int,
                           via: Call) -> None:
        """The ack part of ConsumeNAck: a bad partition or offset is INVALID_ARGUMENT; any
        other failure is logged and the consume goes on (Kafka-Pixy never reports it; the
        message comes again after the group's ack timeout)."""
        if partition < 0 or offset < 0:
            raise RaftlogError(Reason.INVALID_ARGUMENT, "invalid ack: bad partition/offset",
                               partition=partition, offset=offset)
        try:
            await self._groups.ack(topic, group, partition=partition, offset=offset, via=via)
        except RaftlogError as err:
            if err.reason in (Reason.TOPIC_NOT_FOUND, Reason.PARTITION_OUT_OF_RANGE):
                raise
            log.info("ConsumeNAck's ack of %s/%d@%d for group %s dropped: %s", topic,
                     partition, offset, group, err)

    @staticmethod
    def _wait_ms(via: Call) -> int:
        """The long poll: limits.kafkapixy_long_poll_ms, ending before the caller's deadline."""
        remaining_s = via.remaining_s()
        if remaining_s is None:
            return limits.kafkapixy_long_poll_ms
        return max(0, min(limits.kafkapixy_long_poll_ms,
                          int(remaining_s * 1000) - limits.kafkapixy_deadline_margin_ms))

    @rpc.unary
    async def Ack(self, request: kafkapixy_pb2.AckRq, context: Context) -> kafkapixy_pb2.AckRs:
        with _kafka_errors(admin=False):
            _check_cluster(request.cluster)
            topic = topics.validate_topic(request.topic)
            await self._groups.ack(topic, request.group, partition=request.partition,
                                   offset=request.offset, via=Call.from_grpc(context))
            return kafkapixy_pb2.AckRs()

    # ------------------------------------------------------------------ offsets

    @rpc.unary
    async def GetOffsets(self, request: kafkapixy_pb2.GetOffsetsRq, context: Context
                         ) -> kafkapixy_pb2.GetOffsetsRs:
        with _kafka_errors(admin=True):
            _check_cluster(request.cluster)
            found = await self._ops.topics.offsets(topics_pb2.GetTopicOffsetsRequest(
                topic=topics.validate_topic(request.topic),
                group=consumer_name(request.group)), Call.from_grpc(context))
            return kafkapixy_pb2.GetOffsetsRs(
                offsets=[_partition_offset(part) for part in found.partitions])

    @rpc.unary
    async def SetOffsets(self, request: kafkapixy_pb2.SetOffsetsRq, context: Context
                         ) -> kafkapixy_pb2.SetOffsetsRs:
        """Each named partition's group reads `offset` next (everything below counts as
        acknowledged, everything from it on is delivered again), applied at once to the
        consumers being served, unlike the real Kafka-Pixy."""
        with _kafka_errors(admin=True):
            _check_cluster(request.cluster)
            for offset in request.offsets:
                if offset.partition < 0 or offset.offset < 0:
                    raise RaftlogError(Reason.INVALID_ARGUMENT, "bad partition/offset",
                                       partition=offset.partition, offset=offset.offset)
            await self._ops.topics.set_offsets(topics_pb2.SetTopicOffsetsRequest(
                topic=topics.validate_topic(request.topic), group=consumer_name(request.group),
                offsets=[topics_pb2.PartitionFloor(partition=offset.partition,
                                                   ack_floor=offset.offset)
                         for offset in request.offsets]), Call.from_grpc(context))
            return kafkapixy_pb2.SetOffsetsRs()

    # ------------------------------------------------------------------ metadata

    @rpc.unary
    async def ListTopics(self, request: kafkapixy_pb2.ListTopicRq, context: Context
                         ) -> kafkapixy_pb2.ListTopicRs:
        via = Call.from_grpc(context)
        with _kafka_errors(admin=True):
            _check_cluster(request.cluster)
            listed = await self._ops.topics.list(topics_pb2.ListTopicsRequest(), via)
            reply = kafkapixy_pb2.ListTopicRs()
            for info in listed.topics:
                reply.topics[info.name].CopyFrom(
                    await self._metadata(info, with_partitions=request.with_partitions,
                                         via=via))
            return reply

    @rpc.unary
    async def GetTopicMetadata(self, request: kafkapixy_pb2.GetTopicMetadataRq,
                               context: Context) -> kafkapixy_pb2.GetTopicMetadataRs:
        via = Call.from_grpc(context)
        with _kafka_errors(admin=True):
            _check_cluster(request.cluster)
            info = await self._ops.topics.info(
                topics_pb2.GetTopicRequest(name=topics.validate_topic(request.topic)), via)
            return await self._metadata(info, with_partitions=request.with_partitions,
                                        via=via)

    async def _metadata(self, info: topics_pb2.TopicInfo, *, with_partitions: bool,
                        via: Call) -> kafkapixy_pb2.GetTopicMetadataRs:
        replicas = max((part.info.config.replicas for part in info.partition_infos
                        if part.HasField("info")), default=0)
        reply = kafkapixy_pb2.GetTopicMetadataRs(version=0, config={
            "partitions": str(info.partitions), "replicas": str(replicas),
            "complete": str(info.complete).lower()})
        if not with_partitions:
            return reply
        numbers = self._node_numbers()
        for part in info.partition_infos:
            primary, holders = await self._placement(part.stream, via)
            ids = [numbers.get(node, -1) for node in holders]
            reply.partitions.add(partition=part.partition, leader=numbers.get(primary, -1),
                                 replicas=ids, isr=ids)
        return reply

    def _node_numbers(self) -> dict[str, int]:
        """Kafka broker ids are int32: node i of the sorted member ids is broker i."""
        if not isinstance(self._ops, ClusterOperations):
            return {"": 0}
        nodes = sorted(node.node_id for node in self._ops.views.status().nodes)
        return {node: index for index, node in enumerate(nodes)}

    async def _placement(self, stream: str, via: Call) -> tuple[str, list[str]]:
        """The stream's primary and every node holding it, the primary first ("" alone on a
        node without a cluster)."""
        if not isinstance(self._ops, ClusterOperations):
            return "", [""]
        route = await self._ops.views.explain_route(
            cluster_pb2.ExplainRouteRequest(stream=stream), via)
        others = [node for node in route.replicas if node != route.primary]
        return route.primary, [route.primary, *others] if route.primary else others

    @rpc.unary
    async def ListConsumers(self, request: kafkapixy_pb2.ListConsumersRq, context: Context
                            ) -> kafkapixy_pb2.ListConsumersRs:
        """Each group of the topic, its members being the nodes that serve its partitions
        (each partition's primary), with their partitions."""
        via = Call.from_grpc(context)
        with _kafka_errors(admin=True):
            _check_cluster(request.cluster)
            topic = topics.validate_topic(request.topic)
            only = consumer_name(request.group) if request.group else None
            count = await self._ops.topics.partitions(topic, via)
            gate = asyncio.Semaphore(limits.topic_fanout_max)

            async def served(partition: int) -> tuple[list[str], str]:
                """The partition's consumers (only the named one's, if any), its primary."""
                stream = topics.partition_stream(topic, partition)
                async with gate:
                    listed = await self._ops.consumers.list(
                        consumers_pb2.ListConsumersRequest(stream=stream), via)
                    primary, _ = await self._placement(stream, via)
                return [info.config.name for info in listed.consumers
                        if only is None or info.config.name == only], primary

            found = await asyncio.gather(*(served(partition) for partition in range(count)))
            reply = kafkapixy_pb2.ListConsumersRs()
            for partition, (names, primary) in enumerate(found):
                for name in names:
                    group = group_of(name)
                    if group is not None:
                        member = reply.groups[group].consumers[primary or "raftlog"]
                        member.partitions.append(partition)
            if request.group and request.group not in reply.groups:
                raise RaftlogError(Reason.CONSUMER_NOT_FOUND, f"topic {topic!r} has no group "
                                   f"{request.group!r}", consumer=request.group)
            return reply
