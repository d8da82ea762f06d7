"""The Waymaker API's collections service (waymaker.streams.WaymakerCollectionsService) on the
client port: hash, set and queue stores, each call handed as the canonical raftlog.v1 request to
the same collection operations as raftlog.v1 Collections (node/ops/collections.py), so a store
made through either API is the same one (stream HASH_<name>, SET_<name>, QUEUE_<name>).

The seed defines the messages but not this service (it says the RPCs moved to a
WaymakerCollectionsService in a file it does not hold): the method names are raftlog's, see
protos/raftlog/compat/waymaker_collections.proto and docs/waymaker.md ("KV and collections").

What differs from raftlog.v1 Collections, in the seed's words:
- absence is an answer: HashGet of a field with no value and QueuePop of an empty queue answer
  success with `value` unset (a pop does not wait);
- HashGetAll, HashFields and SetMembers answer every field or member, or "too_large" for a key
  with more than limits.collection_list_limit_max of them (never a part of them);
- QueueRange answers at most limits.queue_peek_limit_max values (a larger limit is read as
  that; 0 asks for limits.queue_peek_limit_default); its reply has no sequences;
- a key, field or member that is empty or too long is "invalid_key".

Errors: a RaftlogError becomes `success=false` with a result_code (waymaker_codes,
Family.COLLECTIONS); retryable conditions stay gRPC statuses, as in waymaker.py.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

import grpc

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.compat import waymaker_collections_pb2_grpc
from raftlog.compat import waymaker_streams_pb2 as wm
from raftlog.node.api.waymaker_answer import answered
from raftlog.node.api.waymaker_codes import TOO_LARGE, Family
from raftlog.node.ops.collections import CollectionOps
from raftlog.node.transport.calls import Call
from raftlog.v1 import collections_pb2 as pb

Context = grpc.aio.ServicerContext[Any, Any]
T = TypeVar("T")

HASH = pb.COLLECTION_KIND_HASH
SET = pb.COLLECTION_KIND_SET
QUEUE = pb.COLLECTION_KIND_QUEUE
# The request fields whose bad value is a bad key rather than a bad config.
_KEY_FIELDS = frozenset({"key", "field", "member"})


def key_error(err: RaftlogError) -> RaftlogError:
    """INVALID_ARGUMENT about a key, field or member as INVALID_KEY; any other error as is."""
    if err.reason == Reason.INVALID_ARGUMENT and err.metadata.get("field") in _KEY_FIELDS:
        return RaftlogError(Reason.INVALID_KEY, err.message, **err.metadata)
    return err


async def _keyed(call: Awaitable[T]) -> T:
    try:
        return await call
    except RaftlogError as err:
        raise key_error(err) from None


def too_large(what: str, *, bucket: str, key: str) -> dict[str, Any]:
    """The fields of an answer refused because the key holds more than one answer lists."""
    return {"success": False, "result_code": TOO_LARGE,
            "message": f"key {key!r} of {bucket!r} holds more than "
                       f"{limits.collection_list_limit_max} {what}, more than one answer lists"}


class WaymakerCollections(waymaker_collections_pb2_grpc.WaymakerCollectionsServiceServicer):
    def __init__(self, ops: CollectionOps) -> None:
        self._ops = ops

    async def _create(self, kind: pb.CollectionKind.ValueType, name: str, via: Call, *,
                      max_bytes: int, ephemeral: bool, max_messages: int = 0) -> None:
        """A new store; one that exists is refused whatever its settings (raftlog.v1's create
        accepts a repeat with equal settings, the seed's does not)."""
        try:
            await self._ops.info(pb.GetCollectionInfoRequest(kind=kind, name=name), via)
        except RaftlogError as err:
            if err.reason != Reason.COLLECTION_NOT_FOUND:
                raise
        else:
            raise RaftlogError(Reason.COLLECTION_EXISTS, f"{name!r} exists", collection=name)
        await self._ops.create(pb.CreateCollectionRequest(
            kind=kind, name=name, max_bytes=max_bytes, max_messages=max_messages,
            ephemeral=ephemeral), via)

    async def _delete(self, kind: pb.CollectionKind.ValueType, name: str, via: Call) -> None:
        await self._ops.delete(pb.DeleteCollectionRequest(kind=kind, name=name), via)

    # ------------------------------------------------------------------------------- hash

    @answered(wm.CreateHashStoreResponse, Family.COLLECTIONS)
    async def CreateHashStore(self, request: wm.CreateHashStoreRequest,
                              context: Context) -> wm.CreateHashStoreResponse:
        await self._create(HASH, request.name, Call.from_grpc(context),
                           max_bytes=request.max_bytes, ephemeral=request.ephemeral)
        return wm.CreateHashStoreResponse()

    @answered(wm.DeleteHashStoreResponse, Family.COLLECTIONS)
    async def DeleteHashStore(self, request: wm.DeleteHashStoreRequest,
                              context: Context) -> wm.DeleteHashStoreResponse:
        await self._delete(HASH, request.name, Call.from_grpc(context))
        return wm.DeleteHashStoreResponse()

    @answered(wm.HashSetResponse, Family.COLLECTIONS)
    async def HashSet(self, request: wm.HashSetRequest, context: Context) -> wm.HashSetResponse:
        written = await _keyed(self._ops.set_field(pb.SetHashFieldRequest(
            collection=request.bucket, key=request.hash_key, field=request.field,
            value=request.value), Call.from_grpc(context)))
        return wm.HashSetResponse(revision=written.revision)

    @answered(wm.HashGetResponse, Family.COLLECTIONS)
    async def HashGet(self, request: wm.HashGetRequest, context: Context) -> wm.HashGetResponse:
        try:
            entry = await _keyed(self._ops.get_field(pb.HashFieldRequest(
                collection=request.bucket, key=request.hash_key, field=request.field),
                Call.from_grpc(context)))
        except RaftlogError as err:
            if err.reason != Reason.FIELD_NOT_FOUND:
                raise
            return wm.HashGetResponse()
        return wm.HashGetResponse(value=entry.value, revision=entry.revision)

    @answered(wm.HashExistsResponse, Family.COLLECTIONS)
    async def HashExists(self, request: wm.HashExistsRequest,
                         context: Context) -> wm.HashExistsResponse:
        found = await _keyed(self._ops.field_exists(pb.HashFieldRequest(
            collection=request.bucket, key=request.hash_key, field=request.field),
            Call.from_grpc(context)))
        return wm.HashExistsResponse(exists=found.exists)

    @answered(wm.HashDeleteResponse, Family.COLLECTIONS)
    async def HashDelete(self, request: wm.HashDeleteRequest,
                         context: Context) -> wm.HashDeleteResponse:
        await _keyed(self._ops.delete_field(pb.HashFieldRequest(
            collection=request.bucket, key=request.hash_key, field=request.field),
            Call.from_grpc(context)))
        return wm.HashDeleteResponse()

    def _whole_key(self, bucket: str, key: str) -> pb.HashKeyRequest:
        return pb.HashKeyRequest(collection=bucket, key=key,
                                 limit=limits.collection_list_limit_max)

    @answered(wm.HashGetAllResponse, Family.COLLECTIONS)
    async def HashGetAll(self, request: wm.HashGetAllRequest,
                         context: Context) -> wm.HashGetAllResponse:
        found = await _keyed(self._ops.get_hash(self._whole_key(request.bucket, request.hash_key),
                                                Call.from_grpc(context)))
        if found.truncated:
            return wm.HashGetAllResponse(**too_large("fields", bucket=request.bucket,
                                                     key=request.hash_key))
        return wm.HashGetAllResponse(entries=[
            wm.HashFieldEntry(field=e.field, value=e.value, revision=e.revision)
            for e in found.entries])

    @answered(wm.HashFieldsResponse, Family.COLLECTIONS)
    async def HashFields(self, request: wm.HashFieldsRequest,
                         context: Context) -> wm.HashFieldsResponse:
        found = await _keyed(self._ops.list_fields(
            self._whole_key(request.bucket, request.hash_key), Call.from_grpc(context)))
        if found.truncated:
            return wm.HashFieldsResponse(**too_large("fields", bucket=request.bucket,
                                                     key=request.hash_key))
        return wm.HashFieldsResponse(fields=found.fields)

    @answered(wm.HashLenResponse, Family.COLLECTIONS)
    async def HashLen(self, request: wm.HashLenRequest, context: Context) -> wm.HashLenResponse:
        counted = await _keyed(self._ops.count_fields(pb.HashKeyRequest(
            collection=request.bucket, key=request.hash_key), Call.from_grpc(context)))
        return wm.HashLenResponse(count=counted.count)

    # -------------------------------------------------------------------------------- set

    @answered(wm.CreateSetStoreResponse, Family.COLLECTIONS)
    async def CreateSetStore(self, request: wm.CreateSetStoreRequest,
                             context: Context) -> wm.CreateSetStoreResponse:
        await self._create(SET, request.name, Call.from_grpc(context),
                           max_bytes=request.max_bytes, ephemeral=request.ephemeral)
        return wm.CreateSetStoreResponse()

    @answered(wm.DeleteSetStoreResponse, Family.COLLECTIONS)
    async def DeleteSetStore(self, request: wm.DeleteSetStoreRequest,
                             context: Context) -> wm.DeleteSetStoreResponse:
        await self._delete(SET, request.name, Call.from_grpc(context))
        return wm.DeleteSetStoreResponse()

    def _member(self, bucket: str, key: str, member: str) -> pb.SetMemberRequest:
        return pb.SetMemberRequest(collection=bucket, key=key, member=member)

    @answered(wm.SetAddResponse, Family.COLLECTIONS)
    async def SetAdd(self, request: wm.SetAddRequest, context: Context) -> wm.SetAddResponse:
        await _keyed(self._ops.add_member(
            self._member(request.bucket, request.set_key, request.member),
            Call.from_grpc(context)))
        return wm.SetAddResponse()

    @answered(wm.SetRemoveResponse, Family.COLLECTIONS)
    async def SetRemove(self, request: wm.SetRemoveRequest,
                        context: Context) -> wm.SetRemoveResponse:
        await _keyed(self._ops.remove_member(
            self._member(request.bucket, request.set_key, request.member),
            Call.from_grpc(context)))
        return wm.SetRemoveResponse()

    @answered(wm.SetIsMemberResponse, Family.COLLECTIONS)
    async def SetIsMember(self, request: wm.SetIsMemberRequest,
                          context: Context) -> wm.SetIsMemberResponse:
        found = await _keyed(self._ops.is_member(
            self._member(request.bucket, request.set_key, request.member),
            Call.from_grpc(context)))
        return wm.SetIsMemberResponse(is_member=found.is_member)

    @answered(wm.SetMembersResponse, Family.COLLECTIONS)
    async def SetMembers(self, request: wm.SetMembersRequest,
                         context: Context) -> wm.SetMembersResponse:
        found = await _keyed(self._ops.list_members(pb.SetKeyRequest(
            collection=request.bucket, key=request.set_key,
            limit=limits.collection_list_limit_max), Call.from_grpc(context)))
        if found.truncated:
            return wm.SetMembersResponse(**too_large("members", bucket=request.bucket,
                                                     key=request.set_key))
        return wm.SetMembersResponse(members=found.members)

    @answered(wm.SetLenResponse, Family.COLLECTIONS)
    async def SetLen(self, request: wm.SetLenRequest, context: Context) -> wm.SetLenResponse:
        counted = await _keyed(self._ops.count_members(pb.SetKeyRequest(
            collection=request.bucket, key=request.set_key), Call.from_grpc(context)))
        return wm.SetLenResponse(count=counted.count)

    # ------------------------------------------------------------------------------ queue

    @answered(wm.CreateQueueResponse, Family.COLLECTIONS)
    async def CreateQueue(self, request: wm.CreateQueueRequest,
                          context: Context) -> wm.CreateQueueResponse:
        await self._create(QUEUE, request.name, Call.from_grpc(context),
                           max_bytes=request.max_bytes, max_messages=request.max_messages,
                           ephemeral=request.ephemeral)
        return wm.CreateQueueResponse()

    @answered(wm.DeleteQueueResponse, Family.COLLECTIONS)
    async def DeleteQueue(self, request: wm.DeleteQueueRequest,
                          context: Context) -> wm.DeleteQueueResponse:
        await self._delete(QUEUE, request.name, Call.from_grpc(context))
        return wm.DeleteQueueResponse()

    @answered(wm.QueuePushResponse, Family.COLLECTIONS)
    async def QueuePush(self, request: wm.QueuePushRequest,
                        context: Context) -> wm.QueuePushResponse:
        pushed = await self._ops.push(pb.PushQueueRequest(collection=request.bucket,
                                                          value=request.value),
                                      Call.from_grpc(context))
        return wm.QueuePushResponse(sequence=pushed.sequence)

    @answered(wm.QueuePopResponse, Family.COLLECTIONS)
    async def QueuePop(self, request: wm.QueuePopRequest,
                       context: Context) -> wm.QueuePopResponse:
        try:
            item = await self._ops.pop(pb.PopQueueRequest(collection=request.bucket),
                                       Call.from_grpc(context))
        except RaftlogError as err:
            if err.reason != Reason.QUEUE_EMPTY:
                raise
            return wm.QueuePopResponse()
        return wm.QueuePopResponse(value=item.value)

    @answered(wm.QueueRangeResponse, Family.COLLECTIONS)
    async def QueueRange(self, request: wm.QueueRangeRequest,
                         context: Context) -> wm.QueueRangeResponse:
        peeked = await self._ops.peek(pb.PeekQueueRequest(
            collection=request.bucket, from_sequence=request.from_sequence,
            limit=min(request.limit, limits.queue_peek_limit_max)), Call.from_grpc(context))
        return wm.QueueRangeResponse(values=[item.value for item in peeked.items])

    @answered(wm.QueueLenResponse, Family.COLLECTIONS)
    async def QueueLen(self, request: wm.QueueLenRequest,
                       context: Context) -> wm.QueueLenResponse:
        counted = await self._ops.count(pb.CountQueueRequest(collection=request.bucket),
                                        Call.from_grpc(context))
        return wm.QueueLenResponse(count=counted.count)
