"""Object store operations, whatever protocol asked: buckets of named objects, each bucket one
stream laid out as objects_layout.py says. Built only on the stream operations (StreamOps), so a
call works on a node on its own and on any member of a cluster: every publish and read goes to
the bucket's primary, forwarded when it is elsewhere, and survives its failover like any other.

A put publishes its upload marker and its chunks (objects_upload.py), then the metadata message
that makes the revision live, then removes the chunks of the revision it replaced. A delete
publishes a tombstone, then removes the chunks of the revision it replaced. Chunks nothing names
any more (a put that failed, was cut off, or whose node died) are removed by the put itself when
it can, else by the sweep on the bucket's primary (`ObjectSweeper`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import itertools
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, NoReturn

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import objects_layout as layout
from raftlog.node.ops.objects_layout import ObjectMeta
from raftlog.node.ops.objects_upload import (
    SWEEP_SHARDS,
    Upload,
    remove_upload,
    retried,
    sweep_bucket,
)
from raftlog.node.ops.streams import StreamOps
from raftlog.node.transport.calls import Call
from raftlog.v1 import objects_pb2, streams_pb2, types_pb2

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _bucket_errors(bucket: str) -> Iterator[None]:
    """A missing stream, or one not laid out as a bucket, is a missing bucket."""
    try:
        yield
    except RaftlogError as err:
        if err.reason is Reason.STREAM_NOT_FOUND:
            raise RaftlogError(Reason.BUCKET_NOT_FOUND, f"bucket {bucket!r} does not exist",
                               bucket=bucket) from None
        if err.reason is Reason.SUBJECT_NOT_IN_STREAM:
            raise RaftlogError(Reason.BUCKET_NOT_FOUND, f"stream "
                               f"{layout.bucket_stream(bucket)!r} is not an object bucket",
                               bucket=bucket) from None
        raise


def _limit(value: int, *, default: int, maximum: int) -> int:
    if value > maximum:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"limit may be at most {maximum}",
                           limit=maximum)
    return value or default


def object_info(bucket: str, meta: ObjectMeta, *, revision: int, ts_ms: int
                ) -> objects_pb2.ObjectInfo:
    return objects_pb2.ObjectInfo(
        bucket=bucket, name=meta.name, size=meta.size, chunk_size=meta.chunk_size,
        chunk_count=meta.chunk_count, sha256=meta.sha256, ts_ms=ts_ms,
        headers=[types_pb2.Header(key=k, value=v) for k, v in meta.headers],
        revision=revision, deleted=meta.deleted)


def _headers(headers: list[types_pb2.Header] | None) -> tuple[tuple[str, str], ...]:
    if headers is None:
        return ()
    if len(headers) > limits.headers_count_max:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"more than {limits.headers_count_max} "
                           "headers", limit=limits.headers_count_max)
    for header in headers:
        if len(header.key.encode()) + len(header.value.encode()) > limits.header_bytes_max:
            raise RaftlogError(Reason.INVALID_ARGUMENT, f"header {header.key!r} is longer "
                               f"than {limits.header_bytes_max} bytes",
                               limit=limits.header_bytes_max)
    return tuple((header.key, header.value) for header in headers)


class ObjectOps:
    def __init__(self, streams: StreamOps, *, clock: Clock) -> None:
        self._streams = streams
        self._clock = clock
        self._cleanups: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ buckets

    async def create_bucket(self, request: objects_pb2.CreateBucketRequest, via: Call
                            ) -> objects_pb2.BucketInfo:
        bucket = request.config.name
        config = types_pb2.StreamConfig(
            name=layout.bucket_stream(bucket), subjects=[layout.bucket_subjects(bucket)],
            replicas=request.config.replicas, description=request.config.description)
        try:
            info = await self._streams.create(
                streams_pb2.CreateStreamRequest(config=config), via)
        except RaftlogError as err:
            if err.reason is Reason.STREAM_EXISTS:
                raise RaftlogError(Reason.BUCKET_EXISTS, f"bucket {bucket!r} exists",
                                   bucket=bucket) from None
            raise
        return self._bucket_info(bucket, info)

    async def delete_bucket(self, request: objects_pb2.DeleteBucketRequest, via: Call
                            ) -> objects_pb2.DeleteBucketResponse:
        await self.bucket_info(request.name, via)  # refuses a stream that is no bucket
        with _bucket_errors(request.name):
            await self._streams.delete(
                streams_pb2.DeleteStreamRequest(name=layout.bucket_stream(request.name)), via)
        return objects_pb2.DeleteBucketResponse()

    async def bucket_info(self, bucket: str, via: Call) -> objects_pb2.BucketInfo:
        with _bucket_errors(bucket):
            info = await self._streams.info(
                streams_pb2.GetStreamInfoRequest(name=layout.bucket_stream(bucket)), via)
        if layout.bucket_of_stream(info.config.name, info.config.subjects) != bucket:
            raise RaftlogError(Reason.BUCKET_NOT_FOUND, f"stream {info.config.name!r} is not "
                               "an object bucket", bucket=bucket)
        return self._bucket_info(bucket, info)

    async def list_buckets(self, request: objects_pb2.ListBucketsRequest, via: Call
                           ) -> objects_pb2.ListBucketsResponse:
        listed = await self._streams.list(
            streams_pb2.ListStreamsRequest(prefix=layout.STREAM_PREFIX), via)
        buckets = []
        for info in listed.streams:
            bucket = layout.bucket_of_stream(info.config.name, info.config.subjects)
            if bucket is not None:
                buckets.append(self._bucket_info(bucket, info))
        return objects_pb2.ListBucketsResponse(buckets=buckets)

    @staticmethod
    def _bucket_info(bucket: str, info: types_pb2.StreamInfo) -> objects_pb2.BucketInfo:
        return objects_pb2.BucketInfo(
            config=objects_pb2.BucketConfig(name=bucket, replicas=info.config.replicas,
                                            description=info.config.description),
            stream=info.config.name, messages=info.state.messages, bytes=info.state.bytes,
            created_ms=info.created_ms)

    # ------------------------------------------------------------------ put

    async def put(self, request: objects_pb2.PutObjectRequest, via: Call
                  ) -> objects_pb2.ObjectInfo:
        start = objects_pb2.PutObjectStart(bucket=request.bucket, name=request.name,
                                           chunk_size=request.chunk_size,
                                           headers=request.headers, sha256=request.sha256)

        async def frames() -> AsyncIterator[objects_pb2.PutObjectFrame]:
            yield objects_pb2.PutObjectFrame(start=start)
            yield objects_pb2.PutObjectFrame(data=request.payload)
            yield objects_pb2.PutObjectFrame(finish=objects_pb2.PutObjectFinish())

        return await self.put_stream(frames(), via)

    async def put_stream(self, frames: AsyncIterator[objects_pb2.PutObjectFrame], via: Call
                         ) -> objects_pb2.ObjectInfo:
        """A start frame, data frames, a finish frame (frames with nothing set are skipped);
        anything else stores nothing."""
        frames = _set_frames(frames)
        first = await anext(aiter(frames), None)
        if first is None or first.WhichOneof("frame") != "start":
            raise RaftlogError(Reason.INVALID_ARGUMENT, "the first frame of a put must be start")
        start = first.start
        layout.validate_bucket(start.bucket)
        layout.encode_name(start.name)
        upload = Upload(self._streams, self._clock, bucket=start.bucket, name=start.name,
                        chunk_bytes=layout.chunk_size(start.chunk_size),
                        headers=_headers(list(start.headers)), via=via)
        start_sha = layout.check_sha256(start.sha256)
        committing = False
        earlier = asyncio.create_task(retried(  # the revision this put replaces
            lambda: self._latest(start.bucket, start.name, via),
            what=f"bucket {start.bucket}: the read of {start.name!r}", via=via))
        try:
            with _bucket_errors(start.bucket):
                finish = await self._receive(upload, frames)
                sha = self._finish_sha(start_sha, finish)
                previous = await earlier  # read before the new revision exists
                meta = await upload.finish(sha256=sha)
                committing = True  # from here on a failure may have stored the revision
                ack = await self._publish_meta(start.bucket, meta, via)
        except BaseException:
            earlier.cancel()
            earlier.add_done_callback(_retrieved)
            if not committing:
                self._cleanup_later(upload.abort())
            raise
        if previous is not None:
            self._forget(start.bucket, previous[0])
        return object_info(start.bucket, meta, revision=ack.seq,
                           ts_ms=await self._stored_ts_ms(start.bucket, ack.seq, via))

    async def _stored_ts_ms(self, bucket: str, seq: int, via: Call) -> int:
        """The stamp the primary gave the metadata message, which every later read reports;
        this node's clock only if the message cannot be read back (the bucket failing over)."""
        try:
            message = await self._streams.get_message(streams_pb2.GetMessageRequest(
                stream=layout.bucket_stream(bucket), seq=seq), via)
        except RaftlogError as err:
            log.info("the revision %d of bucket %r was not read back (%s); its time is this "
                     "node's", seq, bucket, err.message)
            return self._clock.wall_ms()
        return message.ts_ms

    @staticmethod
    async def _receive(upload: Upload, frames: AsyncIterator[objects_pb2.PutObjectFrame]
                       ) -> objects_pb2.PutObjectFinish:
        async for frame in frames:
            kind = frame.WhichOneof("frame")
            if kind == "data":
                await upload.add(frame.data)
            elif kind == "finish":
                finish: objects_pb2.PutObjectFinish = frame.finish
                if await anext(aiter(frames), None) is not None:
                    raise RaftlogError(Reason.INVALID_ARGUMENT, "a frame after finish")
                return finish
            else:
                raise RaftlogError(Reason.INVALID_ARGUMENT, f"a second {kind} frame")
        raise RaftlogError(Reason.INVALID_ARGUMENT, "the put ended without a finish frame; "
                           "nothing was stored")

    @staticmethod
    def _finish_sha(start_sha: str, finish: objects_pb2.PutObjectFinish) -> str:
        finish_sha = layout.check_sha256(finish.sha256)
        if start_sha and finish_sha and start_sha != finish_sha:
            raise RaftlogError(Reason.SHA_MISMATCH, "the start and finish frames name "
                               "different sha256 values", start=start_sha, finish=finish_sha)
        return start_sha or finish_sha

    async def _publish_meta(self, bucket: str, meta: ObjectMeta, via: Call
                            ) -> streams_pb2.PublishAck:
        """A revision's metadata (a put's, or a delete's tombstone), tried again while refused
        as UNAVAILABLE: its msg_id, the put's upload or one drawn for the delete, stores it
        once (as an upload's chunks, objects_upload.py)."""
        msg_id = f"{meta.upload}.meta" if meta.upload else f"delete.{secrets.token_hex(12)}"
        request = streams_pb2.PublishRequest(
            stream=layout.bucket_stream(bucket), subject=layout.meta_subject(bucket, meta.name),
            payload=layout.encode_meta(meta), msg_id=msg_id)
        return await retried(lambda: self._streams.publish(request, via),
                             what=f"bucket {bucket}: the revision {msg_id} of {meta.name!r}",
                             via=via)

    def _forget(self, bucket: str, previous: ObjectMeta) -> None:
        """Removes the chunks of a revision that is no longer live, after the answer."""
        if not previous.deleted and previous.upload:
            self._cleanup_later(remove_upload(self._streams, bucket=bucket,
                                              upload=previous.upload, via=Call()))

    def _cleanup_later(self, cleanup: Coroutine[Any, Any, None]) -> None:
        """Runs a removal on its own task: it outlives a call the client cancelled."""
        task = asyncio.create_task(cleanup)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def cleanups_done(self, *, timeout_s: float | None = None) -> None:
        """Waits for the removals started so far (tests; shutdown, for at most `timeout_s`,
        then stops them: what they leave is the sweep's)."""
        if not self._cleanups:
            return
        _, running = await asyncio.wait(set(self._cleanups), timeout=timeout_s)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    # ------------------------------------------------------------------ reads

    async def _latest(self, bucket: str, name: str, via: Call
                      ) -> tuple[ObjectMeta, types_pb2.Message] | None:
        """The latest metadata of an object (a tombstone included), or None."""
        subject = layout.meta_subject(bucket, name)
        with _bucket_errors(bucket):
            try:
                message = await self._streams.read_latest(streams_pb2.ReadLatestAtSubjectRequest(
                    stream=layout.bucket_stream(bucket), subject=subject), via)
            except RaftlogError as err:
                if err.reason is Reason.MESSAGE_NOT_FOUND:
                    return None
                raise
        return layout.decode_meta(message.payload), message

    async def _live(self, bucket: str, name: str, via: Call,
                    *, include_deleted: bool = False) -> tuple[ObjectMeta, types_pb2.Message]:
        layout.validate_bucket(bucket)
        found = await self._latest(bucket, name, via)
        if found is None or (found[0].deleted and not include_deleted):
            raise RaftlogError(Reason.OBJECT_NOT_FOUND, f"bucket {bucket!r} has no object "
                               f"{name!r}", bucket=bucket, name=name,
                               deleted=found is not None)
        return found

    async def info(self, request: objects_pb2.GetObjectInfoRequest, via: Call
                   ) -> objects_pb2.ObjectInfo:
        meta, message = await self._live(request.bucket, request.name, via,
                                         include_deleted=request.include_deleted)
        return object_info(request.bucket, meta, revision=message.seq, ts_ms=message.ts_ms)

    async def get(self, request: objects_pb2.GetObjectRequest, via: Call
                  ) -> objects_pb2.GetObjectResponse:
        meta, message = await self._live(request.bucket, request.name, via)
        _check_unary(meta.size, what="object")
        whole = layout.byte_range(offset=0, length=meta.size, size=meta.size,
                                  chunk_bytes=meta.chunk_size)
        payload = b"".join([data async for data in self._chunks(request.bucket, meta, whole,
                                                                 message.seq, via)])
        _check_sha(meta, layout.sha256_hex(payload))
        return objects_pb2.GetObjectResponse(
            info=object_info(request.bucket, meta, revision=message.seq, ts_ms=message.ts_ms),
            payload=payload)

    async def get_stream(self, request: objects_pb2.GetObjectRequest, via: Call
                         ) -> AsyncIterator[objects_pb2.GetObjectFrame]:
        meta, message = await self._live(request.bucket, request.name, via)
        yield objects_pb2.GetObjectFrame(info=object_info(
            request.bucket, meta, revision=message.seq, ts_ms=message.ts_ms))
        whole = layout.byte_range(offset=0, length=meta.size, size=meta.size,
                                  chunk_bytes=meta.chunk_size)
        hasher = hashlib.sha256()
        async for data in self._chunks(request.bucket, meta, whole, message.seq, via):
            hasher.update(data)
            yield objects_pb2.GetObjectFrame(data=data)
        _check_sha(meta, hasher.hexdigest())

    async def get_range(self, request: objects_pb2.GetObjectRangeRequest, via: Call
                        ) -> objects_pb2.GetObjectRangeResponse:
        meta, message = await self._live(request.bucket, request.name, via)
        length = request.length if request.HasField("length") else meta.size
        span = layout.byte_range(offset=request.offset, length=length, size=meta.size,
                                 chunk_bytes=meta.chunk_size)
        _check_unary(span.end - span.start, what="range")
        payload = b"".join([data async for data in self._chunks(request.bucket, meta, span,
                                                                 message.seq, via)])
        return objects_pb2.GetObjectRangeResponse(
            info=object_info(request.bucket, meta, revision=message.seq, ts_ms=message.ts_ms),
            offset=span.start, payload=payload)

    async def _chunks(self, bucket: str, meta: ObjectMeta, span: layout.ByteRange,
                      revision: int, via: Call) -> AsyncIterator[bytes]:
        """The bytes of `span`, chunk by chunk, with a few chunk reads running ahead."""
        ahead: collections.deque[tuple[int, asyncio.Task[bytes]]] = collections.deque()
        next_index = span.first_chunk
        try:
            while next_index <= span.last_chunk or ahead:
                while next_index <= span.last_chunk and \
                        len(ahead) < limits.object_get_prefetch_max:
                    ahead.append((next_index, asyncio.create_task(
                        self._chunk(bucket, meta, next_index, revision, via))))
                    next_index += 1
                index, task = ahead.popleft()
                yield span.slice_of(index, meta.chunk_size, await task)
        finally:
            for _, task in ahead:
                task.cancel()

    async def _chunk(self, bucket: str, meta: ObjectMeta, index: int, revision: int,
                     via: Call) -> bytes:
        request = streams_pb2.ReadLatestAtSubjectRequest(
            stream=layout.bucket_stream(bucket),
            subject=layout.chunk_subject(bucket, meta.upload, index))
        try:
            with _bucket_errors(bucket):  # a get goes on across a failover, as a put does
                message = await retried(lambda: self._streams.read_latest(request, via),
                                        what=f"bucket {bucket}: chunk {index} of {meta.name!r}",
                                        via=via)
        except RaftlogError as err:
            if err.reason is not Reason.MESSAGE_NOT_FOUND:
                raise
            await self._missing_chunk(bucket, meta, index, revision, via)
        if len(message.payload) != layout.chunk_length(meta, index):
            raise RaftlogError(Reason.OBJECT_CORRUPT, f"chunk {index} of {meta.name!r} holds "
                               f"{len(message.payload)} bytes, not "
                               f"{layout.chunk_length(meta, index)}", revision=revision)
        return message.payload

    async def _missing_chunk(self, bucket: str, meta: ObjectMeta, index: int, revision: int,
                             via: Call) -> NoReturn:
        latest = await self._latest(bucket, meta.name, via)
        if latest is None or latest[1].seq != revision:
            raise RaftlogError(Reason.OBJECT_CHANGED, f"{meta.name!r} was replaced or deleted "
                               f"while it was read (revision {revision}); read it again",
                               revision=revision)
        raise RaftlogError(Reason.OBJECT_INCOMPLETE, f"chunk {index} of {meta.name!r} "
                           f"(revision {revision}) is missing", revision=revision, chunk=index)

    # ------------------------------------------------------------------ delete, lists

    async def delete(self, request: objects_pb2.DeleteObjectRequest, via: Call
                     ) -> objects_pb2.DeleteObjectResponse:
        previous, _ = await self._live(request.bucket, request.name, via)
        with _bucket_errors(request.bucket):
            ack = await self._publish_meta(request.bucket,
                                           ObjectMeta(name=request.name, deleted=True), via)
        self._forget(request.bucket, previous)
        return objects_pb2.DeleteObjectResponse(revision=ack.seq)

    async def list(self, request: objects_pb2.ListObjectsRequest, via: Call
                   ) -> objects_pb2.ListObjectsResponse:
        layout.validate_bucket(request.bucket)
        limit = _limit(request.limit, default=limits.object_list_limit_default,
                       maximum=limits.object_list_limit_max)
        prefix = layout.meta_prefix(request.bucket) + layout.encode_prefix(request.prefix)
        with _bucket_errors(request.bucket):
            await self.bucket_info(request.bucket, via)
            listed = await self._streams.list_subjects(streams_pb2.ListSubjectsByPrefixRequest(
                stream=layout.bucket_stream(request.bucket), prefix=prefix,
                limit=limits.list_subjects_limit_max), via)
        names = [name for name in (_name_of(request.bucket, summary.subject)
                                   for summary in listed.subjects) if name]
        found: list[objects_pb2.ObjectInfo] = []
        for start in range(0, len(names), limits.object_list_reads_max):
            batch = names[start:start + limits.object_list_reads_max]
            latest = await asyncio.gather(*(self._latest(request.bucket, name, via)
                                            for name in batch))
            for entry in latest:
                if entry is not None and (request.include_deleted or not entry[0].deleted):
                    found.append(object_info(request.bucket, entry[0], revision=entry[1].seq,
                                             ts_ms=entry[1].ts_ms))
            if len(found) > limit:
                break
        return objects_pb2.ListObjectsResponse(
            objects=found[:limit], truncated=len(found) > limit or listed.truncated)

    async def revisions(self, request: objects_pb2.ListObjectRevisionsRequest, via: Call
                        ) -> objects_pb2.ListObjectRevisionsResponse:
        layout.validate_bucket(request.bucket)
        limit = _limit(request.limit, default=limits.object_revisions_limit_default,
                       maximum=limits.object_revisions_limit_max)
        with _bucket_errors(request.bucket):
            scanned = await self._streams.scan_subject(streams_pb2.ScanExactAtSubjectRequest(
                stream=layout.bucket_stream(request.bucket),
                subject=layout.meta_subject(request.bucket, request.name),
                from_seq=request.from_revision, limit=limit), via)
        return objects_pb2.ListObjectRevisionsResponse(
            revisions=[object_info(request.bucket, layout.decode_meta(message.payload),
                                   revision=message.seq, ts_ms=message.ts_ms)
                       for message in scanned.messages],
            next_revision=scanned.next_seq)

    # ------------------------------------------------------------------ sweep

    async def sweep(self, bucket: str, *, shard: int | None = None) -> int:
        """Collects the abandoned uploads of one bucket (run on its primary): those of one
        shard (the first hex digit of their id), or of every shard."""
        shards = range(SWEEP_SHARDS) if shard is None else [shard]
        collected = 0
        for one in shards:
            collected += await sweep_bucket(self._streams, self._clock, bucket=bucket,
                                            shard=one, via=Call())
        return collected


