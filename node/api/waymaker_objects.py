"""The Waymaker API's nine object-store RPCs, served by the same object operations as raftlog.v1
Objects (node/ops/objects.py): each request is translated into the canonical raftlog.v1 one and
the answer back. WaymakerService (waymaker.py) serves them through its `extra` handlers
(`WaymakerObjects(ops).handlers()`).

The seed names a bucket's stream `obj:<bucket>`; here it is raftlog's bucket stream `OBJ_<bucket>`,
so a bucket made with raftlog.v1 Objects.CreateBucket or `raftlog obj add` is the one these RPCs
use (the seed has no RPC that makes a bucket; a put to a missing one is "no_such_bucket").

Errors: the seed's result codes ("no_such_bucket", "no_such_object", "incomplete",
"sha_mismatch", "internal"); retryable conditions (UNAVAILABLE ...) stay gRPC statuses, as in
waymaker.py. The streamed get has no result code: its errors are gRPC statuses, a content that
does not hash to its sha256 ends it with ABORTED. `dedupe=true` is refused ("invalid_config"):
raftlog does not share chunks between objects.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from raftlog.base import limits
from raftlog.base.errors import ERROR_DOMAIN, RaftlogError, Reason
from raftlog.compat import waymaker_streams_pb2 as wm
from raftlog.node.api.waymaker_codes import OK, Family, result_code
from raftlog.node.ops.objects import ObjectOps
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.v1 import objects_pb2, types_pb2

Context = grpc.aio.ServicerContext[Any, Any]
Handler = Callable[[Any, Context], Awaitable[Any]]

NO_SUCH_BUCKET = "no_such_bucket"
NO_SUCH_OBJECT = "no_such_object"
INCOMPLETE = "incomplete"
SHA_MISMATCH = "sha_mismatch"
_CODES = {
    Reason.BUCKET_NOT_FOUND: NO_SUCH_BUCKET,
    Reason.OBJECT_NOT_FOUND: NO_SUCH_OBJECT,
    Reason.OBJECT_INCOMPLETE: INCOMPLETE,
    Reason.OBJECT_CHANGED: INCOMPLETE,  # replaced while read: the revision is gone
    Reason.UPLOAD_ABANDONED: "internal",
    Reason.SHA_MISMATCH: SHA_MISMATCH,
    Reason.OBJECT_CORRUPT: SHA_MISMATCH,
    Reason.OBJECT_TOO_LARGE: "internal",  # its message points at GetObjectStream
}


def _code(reason: Reason) -> str | None:
    return _CODES.get(reason) or result_code(Family.STREAM, reason)


def answered(response: type[Any]) -> Callable[[Handler], Handler]:
    """A unary object call: a RaftlogError becomes `success=false` and its result code."""
    def wrap(method: Handler) -> Handler:
        @functools.wraps(method)
        async def call(request: Any, context: Context) -> Any:
            try:
                reply = await method(request, context)
            except RaftlogError as err:
                code = _code(err.reason)
                if code is None:
                    raise
                return response(success=False, result_code=code, message=err.message)
            reply.success, reply.result_code = True, OK
            return reply
        return rpc_unary(call)
    return wrap


def rpc_unary(call: Handler) -> Handler:
    """`rpc.unary` for a plain function (it wraps servicer methods)."""
    wrapped = rpc.unary(lambda _self, request, context: call(request, context))
    return functools.partial(wrapped, None)


def _info_out(info: objects_pb2.ObjectInfo) -> wm.ObjectInfo:
    return wm.ObjectInfo(name=info.name, total_bytes=info.size, chunk_size=info.chunk_size,
                         chunk_count=info.chunk_count, sha256=info.sha256, ts_ms=info.ts_ms,
                         headers=[wm.MessageHeader(key=h.key, value=h.value)
                                  for h in info.headers],
                         metadata_seq=info.revision)


def _headers_in(headers: Any) -> list[types_pb2.Header]:
    return [types_pb2.Header(key=h.key, value=h.value) for h in headers]


def _refuse_dedupe(dedupe: bool) -> None:
    if dedupe:
        raise RaftlogError(Reason.INVALID_ARGUMENT, "dedupe=true is not supported: raftlog "
                           "stores each object's chunks on their own (put without dedupe)")


def _aborted(err: RaftlogError) -> grpc.Status:
    """The seed's status for a streamed get whose content does not hash: ABORTED, with
    raftlog's ErrorInfo."""
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=err.reason.name, domain=ERROR_DOMAIN,
                                            metadata=err.metadata))
    return rpc_status.to_status(status_pb2.Status(
        code=code_pb2.ABORTED, message=f"{SHA_MISMATCH}: {err.message}", details=[detail]))


