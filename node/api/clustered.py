"""The gRPC services of a clustered node: metadata changes go through Raft first, list calls
span the cluster, and the admin Cluster service.

Per-stream calls reach these methods only on the stream's primary (forwarding.py routes them);
`StreamsService` / `ConsumersService` do the local work after the metadata is committed. A
STREAM_NOT_FOUND or CONSUMER_NOT_FOUND of a per-stream call is confirmed against the metadata
group before a client sees it (existence.py): a node that lags never denies what exists.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from raftlog.base import subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.node.api.batches import expand_results
from raftlog.node.api.consumers import ConsumersService
from raftlog.node.api.streams import StreamsService
from raftlog.node.cluster.coordinator import ClusterNode
from raftlog.node.cluster.existence import ExistenceCheck, confirming, confirming_stream
from raftlog.node.consumers.config import validate_config as validate_consumer_config
from raftlog.node.consumers.manager import ConsumerManager
from raftlog.node.engine.stream_config import apply_update, validate_config
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.transport import rpc
from raftlog.node.transport.forwarding import ChannelPool, outgoing_metadata, remaining_s
from raftlog.v1 import consumers_pb2, streams_pb2, streams_pb2_grpc, types_pb2

log = logging.getLogger(__name__)

LOCAL_HEADER = "raftlog-local"  # on a fan-out call: answer for this node only
fanout_timeout_s = 5.0

Context = grpc.aio.ServicerContext[Any, Any]


def is_local_only(context: Context) -> bool:
    return any(key == LOCAL_HEADER for key, _ in context.invocation_metadata() or ())


async def list_node(pool: ChannelPool, address: str, *, timeout_s: float
                    ) -> list[types_pb2.StreamInfo] | None:
    """Streams whose primary is the node at `address`; None when it does not answer."""
    stub = streams_pb2_grpc.StreamsStub(pool.get(address))  # type: ignore[no-untyped-call]
    try:
        reply = await stub.ListStreams(streams_pb2.ListStreamsRequest(),
                                       metadata=((LOCAL_HEADER, "1"),), timeout=timeout_s)
    except grpc.aio.AioRpcError as err:
        log.info("listing streams on %s failed: %s", address, err.code())
        return None
    return list(reply.streams)


class ClusterStreamsService(StreamsService):
    def __init__(self, engine: StreamEngine, cluster: ClusterNode, pool: ChannelPool) -> None:
        super().__init__(engine)
        self._cluster = cluster
        self._pool = pool
        self.existence = ExistenceCheck(cluster)

    # Per-stream calls served here: a NOT_FOUND is confirmed first (existence.py).
    GetStreamInfo = confirming(StreamsService.GetStreamInfo)
    PurgeStream = confirming(StreamsService.PurgeStream)
    GetMessage = confirming(StreamsService.GetMessage)
    ReadLatestAtSubject = confirming(StreamsService.ReadLatestAtSubject)
    ListSubjectsByPrefix = confirming(StreamsService.ListSubjectsByPrefix)
    ScanExactAtSubject = confirming(StreamsService.ScanExactAtSubject)
    Publish = confirming(StreamsService.Publish)
    PublishBatch = confirming(StreamsService.PublishBatch)

    @rpc.unary
    async def CreateStream(self, request: streams_pb2.CreateStreamRequest,
                           context: Context) -> types_pb2.StreamInfo:
        config = validate_config(request.config)
        existing = self._cluster.state.streams.get(config.name)
        if existing is None:
            primary, replicas = self._cluster.new_placement(config)
            if primary != self._cluster.node_id:  # the ring moved under the router
                raise RaftlogError(Reason.NOT_PRIMARY, f"stream {config.name!r} belongs on "
                                   f"{primary}", primary=primary)
            await self._cluster.propose(raft_pb2.RaftCommand(stream_create=raft_pb2.StreamCreate(
                config=config, replicas=replicas, primary=primary)),
                timeout_s=context.time_remaining())
        elif existing.config != config:
            raise RaftlogError(Reason.STREAM_EXISTS,
                               f"stream {config.name!r} exists with a different config",
                               stream=config.name)
        await self._cluster.reconcile(config.name)
        return self._engine.info(config.name)

    @confirming
    async def UpdateStream(self, request: streams_pb2.UpdateStreamRequest,
                           context: Context) -> streams_pb2.UpdateStreamResponse:
        subjects.validate_name(request.name, what="stream")
        assignment = self._cluster.state.streams.get(request.name)
        if assignment is None:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"no stream named {request.name!r}",
                               stream=request.name)
        config = apply_update(assignment.config, request)
        self._engine.consumers.check_stream_subjects(request.name, list(config.subjects))
        # Reconcile may apply the committed config (and prune) before this call does.
        pruned_before = self._engine.pruned_by_config(request.name)
        await self._cluster.propose(raft_pb2.RaftCommand(stream_update=raft_pb2.StreamUpdate(
            name=request.name, config=config)), timeout_s=context.time_remaining())
        await self._engine.apply_config(request.name, config)
        pruned = self._engine.pruned_by_config(request.name) - pruned_before
        return streams_pb2.UpdateStreamResponse(info=self._engine.info(request.name),
                                                pruned=pruned)

    @confirming
    async def DeleteStream(self, request: streams_pb2.DeleteStreamRequest,
                           context: Context) -> streams_pb2.DeleteStreamResponse:
        subjects.validate_name(request.name, what="stream")
        if request.name not in self._cluster.state.streams:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"no stream named {request.name!r}",
                               stream=request.name)
        await self._cluster.propose(raft_pb2.RaftCommand(
            stream_delete=raft_pb2.StreamDelete(name=request.name)),
            timeout_s=context.time_remaining())
        await self._cluster.reconcile(request.name)
        return streams_pb2.DeleteStreamResponse()

    @rpc.unary
    async def ListStreams(self, request: streams_pb2.ListStreamsRequest,
                          context: Context) -> streams_pb2.ListStreamsResponse:
        if is_local_only(context):
            return streams_pb2.ListStreamsResponse(streams=self._engine.infos(request.prefix))
        with self._cluster.group.read_state() as state:
            assignments = {name: stream.config for name, stream in state.streams.items()
                           if name.startswith(request.prefix)}
            addresses = {m.node_id: m.grpc_address for m in state.members.values()}
        found: dict[str, types_pb2.StreamInfo] = {}
        replies = await asyncio.gather(*(
            self._list(node_id, address, context) for node_id, address in addresses.items()))
        for infos in replies:
            for info in infos or ():
                if info.config.name in assignments:
                    found[info.config.name] = info
        streams = [found.get(name) or types_pb2.StreamInfo(config=config)
                   for name, config in sorted(assignments.items())]
        return streams_pb2.ListStreamsResponse(streams=streams)

    async def _list(self, node_id: str, address: str, context: Context
                    ) -> list[types_pb2.StreamInfo] | None:
        if node_id == self._cluster.node_id:
            return self._engine.infos()
        return await list_node(self._pool, address,
                               timeout_s=min(remaining_s(context), fanout_timeout_s))

    @rpc.unary
    async def PublishStream(self, request_iterator: AsyncIterator[streams_pb2.PublishRequest],
                            context: Context) -> streams_pb2.PublishBatchResponse:
        """Messages for streams served here are published here; the rest are gathered per
        stream and sent to their primaries as batches at the end of the call."""
        local: list[tuple[int, streams_pb2.PublishRequest]] = []
        remote: dict[str, list[tuple[int, streams_pb2.PublishRequest]]] = {}
        results: list[streams_pb2.PublishResult | None] = []
        async for request in request_iterator:
            index = len(results)
            results.append(None)
            try:
                address = self._cluster.primary_address(request.stream)
            except RaftlogError as err:
                results[index] = streams_pb2.PublishResult(error=rpc.to_error_pb(err))
                continue
            if address is None:
                local.append((index, request))
            else:
                remote.setdefault(address, []).append((index, request))
        await asyncio.gather(
            self._publish_local(local, results),
            *(self._publish_remote(address, items, results, context)
              for address, items in remote.items()))
        final = [r or streams_pb2.PublishResult() for r in results]
        failed = sum(1 for r in final if r.HasField("error"))
        return streams_pb2.PublishBatchResponse(results=final, acked=len(final) - failed,
                                                failed=failed)

    async def _publish_local(self, items: list[tuple[int, streams_pb2.PublishRequest]],
                             results: list[streams_pb2.PublishResult | None]) -> None:
        async def requests() -> AsyncIterator[streams_pb2.PublishRequest]:
            for _, request in items:
                yield request

        if not items:
            return
        reply = await self._publish_stream(requests())
        for (index, _), result in zip(items, expand_results(reply), strict=True):
            results[index] = result

    async def _publish_remote(self, address: str,
                              items: list[tuple[int, streams_pb2.PublishRequest]],
                              results: list[streams_pb2.PublishResult | None],
                              context: Context) -> None:
        stub = streams_pb2_grpc.StreamsStub(self._pool.get(address))  # type: ignore[no-untyped-call]
        try:
            reply = await stub.PublishStream(iter([request for _, request in items]),
                                             metadata=outgoing_metadata(context),
                                             timeout=remaining_s(context))
            outcomes = expand_results(reply)
        except (grpc.aio.AioRpcError, RaftlogError) as err:
            error = err if isinstance(err, RaftlogError) else RaftlogError(
                Reason.FORWARD_FAILED, f"publishing through {address} failed: {err.details()}",
                address=address)
            outcomes = [streams_pb2.PublishResult(error=rpc.to_error_pb(error))] * len(items)
        for (index, _), result in zip(items, outcomes, strict=True):
            results[index] = result


class ClusterConsumersService(ConsumersService):
    def __init__(self, manager: ConsumerManager, cluster: ClusterNode) -> None:
        super().__init__(manager)
        self._cluster = cluster
        self.existence = ExistenceCheck(cluster)

    # Per-stream calls served here: a NOT_FOUND is confirmed first (existence.py).
    ListConsumers = confirming(ConsumersService.ListConsumers)
    GetConsumerInfo = confirming(ConsumersService.GetConsumerInfo)
    Fetch = confirming(ConsumersService.Fetch)
    Ack = confirming(ConsumersService.Ack)
    Nak = confirming(ConsumersService.Nak)
    Term = confirming(ConsumersService.Term)
    InProgress = confirming(ConsumersService.InProgress)
    Subscribe = confirming_stream(ConsumersService.Subscribe)

    async def _confirm_gone(self, exc: RaftlogError, *, stream: str, consumer: str
                            ) -> RaftlogError:
        return await self.existence.confirm(exc, stream=stream, consumer=consumer,
                                            timeout_s=None)

    @confirming
    async def CreateConsumer(self, request: consumers_pb2.CreateConsumerRequest,
                             context: Context) -> consumers_pb2.ConsumerInfo:
        subjects.validate_name(request.stream, what="stream")
        assignment = self._cluster.state.streams.get(request.stream)
        if assignment is None:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"no stream named {request.stream!r}",
                               stream=request.stream)
        config = validate_consumer_config(request.config,
                                          stream_subjects=list(assignment.config.subjects))
        committed = self._cluster.state.consumers.get(request.stream, {}).get(config.name)
        if committed is not None:
            return await self._manager.create(request.stream, config)  # same config: idempotent
        # Committed first: the consumer's acks are committed through the cluster and refer
        # to it; if the local create then fails, the cluster forgets the consumer again.
        await self._cluster.propose(raft_pb2.RaftCommand(consumer_create=raft_pb2.ConsumerCreate(
            stream=request.stream, config=config)), timeout_s=context.time_remaining())
        try:
            return await self._manager.create(request.stream, config)
        except RaftlogError:
            await self._cluster.propose(raft_pb2.RaftCommand(
                consumer_delete=raft_pb2.ConsumerDelete(stream=request.stream,
                                                        consumer=config.name)))
            raise

    @confirming
    async def DeleteConsumer(self, request: consumers_pb2.DeleteConsumerRequest,
                             context: Context) -> consumers_pb2.DeleteConsumerResponse:
        subjects.validate_name(request.stream, what="stream")
        subjects.validate_name(request.consumer, what="consumer")
        self._manager.info(request.stream, request.consumer)  # NOT_FOUND before proposing
        await self._cluster.propose(raft_pb2.RaftCommand(consumer_delete=raft_pb2.ConsumerDelete(
            stream=request.stream, consumer=request.consumer)),
            timeout_s=context.time_remaining())
        await self._manager.delete(request.stream, request.consumer)
        return consumers_pb2.DeleteConsumerResponse()
