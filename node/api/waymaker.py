"""The Waymaker streams API (waymaker.streams.WaymakerStreamsService) on the client port, beside
raftlog.v1: each call is translated into the canonical raftlog.v1 request (waymaker_convert),
handed to the same operations (node/ops), and the answer translated back, so a stream or
consumer made through one API is the same one through the other.

Errors: a RaftlogError becomes `success=false` with the seed's `result_code`
(waymaker_codes, waymaker_answer) and raftlog's message; retryable transport conditions and
missing credentials stay gRPC statuses, as do all errors of the streaming calls (they have no
result_code). The cluster RPCs are in waymaker_cluster (a mixin of this service).

The object-store RPCs and GetStreamSources come from other modules: pass their handlers as
`extra` (method name -> a servicer method's callable, `(request, context)`); a method without
one answers UNIMPLEMENTED.
docs/waymaker.md describes every call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import grpc

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.compat import waymaker_streams_pb2 as wm
from raftlog.compat import waymaker_streams_pb2_grpc as wm_grpc
from raftlog.node.api import waymaker_convert as convert
from raftlog.node.api import waymaker_ids as ids
from raftlog.node.api import waymaker_sources
from raftlog.node.api.waymaker_answer import answered, settled
from raftlog.node.api.waymaker_cluster import ClusterRpcs
from raftlog.node.api.waymaker_codes import Family
from raftlog.node.ops.operations import ClusterOperations, Operations
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.node.transport.credentials import Credential
from raftlog.v1 import cluster_pb2, consumers_pb2, streams_pb2, types_pb2

Context = grpc.aio.ServicerContext[Any, Any]
R = TypeVar("R")
log = logging.getLogger(__name__)
Method = Callable[[Any, Any, Context], Awaitable[Any]]

_SERVICE = wm.DESCRIPTOR.services_by_name["WaymakerStreamsService"]
SERVICE_NAME = _SERVICE.full_name
_SERVICE_PREFIX = f"/{SERVICE_NAME}/"
# Served by other modules through `extra` (object store, sources).
EXTRA_METHODS = frozenset({
    "PutObject", "GetObject", "DeleteObject", "GetObjectInfo", "ListObjects", "PutObjectStream",
    "GetObjectStream", "ListObjectRevisions", "GetObjectRange", "GetStreamSources"})


class WaymakerService(ClusterRpcs, wm_grpc.WaymakerStreamsServiceServicer):
    def __init__(self, ops: Operations, *, credential: Credential | None = None,
                 extra: Mapping[str, Callable[..., Any]] | None = None) -> None:
        self._streams = ops.streams
        self._consumers = ops.consumers
        self._cluster = ops if isinstance(ops, ClusterOperations) else None
        self._credential = credential
        self._extra = dict(extra or {})
        self._moves: set[asyncio.Task[Any]] = set()  # rebalance steps past their step timeout
        unknown = set(self._extra) - EXTRA_METHODS
        if unknown:
            raise ValueError(f"not methods served from outside this module: {sorted(unknown)}")

    # ------------------------------------------------------------------ helpers

    async def _stream_exists(self, name: str, via: Call) -> bool:
        """From the metadata in a cluster (no read of the stream, which a primary serves only
        under its lease); from the engine on a node alone."""
        if self._cluster is not None:
            route = await self._cluster.views.explain_route(
                cluster_pb2.ExplainRouteRequest(stream=name), via)
            return route.exists
        try:
            await self._streams.info(streams_pb2.GetStreamInfoRequest(name=name), via)
        except RaftlogError as err:
            if err.reason != Reason.STREAM_NOT_FOUND:
                raise
            return False
        return True

    async def _handler(self, name: str, context: Context) -> Callable[..., Any]:
        handler = self._extra.get(name)
        if handler is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                f"{name} is not served by this node yet")
            raise AssertionError("unreachable: abort raises")
        return handler

    # ------------------------------------------------------------------ served by `extra`

    async def PutObject(self, request: Any, context: Context) -> Any:
        return await (await self._handler("PutObject", context))(request, context)

    async def GetObject(self, request: Any, context: Context) -> Any:
        return await (await self._handler("GetObject", context))(request, context)

    async def DeleteObject(self, request: Any, context: Context) -> Any:
        return await (await self._handler("DeleteObject", context))(request, context)

    async def GetObjectInfo(self, request: Any, context: Context) -> Any:
        return await (await self._handler("GetObjectInfo", context))(request, context)

    async def ListObjects(self, request: Any, context: Context) -> Any:
        return await (await self._handler("ListObjects", context))(request, context)

    async def ListObjectRevisions(self, request: Any, context: Context) -> Any:
        return await (await self._handler("ListObjectRevisions", context))(request, context)

    async def GetObjectRange(self, request: Any, context: Context) -> Any:
        return await (await self._handler("GetObjectRange", context))(request, context)

    async def GetStreamSources(self, request: Any, context: Context) -> Any:
        return await (await self._handler("GetStreamSources", context))(request, context)

    async def PutObjectStream(self, request_iterator: Any, context: Context) -> Any:
        return await (await self._handler("PutObjectStream", context))(request_iterator, context)

    async def GetObjectStream(self, request: Any, context: Context) -> AsyncIterator[Any]:
        handler = await self._handler("GetObjectStream", context)
        async for frame in handler(request, context):
            yield frame

    # ------------------------------------------------------------------ streams

    @answered(wm.CreateStreamResponse, Family.STREAM)
    async def CreateStream(self, request: wm.CreateStreamRequest,
                           context: Context) -> wm.CreateStreamResponse:
        config = convert.stream_config_in(request.config)
        via = Call.from_grpc(context)
        # raftlog's create is idempotent for an equal config; the seed's is not.
        if await self._stream_exists(config.name, via):
            raise RaftlogError(Reason.STREAM_EXISTS, f"stream {config.name!r} exists",
                               stream=config.name)
        await self._streams.create(streams_pb2.CreateStreamRequest(config=config), via)
        return wm.CreateStreamResponse()

    @answered(wm.DeleteStreamResponse, Family.STREAM)
    async def DeleteStream(self, request: wm.DeleteStreamRequest,
                           context: Context) -> wm.DeleteStreamResponse:
        await self._streams.delete(streams_pb2.DeleteStreamRequest(name=request.name),
                                   Call.from_grpc(context))
        return wm.DeleteStreamResponse()

    @answered(wm.GetStreamInfoResponse, Family.STREAM)
    async def GetStreamInfo(self, request: wm.GetStreamInfoRequest,
                            context: Context) -> wm.GetStreamInfoResponse:
        via = Call.from_grpc(context)
        info = await self._streams.info(streams_pb2.GetStreamInfoRequest(name=request.name), via)
        reply = wm.GetStreamInfoResponse(config=convert.stream_config_out(info.config),
                                         stats=convert.stats_out(info.state))
        reply.sources_status.extend(waymaker_sources.status_out(s) for s in info.sources)
        if self._cluster is not None:
            views = self._cluster.views
            route = await views.explain_route(
                cluster_pb2.ExplainRouteRequest(stream=request.name), via)
            reply.ring_owner_node_id = ids.to_wire(route.ring_owner)
            for entry in views.overrides().overrides:
                if entry.stream == request.name:
                    reply.authority_override.claimant_node_id = ids.to_wire(entry.claimant)
                    reply.authority_override.fence_epoch = entry.fence_epoch
                    reply.pinned = entry.pinned
        return reply

    @rpc.unary
    async def ListStreams(self, request: wm.ListStreamsRequest,
                          context: Context) -> wm.ListStreamsResponse:
        found = await self._streams.list(streams_pb2.ListStreamsRequest(),
                                         Call.from_grpc(context))
        return wm.ListStreamsResponse(names=[info.config.name for info in found.streams])

    @answered(wm.UpdateStreamResponse, Family.STREAM)
    async def UpdateStream(self, request: wm.UpdateStreamRequest,
                           context: Context) -> wm.UpdateStreamResponse:
        updated = await self._streams.update(convert.update_in(request), Call.from_grpc(context))
        return wm.UpdateStreamResponse(config=convert.stream_config_out(updated.info.config),
                                       pruned=updated.pruned)

    # ------------------------------------------------------------------ messages

    @answered(wm.PublishResponse, Family.PUBLISH)
    async def Publish(self, request: wm.PublishRequest,
                      context: Context) -> wm.PublishResponse:
        try:
            ack = await self._streams.publish(convert.publish_in(request),
                                              Call.from_grpc(context))
        except RaftlogError as err:
            if err.reason != Reason.WRONG_LAST_SUBJECT_SEQ:
                raise
            return wm.PublishResponse(success=False, result_code="wrong_revision",
                                      message=err.message,
                                      seq=int(err.metadata.get("last_subject_seq", "0")))
        return wm.PublishResponse(seq=ack.seq)

    @answered(wm.ReadLatestAtSubjectResponse, Family.STREAM)
    async def ReadLatestAtSubject(self, request: wm.ReadLatestAtSubjectRequest,
                                  context: Context) -> wm.ReadLatestAtSubjectResponse:
        try:
            latest = await self._streams.read_latest(streams_pb2.ReadLatestAtSubjectRequest(
                stream=request.stream, subject=request.subject), Call.from_grpc(context))
        except RaftlogError as err:
            if err.reason != Reason.MESSAGE_NOT_FOUND:
                raise
            return wm.ReadLatestAtSubjectResponse()
        return wm.ReadLatestAtSubjectResponse(latest=convert.message_out(latest))

    @answered(wm.ListSubjectsByPrefixResponse, Family.STREAM)
    async def ListSubjectsByPrefix(self, request: wm.ListSubjectsByPrefixRequest,
                                   context: Context) -> wm.ListSubjectsByPrefixResponse:
        found = await self._streams.list_subjects(streams_pb2.ListSubjectsByPrefixRequest(
            stream=request.stream, prefix=request.prefix, limit=limits.list_subjects_limit_max),
            Call.from_grpc(context))
        reply = wm.ListSubjectsByPrefixResponse(subjects=[s.subject for s in found.subjects])
        if found.truncated:
            reply.message = (f"only the first {limits.list_subjects_limit_max} subjects; use a "
                             "longer prefix for the rest")
        return reply

    @answered(wm.ScanExactAtSubjectResponse, Family.STREAM)
    async def ScanExactAtSubject(self, request: wm.ScanExactAtSubjectRequest,
                                 context: Context) -> wm.ScanExactAtSubjectResponse:
        limit = min(request.limit or limits.scan_limit_default, limits.scan_limit_max)
        found = await self._streams.scan_subject(streams_pb2.ScanExactAtSubjectRequest(
            stream=request.stream, subject=request.subject, from_seq=request.from_seq,
            limit=limit), Call.from_grpc(context))
        return wm.ScanExactAtSubjectResponse(
            messages=[convert.message_out(m) for m in found.messages])

    # ------------------------------------------------------------------ consumers

    @answered(wm.CreateConsumerResponse, Family.CONSUMER)
    async def CreateConsumer(self, request: wm.CreateConsumerRequest,
                             context: Context) -> wm.CreateConsumerResponse:
        config = convert.consumer_config_in(request.config)
        via = Call.from_grpc(context)
        try:  # raftlog's create is idempotent for an equal config; the seed's is not
            await self._consumers.info(consumers_pb2.GetConsumerInfoRequest(
                stream=request.stream, consumer=config.name), via)
        except RaftlogError as err:
            if err.reason != Reason.CONSUMER_NOT_FOUND:
                raise
        else:
            raise RaftlogError(Reason.CONSUMER_EXISTS, f"consumer {config.name!r} exists on "
                               f"stream {request.stream!r}", consumer=config.name)
        await self._consumers.create(consumers_pb2.CreateConsumerRequest(
            stream=request.stream, config=config), via)
        return wm.CreateConsumerResponse()

    @answered(wm.DeleteConsumerResponse, Family.CONSUMER)
    async def DeleteConsumer(self, request: wm.DeleteConsumerRequest,
                             context: Context) -> wm.DeleteConsumerResponse:
        await self._consumers.delete(consumers_pb2.DeleteConsumerRequest(
            stream=request.stream, consumer=request.consumer), Call.from_grpc(context))
        return wm.DeleteConsumerResponse()

    @answered(wm.ListConsumersResponse, Family.CONSUMER)
    async def ListConsumers(self, request: wm.ListConsumersRequest,
                            context: Context) -> wm.ListConsumersResponse:
        found = await self._consumers.list(consumers_pb2.ListConsumersRequest(
            stream=request.stream), Call.from_grpc(context))
        return wm.ListConsumersResponse(
            consumers=[convert.consumer_state_out(info) for info in found.consumers])

    @answered(wm.GetConsumerInfoResponse, Family.CONSUMER)
    async def GetConsumerInfo(self, request: wm.GetConsumerInfoRequest,
                              context: Context) -> wm.GetConsumerInfoResponse:
        info = await self._consumers.info(consumers_pb2.GetConsumerInfoRequest(
            stream=request.stream, consumer=request.consumer), Call.from_grpc(context))
        return wm.GetConsumerInfoResponse(consumer=convert.consumer_state_out(info))

    @answered(wm.FetchResponse, Family.CONSUMER)
    async def Fetch(self, request: wm.FetchRequest, context: Context) -> wm.FetchResponse:
        found = await self._consumers.fetch(consumers_pb2.FetchRequest(
            stream=request.stream, consumer=request.consumer, batch=request.batch_size),
            Call.from_grpc(context))
        return wm.FetchResponse(messages=[convert.message_out(m) for m in found.messages])

    @answered(wm.AckResponse, Family.CONSUMER)
    async def Ack(self, request: wm.AckRequest, context: Context) -> wm.AckResponse:
        settled(await self._consumers.ack(consumers_pb2.AckRequest(
            stream=request.stream, consumer=request.consumer, seqs=[request.seq]),
            Call.from_grpc(context)))
        return wm.AckResponse()

    @answered(wm.NakResponse, Family.CONSUMER)
    async def Nak(self, request: wm.NakRequest, context: Context) -> wm.NakResponse:
        settled(await self._consumers.nak(consumers_pb2.NakRequest(
            stream=request.stream, consumer=request.consumer, seqs=[request.seq],
            delay_ms=request.delay_ms), Call.from_grpc(context)))
        return wm.NakResponse()

    @answered(wm.TermResponse, Family.CONSUMER)
    async def Term(self, request: wm.TermRequest, context: Context) -> wm.TermResponse:
        settled(await self._consumers.term(consumers_pb2.TermRequest(
            stream=request.stream, consumer=request.consumer, seqs=[request.seq]),
            Call.from_grpc(context)))
        return wm.TermResponse()

    @answered(wm.InProgressResponse, Family.CONSUMER)
    async def InProgress(self, request: wm.InProgressRequest,
                         context: Context) -> wm.InProgressResponse:
        settled(await self._consumers.in_progress(consumers_pb2.InProgressRequest(
            stream=request.stream, consumer=request.consumer, seqs=[request.seq]),
            Call.from_grpc(context)))
        return wm.InProgressResponse()

    @rpc.server_stream
    async def Subscribe(self, request: wm.SubscribeRequest,
                        context: Context) -> AsyncIterator[wm.SubscribeEvent]:
        canonical = consumers_pb2.SubscribeRequest(
            stream=request.stream, consumer=request.consumer,
            batch=request.batch_size or limits.waymaker_subscribe_batch_default,
            stop_when_empty=request.stop_when_empty)
        async for event in self._consumers.subscribe(canonical, Call.from_grpc(context)):
            kind = event.WhichOneof("event")
            if kind == "message":
                yield wm.SubscribeEvent(message=convert.message_out(event.message))
            elif kind == "stopped":
                yield wm.SubscribeEvent(stopped=wm.SubscribeStopped(reason=event.stopped.reason))
            # heartbeats have no Waymaker form

    # ------------------------------------------------------------------ transfer

    @rpc.server_stream
    async def TransferStream(self, request: wm.TransferStreamRequest,
                             context: Context) -> AsyncIterator[wm.TransferStreamChunk]:
        """Every stored message up to the last seq at the start, in seq order, framed as
        waymaker_convert.frame; then the summary. The stream stays where it is. Messages are
        read in pages (ReadMessages on the stream's primary, each at most
        limits.source_read_bytes_max of messages), so memory holds one page and one chunk."""
        via = Call.from_grpc(context)
        info = await self._streams.info(streams_pb2.GetStreamInfoRequest(name=request.name), via)
        last_seq, pending, total = info.state.last_seq, bytearray(), 0
        async for message in self._messages_through(request.name, last_seq, via):
            pending += convert.frame(message)
            while len(pending) >= limits.waymaker_transfer_chunk_bytes_max:
                chunk = bytes(pending[:limits.waymaker_transfer_chunk_bytes_max])
                del pending[:limits.waymaker_transfer_chunk_bytes_max]
                total += len(chunk)
                yield wm.TransferStreamChunk(data=chunk)
        if pending:
            total += len(pending)
            yield wm.TransferStreamChunk(data=bytes(pending))
        yield wm.TransferStreamChunk(summary=wm.TransferStreamSummary(
            total_bytes=total, stream_last_seq=last_seq))

    async def _messages_through(self, stream: str, last_seq: int, via: Call
                                ) -> AsyncIterator[types_pb2.Message]:
        """The stream's stored messages from its first seq through `last_seq`, page by page.
        A seq removed meanwhile (retention) is not there to send; one written after the start
        is past `last_seq` and left out."""
        next_seq = 1
        while next_seq <= last_seq:
            page = await self._streams.read_messages(streams_pb2.ReadMessagesRequest(
                stream=stream, from_seq=next_seq, limit=limits.scan_limit_max), via)
            for message in page.messages:
                if message.seq > last_seq:
                    return
                yield message
            if page.next_seq <= next_seq:  # a new primary not yet committed that far
                raise RaftlogError(Reason.CATCHING_UP, f"stream {stream!r} is committed "
                                   f"through seq {page.last_seq} on its primary, not yet "
                                   f"through seq {last_seq}; retry the transfer",
                                   stream=stream)
            next_seq = page.next_seq
