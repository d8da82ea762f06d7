"""The Waymaker API's KV service (waymaker.streams.WaymakerKvService) on the client port: each
call becomes the canonical raftlog.v1 KV request, handed to the same KV operations as raftlog.v1
KV (node/ops/kv.py), and the answer goes back in the seed's messages. A bucket made through
either API is the same bucket (stream `KV_<bucket>`), revisions are the same numbers.

The seed defines the messages but not this service (it says the RPCs moved to a
WaymakerKvService in a file it does not hold): the method names are raftlog's, see
protos/raftlog/compat/waymaker_kv.proto and docs/waymaker.md ("KV and collections").

What differs from raftlog.v1 KV, in the seed's words:
- absence is an answer, not an error: Get of a key with no live value is success with `entry`
  unset; History of a key with no stored revision is success with no entries;
- a bucket made here keeps limits.kv_history_max revisions per key (the seed has no history
  setting and offers History); `ephemeral` is accepted, the bucket is durable all the same;
- Keys lists tombstoned (and expired) keys too, flagged `deleted`; a bucket with more keys than
  one listing holds answers "too_large" rather than a part of them;
- a watch of one key takes that key literally (no patterns); it sends the live values, then
  every change; a delete, purge or passed TTL is a `delete` event.

Errors: a RaftlogError becomes `success=false` with a result_code (waymaker_codes, Family.KV);
retryable conditions stay gRPC statuses, as in waymaker.py; Watch's errors are statuses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.compat import waymaker_kv_pb2_grpc
from raftlog.compat import waymaker_streams_pb2 as wm
from raftlog.node.api.waymaker_answer import answered
from raftlog.node.api.waymaker_codes import TOO_LARGE, Family
from raftlog.node.ops import kv_entries
from raftlog.node.ops.kv import KVOps
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.v1 import kv_pb2

Context = grpc.aio.ServicerContext[Any, Any]

_DELETED = frozenset({kv_pb2.KV_OPERATION_DELETE, kv_pb2.KV_OPERATION_PURGE})


# ---------------------------------------------------------------------------- conversions

def bucket_config_in(request: wm.KvCreateBucketRequest) -> kv_pb2.KvBucketConfig:
    """The raftlog.v1 bucket for a seed CreateBucket: the seed's limits, the most history."""
    return kv_pb2.KvBucketConfig(bucket=request.bucket, history=limits.kv_history_max,
                                 max_bytes=request.max_bytes,
                                 max_value_size=request.max_value_size,
                                 max_age_ms=request.max_age_ms)


def history_entry_out(entry: kv_pb2.KvEntry) -> wm.KvHistoryEntry:
    """A stored revision; a delete or purge marker is `deleted` with no value."""
    deleted = entry.operation in _DELETED
    return wm.KvHistoryEntry(value=b"" if deleted else entry.value, revision=entry.revision,
                             ts_ms=entry.ts_ms, deleted=deleted)


def watch_event_out(event: kv_pb2.KvWatchEvent) -> wm.KvWatchEvent | None:
    """A raftlog watch event as the seed's: a value is `put`; a delete or purge marker is
    `delete` at its revision; a value whose TTL passed is `delete` at that value's revision,
    stamped with its expiry; `caught_up` has no counterpart (None)."""
    if event.WhichOneof("event") != "entry":
        return None
    entry = event.entry
    if entry.operation == kv_pb2.KV_OPERATION_PUT:
        return wm.KvWatchEvent(put=wm.KvPutEvent(key=entry.key, value=entry.value,
                                                 revision=entry.revision, ts_ms=entry.ts_ms))
    expired = entry.operation == kv_pb2.KV_OPERATION_EXPIRED
    return wm.KvWatchEvent(delete=wm.KvDeleteEvent(
        key=entry.key, revision=entry.revision,
        ts_ms=entry.expires_ms if expired else entry.ts_ms))


def _revision_of(err: RaftlogError) -> int:
    """The key's current revision a WRONG_REVISION or KEY_EXISTS names (0 when none)."""
    try:
        return int(err.metadata.get("revision", "0"))
    except ValueError:
        return 0


# ---------------------------------------------------------------------------- the service