class WaymakerObjects:
    def __init__(self, ops: ObjectOps) -> None:
        self._ops = ops

    def handlers(self) -> dict[str, Callable[..., Any]]:
        """WaymakerService's `extra`: method name -> handler `(request, context)`."""
        return {
            "PutObject": answered(wm.PutObjectResponse)(self.put),
            "GetObject": answered(wm.GetObjectResponse)(self.get),
            "DeleteObject": answered(wm.DeleteObjectResponse)(self.delete),
            "GetObjectInfo": answered(wm.GetObjectInfoResponse)(self.info),
            "ListObjects": answered(wm.ListObjectsResponse)(self.list),
            "PutObjectStream": answered(wm.PutObjectResponse)(self.put_stream),
            "GetObjectStream": self.get_stream,
            "ListObjectRevisions": answered(wm.ListObjectRevisionsResponse)(self.revisions),
            "GetObjectRange": answered(wm.GetObjectRangeResponse)(self.get_range),
        }

    async def put(self, request: wm.PutObjectRequest, context: Context) -> wm.PutObjectResponse:
        _refuse_dedupe(request.dedupe)
        info = await self._ops.put(objects_pb2.PutObjectRequest(
            bucket=request.bucket, name=request.name, payload=request.payload,
            chunk_size=request.chunk_size, headers=_headers_in(request.headers),
            sha256=request.sha256), Call.from_grpc(context))
        return wm.PutObjectResponse(info=_info_out(info))

    async def put_stream(self, frames: AsyncIterator[wm.PutObjectStreamFrame],
                         context: Context) -> wm.PutObjectResponse:
        info = await self._ops.put_stream(_canonical_frames(frames), Call.from_grpc(context))
        return wm.PutObjectResponse(info=_info_out(info))

    async def get(self, request: wm.GetObjectRequest, context: Context) -> wm.GetObjectResponse:
        reply = await self._ops.get(objects_pb2.GetObjectRequest(
            bucket=request.bucket, name=request.name), Call.from_grpc(context))
        return wm.GetObjectResponse(info=_info_out(reply.info), payload=reply.payload)

    async def get_stream(self, request: wm.GetObjectRequest, context: Context
                         ) -> AsyncIterator[wm.GetObjectStreamFrame]:
        frames = self._ops.get_stream(objects_pb2.GetObjectRequest(
            bucket=request.bucket, name=request.name), Call.from_grpc(context))
        try:
            async for frame in frames:
                if frame.WhichOneof("frame") == "info":
                    yield wm.GetObjectStreamFrame(info=_info_out(frame.info))
                else:
                    yield wm.GetObjectStreamFrame(data=frame.data)
        except (RaftlogError, Exception) as exc:
            if isinstance(exc, grpc.aio.AbortError | grpc.RpcError):
                raise
            if isinstance(exc, RaftlogError) and exc.reason is Reason.OBJECT_CORRUPT:
                await context.abort_with_status(_aborted(exc))
            await rpc.abort(context, exc)
        yield wm.GetObjectStreamFrame(done=True)

    async def delete(self, request: wm.DeleteObjectRequest,
                     context: Context) -> wm.DeleteObjectResponse:
        """The seed's delete has no "no_such_object": deleting an object that is not there is
        "ok" with tombstone_seq 0 (nothing is written)."""
        try:
            reply = await self._ops.delete(objects_pb2.DeleteObjectRequest(
                bucket=request.bucket, name=request.name), Call.from_grpc(context))
        except RaftlogError as err:
            if err.reason is not Reason.OBJECT_NOT_FOUND:
                raise
            return wm.DeleteObjectResponse(message=err.message)
        return wm.DeleteObjectResponse(tombstone_seq=reply.revision)

    async def info(self, request: wm.GetObjectInfoRequest,
                   context: Context) -> wm.GetObjectInfoResponse:
        """A tombstone is "ok" with deleted=true and no info; a name never put is
        "no_such_object"."""
        info = await self._ops.info(objects_pb2.GetObjectInfoRequest(
            bucket=request.bucket, name=request.name, include_deleted=True),
            Call.from_grpc(context))
        if info.deleted:
            return wm.GetObjectInfoResponse(deleted=True)
        return wm.GetObjectInfoResponse(info=_info_out(info))

    async def list(self, request: wm.ListObjectsRequest,
                   context: Context) -> wm.ListObjectsResponse:
        reply = await self._ops.list(objects_pb2.ListObjectsRequest(
            bucket=request.bucket, prefix=request.name_prefix,
            include_deleted=request.include_deleted, limit=limits.object_list_limit_max),
            Call.from_grpc(context))
        return wm.ListObjectsResponse(entries=[
            wm.ObjectListEntry(name=info.name, total_bytes=info.size, deleted=info.deleted)
            for info in reply.objects])

    async def revisions(self, request: wm.ListObjectRevisionsRequest,
                        context: Context) -> wm.ListObjectRevisionsResponse:
        limit = min(request.limit, limits.object_revisions_limit_max)
        reply = await self._ops.revisions(objects_pb2.ListObjectRevisionsRequest(
            bucket=request.bucket, name=request.name, from_revision=request.from_seq,
            limit=limit), Call.from_grpc(context))
        return wm.ListObjectRevisionsResponse(revisions=[
            wm.ObjectRevisionEntry(metadata_seq=info.revision, deleted=info.deleted,
                                   total_bytes=info.size, chunk_count=info.chunk_count,
                                   sha256=info.sha256, ts_ms=info.ts_ms)
            for info in reply.revisions])

    async def get_range(self, request: wm.GetObjectRangeRequest,
                        context: Context) -> wm.GetObjectRangeResponse:
        """`len` 0 reads to the end (the seed's field comment; its RPC comment says an empty
        payload instead: docs/objects.md)."""
        canonical = objects_pb2.GetObjectRangeRequest(bucket=request.bucket, name=request.name,
                                                      offset=request.offset)
        if request.len:
            canonical.length = request.len
        reply = await self._ops.get_range(canonical, Call.from_grpc(context))
        return wm.GetObjectRangeResponse(info=_info_out(reply.info), actual_offset=reply.offset,
                                         payload=reply.payload)


