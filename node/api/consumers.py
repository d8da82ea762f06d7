"""The raftlog.v1 Consumers service: each call handed to the consumer operations (node/ops).
Every method is wrapped by `rpc.unary` / `rpc.server_stream`, so a RaftlogError reaches the
client as its status code with a google.rpc.ErrorInfo.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from raftlog.node.ops.consumers import ConsumerOps
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.v1 import consumers_pb2, consumers_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]


class ConsumersService(consumers_pb2_grpc.ConsumersServicer):
    def __init__(self, ops: ConsumerOps) -> None:
        self._ops = ops

    @rpc.unary
    async def CreateConsumer(self, request: consumers_pb2.CreateConsumerRequest,
                             context: Context) -> consumers_pb2.ConsumerInfo:
        return await self._ops.create(request, Call.from_grpc(context))

    @rpc.unary
    async def DeleteConsumer(self, request: consumers_pb2.DeleteConsumerRequest,
                             context: Context) -> consumers_pb2.DeleteConsumerResponse:
        return await self._ops.delete(request, Call.from_grpc(context))

    @rpc.unary
    async def ListConsumers(self, request: consumers_pb2.ListConsumersRequest,
                            context: Context) -> consumers_pb2.ListConsumersResponse:
        return await self._ops.list(request, Call.from_grpc(context))

    @rpc.unary
    async def GetConsumerInfo(self, request: consumers_pb2.GetConsumerInfoRequest,
                              context: Context) -> consumers_pb2.ConsumerInfo:
        return await self._ops.info(request, Call.from_grpc(context))

    @rpc.unary
    async def Fetch(self, request: consumers_pb2.FetchRequest,
                    context: Context) -> consumers_pb2.FetchResponse:
        return await self._ops.fetch(request, Call.from_grpc(context))

    @rpc.unary
    async def Ack(self, request: consumers_pb2.AckRequest,
                  context: Context) -> consumers_pb2.AckResponse:
        return await self._ops.ack(request, Call.from_grpc(context))

    @rpc.unary
    async def Nak(self, request: consumers_pb2.NakRequest,
                  context: Context) -> consumers_pb2.AckResponse:
        return await self._ops.nak(request, Call.from_grpc(context))

    @rpc.unary
    async def Term(self, request: consumers_pb2.TermRequest,
                   context: Context) -> consumers_pb2.AckResponse:
        return await self._ops.term(request, Call.from_grpc(context))

    @rpc.unary
    async def InProgress(self, request: consumers_pb2.InProgressRequest,
                         context: Context) -> consumers_pb2.AckResponse:
        return await self._ops.in_progress(request, Call.from_grpc(context))

    @rpc.server_stream
    async def Subscribe(self, request: consumers_pb2.SubscribeRequest,
                        context: Context) -> AsyncIterator[consumers_pb2.SubscribeEvent]:
        async for event in self._ops.subscribe(request, Call.from_grpc(context)):
            yield event
