"""The raftlog.v1 Streams service: each call handed to the stream operations (node/ops)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from raftlog.node.ops.streams import StreamOps
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.v1 import streams_pb2, streams_pb2_grpc, types_pb2

Context = grpc.aio.ServicerContext[Any, Any]


class StreamsService(streams_pb2_grpc.StreamsServicer):
    def __init__(self, ops: StreamOps) -> None:
        self._ops = ops

    @rpc.unary
    async def CreateStream(self, request: streams_pb2.CreateStreamRequest,
                           context: Context) -> types_pb2.StreamInfo:
        return await self._ops.create(request, Call.from_grpc(context))

    @rpc.unary
    async def UpdateStream(self, request: streams_pb2.UpdateStreamRequest,
                           context: Context) -> streams_pb2.UpdateStreamResponse:
        return await self._ops.update(request, Call.from_grpc(context))

    @rpc.unary
    async def DeleteStream(self, request: streams_pb2.DeleteStreamRequest,
                           context: Context) -> streams_pb2.DeleteStreamResponse:
        return await self._ops.delete(request, Call.from_grpc(context))

    @rpc.unary
    async def GetStreamInfo(self, request: streams_pb2.GetStreamInfoRequest,
                            context: Context) -> types_pb2.StreamInfo:
        return await self._ops.info(request, Call.from_grpc(context))

    @rpc.unary
    async def ListStreams(self, request: streams_pb2.ListStreamsRequest,
                          context: Context) -> streams_pb2.ListStreamsResponse:
        return await self._ops.list(request, Call.from_grpc(context))

    @rpc.unary
    async def PurgeStream(self, request: streams_pb2.PurgeStreamRequest,
                          context: Context) -> streams_pb2.PurgeStreamResponse:
        return await self._ops.purge(request, Call.from_grpc(context))

    @rpc.unary
    async def GetMessage(self, request: streams_pb2.GetMessageRequest,
                         context: Context) -> types_pb2.Message:
        return await self._ops.get_message(request, Call.from_grpc(context))

    @rpc.unary
    async def ReadLatestAtSubject(self, request: streams_pb2.ReadLatestAtSubjectRequest,
                                  context: Context) -> types_pb2.Message:
        return await self._ops.read_latest(request, Call.from_grpc(context))

    @rpc.unary
    async def ListSubjectsByPrefix(self, request: streams_pb2.ListSubjectsByPrefixRequest,
                                   context: Context) -> streams_pb2.ListSubjectsByPrefixResponse:
        return await self._ops.list_subjects(request, Call.from_grpc(context))

    @rpc.unary
    async def ScanExactAtSubject(self, request: streams_pb2.ScanExactAtSubjectRequest,
                                 context: Context) -> streams_pb2.ScanExactAtSubjectResponse:
        return await self._ops.scan_subject(request, Call.from_grpc(context))

    @rpc.unary
    async def Publish(self, request: streams_pb2.PublishRequest,
                      context: Context) -> streams_pb2.PublishAck:
        return await self._ops.publish(request, Call.from_grpc(context))

    @rpc.unary
    async def PublishBatch(self, request: streams_pb2.PublishBatchRequest,
                           context: Context) -> streams_pb2.PublishBatchResponse:
        return await self._ops.publish_batch(request, Call.from_grpc(context))

    @rpc.unary
    async def PublishStream(self, request_iterator: AsyncIterator[streams_pb2.PublishRequest],
                            context: Context) -> streams_pb2.PublishBatchResponse:
        return await self._ops.publish_stream(request_iterator, Call.from_grpc(context))

    @rpc.server_stream
    async def PublishFrames(
            self, request_iterator: AsyncIterator[streams_pb2.PublishBatchRequest],
            context: Context) -> AsyncIterator[streams_pb2.PublishBatchResponse]:
        async for answer in self._ops.publish_frames(request_iterator, Call.from_grpc(context)):
            yield answer

    @rpc.unary
    async def ReadMessages(self, request: streams_pb2.ReadMessagesRequest,
                           context: Context) -> streams_pb2.ReadMessagesResponse:
        return await self._ops.read_messages(request, Call.from_grpc(context))

    @rpc.unary
    async def GetStreamSources(self, request: streams_pb2.GetStreamSourcesRequest,
                               context: Context) -> streams_pb2.GetStreamSourcesResponse:
        return await self._ops.sources(request, Call.from_grpc(context))

    @rpc.unary
    async def ListScheduled(self, request: streams_pb2.ListScheduledRequest,
                            context: Context) -> streams_pb2.ListScheduledResponse:
        return await self._ops.scheduled().list(request, Call.from_grpc(context))

    @rpc.unary
    async def CancelScheduled(self, request: streams_pb2.CancelScheduledRequest,
                              context: Context) -> streams_pb2.CancelScheduledResponse:
        return await self._ops.scheduled().cancel(request, Call.from_grpc(context))
