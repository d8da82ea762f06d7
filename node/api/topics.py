"""The raftlog.v1 Topics service: each call handed to the topic operations (node/ops)."""

from __future__ import annotations

from typing import Any

import grpc

from raftlog.node.ops.partitions import TopicOps
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.v1 import topics_pb2, topics_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]


class TopicsService(topics_pb2_grpc.TopicsServicer):
    def __init__(self, ops: TopicOps) -> None:
        self._ops = ops

    @rpc.unary
    async def CreateTopic(self, request: topics_pb2.CreateTopicRequest,
                          context: Context) -> topics_pb2.TopicInfo:
        return await self._ops.create(request, Call.from_grpc(context))

    @rpc.unary
    async def DeleteTopic(self, request: topics_pb2.DeleteTopicRequest,
                          context: Context) -> topics_pb2.DeleteTopicResponse:
        return await self._ops.delete(request, Call.from_grpc(context))

    @rpc.unary
    async def GetTopic(self, request: topics_pb2.GetTopicRequest,
                       context: Context) -> topics_pb2.TopicInfo:
        return await self._ops.info(request, Call.from_grpc(context))

    @rpc.unary
    async def ListTopics(self, request: topics_pb2.ListTopicsRequest,
                         context: Context) -> topics_pb2.ListTopicsResponse:
        return await self._ops.list(request, Call.from_grpc(context))

    @rpc.unary
    async def PublishToTopic(self, request: topics_pb2.PublishToTopicRequest,
                             context: Context) -> topics_pb2.PublishToTopicResponse:
        return await self._ops.publish(request, Call.from_grpc(context))

    @rpc.unary
    async def CreateTopicGroup(self, request: topics_pb2.CreateTopicGroupRequest,
                               context: Context) -> topics_pb2.TopicGroupInfo:
        return await self._ops.create_group(request, Call.from_grpc(context))

    @rpc.unary
    async def DeleteTopicGroup(self, request: topics_pb2.DeleteTopicGroupRequest,
                               context: Context) -> topics_pb2.DeleteTopicGroupResponse:
        return await self._ops.delete_group(request, Call.from_grpc(context))

    @rpc.unary
    async def GetTopicOffsets(self, request: topics_pb2.GetTopicOffsetsRequest,
                              context: Context) -> topics_pb2.TopicOffsets:
        return await self._ops.offsets(request, Call.from_grpc(context))

    @rpc.unary
    async def SetTopicOffsets(self, request: topics_pb2.SetTopicOffsetsRequest,
                              context: Context) -> topics_pb2.TopicOffsets:
        return await self._ops.set_offsets(request, Call.from_grpc(context))