async def _canonical_frames(frames: AsyncIterator[wm.PutObjectStreamFrame]
                            ) -> AsyncIterator[objects_pb2.PutObjectFrame]:
    """The seed's frames as raftlog.v1's. The seed's frames are its chunk boundaries: with
    chunk_size 0 the chunk size is the first data frame's length (the default when that is
    larger than a chunk may be), and frames are cut to it."""
    stream = aiter(frames)
    first = await anext(stream, None)
    while first is not None and first.ByteSize() == 0:  # frames with nothing set are skipped
        first = await anext(stream, None)
    if first is None or not first.HasField("start"):
        raise RaftlogError(Reason.INVALID_ARGUMENT, "the first frame of a put must set start")
    start = first.start
    _refuse_dedupe(start.dedupe)
    held = [first]  # frames read before the chunk size is known
    chunk_bytes = start.chunk_size
    frame: wm.PutObjectStreamFrame | None = first
    while not chunk_bytes and frame is not None and not frame.data and not frame.finish:
        frame = await anext(stream, None)
        if frame is not None:
            held.append(frame)
    if not chunk_bytes and frame is not None and frame.data:
        chunk_bytes = len(frame.data)
        if chunk_bytes > limits.object_chunk_bytes_max:
            chunk_bytes = limits.object_chunk_bytes_default
    yield objects_pb2.PutObjectFrame(start=objects_pb2.PutObjectStart(
        bucket=start.bucket, name=start.name, chunk_size=chunk_bytes,
        headers=_headers_in(start.headers), sha256=start.sha256))

    async def rest() -> AsyncIterator[wm.PutObjectStreamFrame]:
        for frame in held:
            yield frame
        async for frame in stream:
            yield frame

    async for frame in rest():
        if frame is not first and frame.HasField("start"):
            raise RaftlogError(Reason.INVALID_ARGUMENT, "a second frame sets start")
        if frame.data:
            yield objects_pb2.PutObjectFrame(data=frame.data)
        if frame.finish:
            yield objects_pb2.PutObjectFrame(finish=objects_pb2.PutObjectFinish())
            return