class WaymakerKv(waymaker_kv_pb2_grpc.WaymakerKvServiceServicer):
    def __init__(self, ops: KVOps) -> None:
        self._ops = ops

    @answered(wm.KvCreateBucketResponse, Family.KV)
    async def CreateBucket(self, request: wm.KvCreateBucketRequest,
                           context: Context) -> wm.KvCreateBucketResponse:
        via = Call.from_grpc(context)
        # raftlog.v1 accepts a repeated create with equal settings; the seed's create does not.
        try:
            await self._ops.bucket_info(kv_pb2.KvGetBucketInfoRequest(bucket=request.bucket), via)
        except RaftlogError as err:
            if err.reason != Reason.BUCKET_NOT_FOUND:
                raise
        else:
            raise RaftlogError(Reason.BUCKET_EXISTS, f"bucket {request.bucket!r} exists",
                               bucket=request.bucket)
        await self._ops.create_bucket(kv_pb2.KvCreateBucketRequest(
            config=bucket_config_in(request)), via)
        return wm.KvCreateBucketResponse()

    @answered(wm.KvDeleteBucketResponse, Family.KV)
    async def DeleteBucket(self, request: wm.KvDeleteBucketRequest,
                           context: Context) -> wm.KvDeleteBucketResponse:
        await self._ops.delete_bucket(kv_pb2.KvDeleteBucketRequest(bucket=request.bucket),
                                      Call.from_grpc(context))
        return wm.KvDeleteBucketResponse()

    async def _written(self, write: Any) -> wm.KvPutResponse:
        """A write's revision; a refused compare-and-set carries the key's current one."""
        try:
            written = await write
        except RaftlogError as err:
            if err.reason not in (Reason.WRONG_REVISION, Reason.KEY_EXISTS):
                raise
            code = "wrong_revision" if err.reason == Reason.WRONG_REVISION else "already_exists"
            return wm.KvPutResponse(success=False, result_code=code, message=err.message,
                                    revision=_revision_of(err))
        return wm.KvPutResponse(revision=written.revision)

    @answered(wm.KvPutResponse, Family.KV)
    async def Put(self, request: wm.KvPutRequest, context: Context) -> wm.KvPutResponse:
        return await self._written(self._ops.put(kv_pb2.KvPutRequest(
            bucket=request.bucket, key=request.key, value=request.value,
            ttl_ms=request.ttl_ms), Call.from_grpc(context)))

    @answered(wm.KvPutResponse, Family.KV)
    async def Create(self, request: wm.KvCreateRequest, context: Context) -> wm.KvPutResponse:
        return await self._written(self._ops.create(kv_pb2.KvCreateRequest(
            bucket=request.bucket, key=request.key, value=request.value,
            ttl_ms=request.ttl_ms), Call.from_grpc(context)))

    @answered(wm.KvPutResponse, Family.KV)
    async def Update(self, request: wm.KvUpdateRequest, context: Context) -> wm.KvPutResponse:
        return await self._written(self._ops.update(kv_pb2.KvUpdateRequest(
            bucket=request.bucket, key=request.key, value=request.value,
            revision=request.expected_revision, ttl_ms=request.ttl_ms),
            Call.from_grpc(context)))

    @answered(wm.KvPutResponse, Family.KV)
    async def Touch(self, request: wm.KvTouchRequest, context: Context) -> wm.KvPutResponse:
        return await self._written(self._ops.touch(kv_pb2.KvTouchRequest(
            bucket=request.bucket, key=request.key, ttl_ms=request.ttl_ms),
            Call.from_grpc(context)))

    @answered(wm.KvGetResponse, Family.KV)
    async def Get(self, request: wm.KvGetRequest, context: Context) -> wm.KvGetResponse:
        try:
            entry = await self._ops.get(kv_pb2.KvGetRequest(bucket=request.bucket,
                                                            key=request.key),
                                        Call.from_grpc(context))
        except RaftlogError as err:
            if err.reason != Reason.KEY_NOT_FOUND:
                raise
            return wm.KvGetResponse()
        return wm.KvGetResponse(entry=wm.KvEntry(value=entry.value, revision=entry.revision,
                                                 ts_ms=entry.ts_ms))

    @answered(wm.KvDeleteResponse, Family.KV)
    async def Delete(self, request: wm.KvDeleteRequest,
                     context: Context) -> wm.KvDeleteResponse:
        written = await self._ops.delete(kv_pb2.KvDeleteRequest(bucket=request.bucket,
                                                                key=request.key),
                                         Call.from_grpc(context))
        return wm.KvDeleteResponse(revision=written.revision)

    @answered(wm.KvKeysResponse, Family.KV)
    async def Keys(self, request: wm.KvKeysRequest, context: Context) -> wm.KvKeysResponse:
        listed = await self._ops.keys(kv_pb2.KvKeysRequest(
            bucket=request.bucket, limit=limits.list_subjects_limit_max, include_deleted=True),
            Call.from_grpc(context))
        if listed.truncated:
            return wm.KvKeysResponse(
                success=False, result_code=TOO_LARGE,
                message=f"bucket {request.bucket!r} holds more than "
                        f"{limits.list_subjects_limit_max} keys, more than one answer lists; "
                        "raftlog.v1 KV.Keys lists them by pattern")
        return wm.KvKeysResponse(entries=[
            wm.KvKeyEntry(key=entry.key, revision=entry.revision, deleted=entry.deleted)
            for entry in listed.keys])

    @answered(wm.KvHistoryResponse, Family.KV)
    async def History(self, request: wm.KvHistoryRequest,
                      context: Context) -> wm.KvHistoryResponse:
        limit = min(request.limit, limits.scan_limit_max)
        try:
            found = await self._ops.history(kv_pb2.KvHistoryRequest(
                bucket=request.bucket, key=request.key, from_revision=request.from_revision,
                limit=limit), Call.from_grpc(context))
        except RaftlogError as err:
            if err.reason != Reason.KEY_NOT_FOUND:
                raise
            return wm.KvHistoryResponse()
        return wm.KvHistoryResponse(entries=[history_entry_out(e) for e in found.entries])

    @rpc.server_stream
    async def Watch(self, request: wm.KvWatchRequest,
                    context: Context) -> AsyncIterator[wm.KvWatchEvent]:
        if request.key:  # one key, taken literally: no pattern
            kv_entries.validate_key(request.key, bucket=request.bucket)
        watch = self._ops.watch(kv_pb2.KvWatchRequest(bucket=request.bucket, key=request.key),
                                Call.from_grpc(context))
        async for event in watch:
            converted = watch_event_out(event)
            if converted is not None:
                yield converted
