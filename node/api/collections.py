"""The raftlog.v1 Collections service: each call handed to the collection operations
(node/ops/collections.py), which build hashes, sets and queues on the stream operations."""

from __future__ import annotations

from typing import Any

import grpc

from raftlog.node.ops.collections import CollectionOps
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.v1 import collections_pb2 as pb
from raftlog.v1 import collections_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]


class CollectionsService(collections_pb2_grpc.CollectionsServicer):
    def __init__(self, ops: CollectionOps) -> None:
        self._ops = ops

    @rpc.unary
    async def CreateCollection(self, request: pb.CreateCollectionRequest,
                               context: Context) -> pb.CollectionInfo:
        return await self._ops.create(request, Call.from_grpc(context))

    @rpc.unary
    async def DeleteCollection(self, request: pb.DeleteCollectionRequest,
                               context: Context) -> pb.DeleteCollectionResponse:
        return await self._ops.delete(request, Call.from_grpc(context))

    @rpc.unary
    async def GetCollectionInfo(self, request: pb.GetCollectionInfoRequest,
                                context: Context) -> pb.CollectionInfo:
        return await self._ops.info(request, Call.from_grpc(context))

    @rpc.unary
    async def ListCollections(self, request: pb.ListCollectionsRequest,
                              context: Context) -> pb.ListCollectionsResponse:
        return await self._ops.list_collections(request, Call.from_grpc(context))

    @rpc.unary
    async def SetHashField(self, request: pb.SetHashFieldRequest,
                           context: Context) -> pb.SetHashFieldResponse:
        return await self._ops.set_field(request, Call.from_grpc(context))

    @rpc.unary
    async def GetHashField(self, request: pb.HashFieldRequest,
                           context: Context) -> pb.HashFieldEntry:
        return await self._ops.get_field(request, Call.from_grpc(context))

    @rpc.unary
    async def HashFieldExists(self, request: pb.HashFieldRequest,
                              context: Context) -> pb.HashFieldExistsResponse:
        return await self._ops.field_exists(request, Call.from_grpc(context))

    @rpc.unary
    async def DeleteHashField(self, request: pb.HashFieldRequest,
                              context: Context) -> pb.DeleteHashFieldResponse:
        return await self._ops.delete_field(request, Call.from_grpc(context))

    @rpc.unary
    async def GetHash(self, request: pb.HashKeyRequest, context: Context) -> pb.GetHashResponse:
        return await self._ops.get_hash(request, Call.from_grpc(context))

    @rpc.unary
    async def ListHashFields(self, request: pb.HashKeyRequest,
                             context: Context) -> pb.ListHashFieldsResponse:
        return await self._ops.list_fields(request, Call.from_grpc(context))

    @rpc.unary
    async def CountHashFields(self, request: pb.HashKeyRequest,
                              context: Context) -> pb.CollectionCount:
        return await self._ops.count_fields(request, Call.from_grpc(context))

    @rpc.unary
    async def AddSetMember(self, request: pb.SetMemberRequest,
                           context: Context) -> pb.AddSetMemberResponse:
        return await self._ops.add_member(request, Call.from_grpc(context))

    @rpc.unary
    async def RemoveSetMember(self, request: pb.SetMemberRequest,
                              context: Context) -> pb.RemoveSetMemberResponse:
        return await self._ops.remove_member(request, Call.from_grpc(context))

    @rpc.unary
    async def IsSetMember(self, request: pb.SetMemberRequest,
                          context: Context) -> pb.IsSetMemberResponse:
        return await self._ops.is_member(request, Call.from_grpc(context))

    @rpc.unary
    async def ListSetMembers(self, request: pb.SetKeyRequest,
                             context: Context) -> pb.ListSetMembersResponse:
        return await self._ops.list_members(request, Call.from_grpc(context))

    @rpc.unary
    async def CountSetMembers(self, request: pb.SetKeyRequest,
                              context: Context) -> pb.CollectionCount:
        return await self._ops.count_members(request, Call.from_grpc(context))

    @rpc.unary
    async def PushQueue(self, request: pb.PushQueueRequest,
                        context: Context) -> pb.PushQueueResponse:
        return await self._ops.push(request, Call.from_grpc(context))

    @rpc.unary
    async def PopQueue(self, request: pb.PopQueueRequest, context: Context) -> pb.QueueItem:
        return await self._ops.pop(request, Call.from_grpc(context))

    @rpc.unary
    async def PeekQueue(self, request: pb.PeekQueueRequest,
                        context: Context) -> pb.PeekQueueResponse:
        return await self._ops.peek(request, Call.from_grpc(context))

    @rpc.unary
    async def CountQueue(self, request: pb.CountQueueRequest,
                         context: Context) -> pb.CollectionCount:
        return await self._ops.count(request, Call.from_grpc(context))