async def _set_frames(frames: AsyncIterator[objects_pb2.PutObjectFrame]
                      ) -> AsyncIterator[objects_pb2.PutObjectFrame]:
    async for frame in frames:
        if frame.WhichOneof("frame") is not None:
            yield frame


def _retrieved(task: asyncio.Task[Any]) -> None:
    """Marks a task's failure as seen: the call already failed for another reason."""
    if not task.cancelled():
        task.exception()


def _name_of(bucket: str, subject: str) -> str:
    """The object name of a metadata subject; '' for one no put makes (logged)."""
    try:
        return layout.name_of_meta_subject(bucket, subject)
    except RaftlogError as err:
        log.warning("bucket %s: %s", bucket, err.message)
        return ""


def _check_unary(size: int, *, what: str) -> None:
    if size > limits.object_unary_bytes_max:
        raise RaftlogError(Reason.OBJECT_TOO_LARGE, f"the {what} holds {size} bytes, more than "
                           f"one reply carries ({limits.object_unary_bytes_max}); read it with "
                           "GetStream (or smaller ranges)", limit=limits.object_unary_bytes_max,
                           size=size)


def _check_sha(meta: ObjectMeta, digest: str) -> None:
    if digest != meta.sha256:
        raise RaftlogError(Reason.OBJECT_CORRUPT, f"the chunks of {meta.name!r} hash to "
                           f"{digest}, not to its sha256 {meta.sha256}", expected=meta.sha256,
                           actual=digest)


class ObjectSweeper:
    """On every node: each limits.object_sweep_period_s, sweeps one shard of the buckets whose
    primary is this node (`buckets_here`), one bucket after the other, the next shard on the
    next round (every upload is looked at within SWEEP_SHARDS rounds); a failed sweep is
    logged and retried when its shard comes round again."""

    def __init__(self, objects: ObjectOps, *, buckets_here: Callable[[], list[str]]) -> None:
        self._objects = objects
        self._buckets_here = buckets_here
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._objects.cleanups_done(timeout_s=limits.drain_grace_s)

    async def _run(self) -> None:
        for round_number in itertools.count():
            await asyncio.sleep(limits.object_sweep_period_s)
            for bucket in self._buckets_here():
                try:
                    await self._objects.sweep(bucket, shard=round_number % SWEEP_SHARDS)
                except RaftlogError as err:
                    log.warning("bucket %s: sweep failed: %s", bucket, err.message)
                except Exception:  # a bug: logged, and the next round runs
                    log.exception("bucket %s: sweep failed", bucket)
