"""The raftlog.v1 Objects service: each call handed to the object store operations (node/ops)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from raftlog.node.ops.objects import ObjectOps
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.v1 import objects_pb2, objects_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]


class ObjectsService(objects_pb2_grpc.ObjectsServicer):
    def __init__(self, ops: ObjectOps) -> None:
        self._ops = ops

    @rpc.unary
    async def CreateBucket(self, request: objects_pb2.CreateBucketRequest,
                           context: Context) -> objects_pb2.BucketInfo:
        return await self._ops.create_bucket(request, Call.from_grpc(context))

    @rpc.unary
    async def DeleteBucket(self, request: objects_pb2.DeleteBucketRequest,
                           context: Context) -> objects_pb2.DeleteBucketResponse:
        return await self._ops.delete_bucket(request, Call.from_grpc(context))

    @rpc.unary
    async def ListBuckets(self, request: objects_pb2.ListBucketsRequest,
                          context: Context) -> objects_pb2.ListBucketsResponse:
        return await self._ops.list_buckets(request, Call.from_grpc(context))

    @rpc.unary
    async def Put(self, request: objects_pb2.PutObjectRequest,
                  context: Context) -> objects_pb2.ObjectInfo:
        return await self._ops.put(request, Call.from_grpc(context))

    @rpc.unary
    async def PutStream(self, request_iterator: AsyncIterator[objects_pb2.PutObjectFrame],
                        context: Context) -> objects_pb2.ObjectInfo:
        return await self._ops.put_stream(request_iterator, Call.from_grpc(context))

    @rpc.unary
    async def Get(self, request: objects_pb2.GetObjectRequest,
                  context: Context) -> objects_pb2.GetObjectResponse:
        return await self._ops.get(request, Call.from_grpc(context))

    @rpc.server_stream
    async def GetStream(self, request: objects_pb2.GetObjectRequest,
                        context: Context) -> AsyncIterator[objects_pb2.GetObjectFrame]:
        async for frame in self._ops.get_stream(request, Call.from_grpc(context)):
            yield frame

    @rpc.unary
    async def GetRange(self, request: objects_pb2.GetObjectRangeRequest,
                       context: Context) -> objects_pb2.GetObjectRangeResponse:
        return await self._ops.get_range(request, Call.from_grpc(context))

    @rpc.unary
    async def GetInfo(self, request: objects_pb2.GetObjectInfoRequest,
                      context: Context) -> objects_pb2.ObjectInfo:
        return await self._ops.info(request, Call.from_grpc(context))

    @rpc.unary
    async def Delete(self, request: objects_pb2.DeleteObjectRequest,
                     context: Context) -> objects_pb2.DeleteObjectResponse:
        return await self._ops.delete(request, Call.from_grpc(context))

    @rpc.unary
    async def List(self, request: objects_pb2.ListObjectsRequest,
                   context: Context) -> objects_pb2.ListObjectsResponse:
        return await self._ops.list(request, Call.from_grpc(context))

    @rpc.unary
    async def ListRevisions(self, request: objects_pb2.ListObjectRevisionsRequest,
                            context: Context) -> objects_pb2.ListObjectRevisionsResponse:
        return await self._ops.revisions(request, Call.from_grpc(context))
