"""The raftlog.v1 KV service: each call handed to the KV operations (node/ops/kv.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from raftlog.node.ops.kv import KVOps
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.v1 import kv_pb2, kv_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]


class KVService(kv_pb2_grpc.KVServicer):
    def __init__(self, ops: KVOps) -> None:
        self._ops = ops

    @rpc.unary
    async def CreateBucket(self, request: kv_pb2.KvCreateBucketRequest,
                           context: Context) -> kv_pb2.KvBucketInfo:
        return await self._ops.create_bucket(request, Call.from_grpc(context))

    @rpc.unary
    async def DeleteBucket(self, request: kv_pb2.KvDeleteBucketRequest,
                           context: Context) -> kv_pb2.KvDeleteBucketResponse:
        return await self._ops.delete_bucket(request, Call.from_grpc(context))

    @rpc.unary
    async def GetBucketInfo(self, request: kv_pb2.KvGetBucketInfoRequest,
                            context: Context) -> kv_pb2.KvBucketInfo:
        return await self._ops.bucket_info(request, Call.from_grpc(context))

    @rpc.unary
    async def ListBuckets(self, request: kv_pb2.KvListBucketsRequest,
                          context: Context) -> kv_pb2.KvListBucketsResponse:
        return await self._ops.list_buckets(request, Call.from_grpc(context))

    @rpc.unary
    async def Put(self, request: kv_pb2.KvPutRequest,
                  context: Context) -> kv_pb2.KvWriteResponse:
        return await self._ops.put(request, Call.from_grpc(context))

    @rpc.unary
    async def Create(self, request: kv_pb2.KvCreateRequest,
                     context: Context) -> kv_pb2.KvWriteResponse:
        return await self._ops.create(request, Call.from_grpc(context))

    @rpc.unary
    async def Update(self, request: kv_pb2.KvUpdateRequest,
                     context: Context) -> kv_pb2.KvWriteResponse:
        return await self._ops.update(request, Call.from_grpc(context))

    @rpc.unary
    async def Get(self, request: kv_pb2.KvGetRequest, context: Context) -> kv_pb2.KvEntry:
        return await self._ops.get(request, Call.from_grpc(context))

    @rpc.unary
    async def Delete(self, request: kv_pb2.KvDeleteRequest,
                     context: Context) -> kv_pb2.KvWriteResponse:
        return await self._ops.delete(request, Call.from_grpc(context))

    @rpc.unary
    async def Purge(self, request: kv_pb2.KvPurgeRequest,
                    context: Context) -> kv_pb2.KvPurgeResponse:
        return await self._ops.purge(request, Call.from_grpc(context))

    @rpc.unary
    async def Keys(self, request: kv_pb2.KvKeysRequest,
                   context: Context) -> kv_pb2.KvKeysResponse:
        return await self._ops.keys(request, Call.from_grpc(context))

    @rpc.unary
    async def History(self, request: kv_pb2.KvHistoryRequest,
                      context: Context) -> kv_pb2.KvHistoryResponse:
        return await self._ops.history(request, Call.from_grpc(context))

    @rpc.unary
    async def Touch(self, request: kv_pb2.KvTouchRequest,
                    context: Context) -> kv_pb2.KvWriteResponse:
        return await self._ops.touch(request, Call.from_grpc(context))

    @rpc.server_stream
    async def Watch(self, request: kv_pb2.KvWatchRequest,
                    context: Context) -> AsyncIterator[kv_pb2.KvWatchEvent]:
        async for event in self._ops.watch(request, Call.from_grpc(context)):
            yield event
