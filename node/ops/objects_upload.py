"""One put of an object, and the collection of chunks no live revision names.

An `Upload` publishes its marker with its first chunks (one batch), then the other chunks (a
bounded number in flight), and hands back
the metadata to publish once the content is complete and its SHA-256 checked. It never publishes
the metadata itself: ObjectOps does, and from then on the upload's chunks are never removed on a
failure (a metadata publish that failed may still have been stored; the sweep decides later).

Every publish of an upload carries a msg_id of its own (`<upload>.c<index>` for a chunk,
`<upload>.m<n>` for the marker's n-th publish), so a publish refused with a retryable status
(UNAVAILABLE: the bucket failing over, a forward that failed) is tried again (`again`) and stored
once even when the refused attempt was stored after all: a failover in the middle of a large put
costs a pause, not the put.

The marker of an upload is fenced: the upload re-publishes it with `expected_last_subject_seq`
(every limits.object_marker_refresh_s, and before its metadata is published when it is that
old), and the sweep takes it over the same way before it removes anything. Whichever comes
first wins: an upload whose marker the sweep took fails with UPLOAD_ABANDONED and publishes no
metadata; a marker the upload refreshed is not idle, so the sweep leaves it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import objects_layout as layout
from raftlog.node.ops.batches import expand_results
from raftlog.node.ops.objects_layout import ObjectMeta
from raftlog.node.ops.streams import StreamOps
from raftlog.node.transport.calls import Call
from raftlog.v1 import streams_pb2, types_pb2

log = logging.getLogger(__name__)
T = TypeVar("T")


async def again(attempt: Callable[[], Awaitable[T]], *, what: str, attempts: int,
                pause_s: float, pause_max_s: float, statuses: frozenset[str] = frozenset(
                    {"UNAVAILABLE"}), via: Call | None = None) -> T:
    """`attempt()`, tried again while it is refused with one of `statuses`: at most `attempts`
    times in all, after a pause from `pause_s` that doubles up to `pause_max_s`, and never past
    the deadline of `via`. The last refusal is raised. Only for attempts that are idempotent."""
    for number in range(1, attempts + 1):
        try:
            return await attempt()
        except RaftlogError as err:
            remaining_s = None if via is None else via.remaining_s()
            if err.status_name not in statuses or number == attempts or \
                    (remaining_s is not None and remaining_s <= pause_s):
                raise
            log.info("%s refused (%s); again in %.2f s", what, err.message, pause_s)
        await asyncio.sleep(pause_s)
        pause_s = min(2 * pause_s, pause_max_s)
    raise AssertionError("unreachable: the last attempt returns or raises")


async def retried(attempt: Callable[[], Awaitable[T]], *, what: str, via: Call) -> T:
    """`again` with the limits of the object store's calls (limits.object_retry_*): a put's
    publishes and reads, a get's chunk reads."""
    return await again(attempt, what=what, attempts=limits.object_retry_attempts_max,
                       pause_s=limits.object_retry_backoff_s,
                       pause_max_s=limits.object_retry_backoff_max_s, via=via)


class Upload:
    """Chunks of one put on the bucket's stream; `finish` or `abort` ends it."""

    def __init__(self, streams: StreamOps, clock: Clock, *, bucket: str, name: str,
                 chunk_bytes: int, headers: tuple[tuple[str, str], ...], via: Call) -> None:
        self.upload = secrets.token_hex(12)
        self._streams = streams
        self._clock = clock
        self._bucket = bucket
        self._stream = layout.bucket_stream(bucket)
        self._name = name
        self._chunk_bytes = chunk_bytes
        self._headers = headers
        self._via = via
        self._hasher = hashlib.sha256()
        self._rechunker = layout.Rechunker(chunk_bytes)
        self._inflight: set[asyncio.Task[Any]] = set()  # publishes not yet answered
        self._size = 0
        self._count = 0
        self._marker_seq = 0
        self._marked_at_s = 0.0
        self._published = False  # anything sent (stored or maybe stored)
        self._first: list[bytes] | None = []  # the chunks the marker goes with; None once sent
        self._marks = 0  # publishes of the marker so far

    async def add(self, data: bytes) -> None:
        for chunk in self._rechunker.add(data):
            await self._send(chunk)

    async def finish(self, *, sha256: str) -> ObjectMeta:
        """Sends the last chunk, waits for every chunk, checks the hash; the metadata to store."""
        rest = self._rechunker.rest()
        if rest:
            await self._send(rest)
        if self._first:
            await self._send_first()
        while self._inflight:
            await self._wait_one()
        digest = self._hasher.hexdigest()
        if sha256 and sha256 != digest:
            raise RaftlogError(Reason.SHA_MISMATCH, f"the content of {self._name!r} hashes to "
                               f"{digest}, not to the sha256 given ({sha256})",
                               expected=sha256, actual=digest)
        if self._first is None and \
                self._clock.monotonic_s() - self._marked_at_s > limits.object_marker_refresh_s:
            await self._mark()  # fences the sweep out before the metadata names the chunks
        return ObjectMeta(name=self._name, size=self._size,
                          chunk_size=self._chunk_bytes if self._size else 0,
                          chunk_count=self._count, sha256=digest, upload=self.upload,
                          headers=self._headers)

    async def abort(self) -> None:
        """Waits for the chunks in flight, then removes what was stored (best effort: what
        stays behind is the sweep's). Not cancelled: a chunk forwarded to the primary may be
        stored after its caller gave up, and would come after the removal."""
        await asyncio.gather(*self._inflight, return_exceptions=True)
        self._inflight.clear()
        if self._published:
            await remove_upload(self._streams, bucket=self._bucket, upload=self.upload,
                                via=Call())

    async def _send(self, chunk: bytes) -> None:
        self._hasher.update(chunk)
        index = self._count
        self._count += 1
        self._size += len(chunk)
        if self._first is not None:
            self._first.append(chunk)
            if len(self._first) >= limits.object_first_batch_chunks_max:
                await self._send_first()
            return
        while len(self._inflight) >= limits.object_put_inflight_max:
            await self._wait_one()
        request = streams_pb2.PublishRequest(
            stream=self._stream, subject=layout.chunk_subject(self._bucket, self.upload, index),
            payload=chunk, msg_id=f"{self.upload}.c{index}")
        self._inflight.add(asyncio.create_task(self._publish(request, what=f"chunk {index}")))
        if self._clock.monotonic_s() - self._marked_at_s > limits.object_marker_refresh_s:
            await self._mark()

    async def _send_first(self) -> None:
        """The marker and the first chunks in one batch: the marker is stored first, and a
        small object takes one round trip for all its chunks."""
        chunks, self._first = self._first or [], None
        marker = streams_pb2.PublishEntry(
            subject=layout.marker_subject(self._bucket, self.upload),
            payload=layout.encode_marker(name=self._name, started_ms=self._clock.wall_ms()),
            expected_last_subject_seq=0, msg_id=self._marker_msg_id())
        request = streams_pb2.PublishBatchRequest(stream=self._stream, entries=[marker, *(
            streams_pb2.PublishEntry(
                subject=layout.chunk_subject(self._bucket, self.upload, index), payload=data,
                msg_id=f"{self.upload}.c{index}")
            for index, data in enumerate(chunks))])

        async def attempt() -> list[streams_pb2.PublishResult]:
            results = expand_results(await self._streams.publish_batch(request, self._via))
            for result in results:
                if result.HasField("error"):
                    error = result.error
                    raise RaftlogError(Reason.__members__.get(error.reason, Reason.INTERNAL),
                                       error.message, **dict(error.metadata))
            return results

        self._published = True
        batch = asyncio.create_task(self._again(attempt, what="the marker and first chunks"))
        self._inflight.add(batch)  # abort waits for it, also when this call is cancelled
        results = await asyncio.shield(batch)
        self._inflight.discard(batch)
        self._marker_seq = results[0].ack.seq
        self._marked_at_s = self._clock.monotonic_s()

    def _marker_msg_id(self) -> str:
        self._marks += 1
        return f"{self.upload}.m{self._marks}"

    async def _again(self, attempt: Callable[[], Awaitable[T]], *, what: str) -> T:
        return await retried(attempt, what=f"upload {self.upload}: {what}", via=self._via)

    async def _publish(self, request: streams_pb2.PublishRequest, *, what: str
                       ) -> streams_pb2.PublishAck:
        return await self._again(lambda: self._streams.publish(request, self._via), what=what)

    async def _wait_one(self) -> None:
        done, _ = await asyncio.wait(self._inflight, return_when=asyncio.FIRST_COMPLETED)
        self._inflight -= done
        errors = [error for task in done if (error := task.exception()) is not None]
        if errors:
            raise errors[0]  # a failed chunk fails the put

    async def _mark(self) -> None:
        request = streams_pb2.PublishRequest(
            stream=self._stream, subject=layout.marker_subject(self._bucket, self.upload),
            payload=layout.encode_marker(name=self._name, started_ms=self._clock.wall_ms()),
            expected_last_subject_seq=self._marker_seq, msg_id=self._marker_msg_id())
        self._published = True
        try:
            ack = await self._publish(request, what="the marker")
        except RaftlogError as err:
            if err.reason is not Reason.WRONG_LAST_SUBJECT_SEQ:
                raise
            raise RaftlogError(Reason.UPLOAD_ABANDONED, f"the put of {self._name!r} was idle "
                               f"past {limits.object_upload_idle_s} s and its chunks were "
                               "collected; put it again", upload=self.upload) from None
        self._marker_seq = ack.seq
        self._marked_at_s = self._clock.monotonic_s()


async def remove_upload(streams: StreamOps, *, bucket: str, upload: str, via: Call) -> None:
    """Purges an upload's chunks and its marker. A purge refused with a retryable reason (no
    leader, the bucket failing over, a forward that failed) is tried again, up to
    limits.object_cleanup_attempts_max times in all; a failure after that is logged and what
    stays is the sweep's."""
    stream = layout.bucket_stream(bucket)

    async def purge() -> None:
        for subject in (layout.chunks_pattern(bucket, upload),
                        layout.marker_subject(bucket, upload)):
            await streams.purge(streams_pb2.PurgeStreamRequest(name=stream, subject=subject), via)

    try:
        await again(purge, what=f"bucket {bucket}: removing the chunks of upload {upload}",
                    attempts=limits.object_cleanup_attempts_max,
                    pause_s=limits.object_cleanup_backoff_s,
                    pause_max_s=limits.object_cleanup_backoff_max_s,
                    statuses=frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"}))
    except RaftlogError as err:
        if err.reason is not Reason.STREAM_NOT_FOUND:  # else the bucket went with them
            log.warning("bucket %s: chunks of upload %s stay for the sweep: %s", bucket,
                        upload, err.message)


SWEEP_SHARDS = 16  # the first hex digit of an upload id: a sweep looks at one at a time


async def sweep_bucket(streams: StreamOps, clock: Clock, *, bucket: str, shard: int,
                       via: Call) -> int:
    """Removes the uploads of one bucket whose id starts with hex digit `shard`, whose marker
    is idle past limits.object_upload_idle_s and which no live revision names; returns how
    many. Looks at limits.object_sweep_markers_max markers at most."""
    stream = layout.bucket_stream(bucket)
    listed = await streams.list_subjects(streams_pb2.ListSubjectsByPrefixRequest(
        stream=stream, prefix=layout.marker_prefix(bucket) + f"{shard:x}",
        limit=limits.object_sweep_markers_max), via)
    removed = 0
    for summary in listed.subjects:
        upload = summary.subject[len(layout.marker_prefix(bucket)):]
        if await _maybe_collect(streams, clock, bucket=bucket, upload=upload, via=via):
            removed += 1
    return removed


async def _maybe_collect(streams: StreamOps, clock: Clock, *, bucket: str, upload: str,
                         via: Call) -> bool:
    stream = layout.bucket_stream(bucket)
    subject = layout.marker_subject(bucket, upload)
    try:
        marker = await streams.read_latest(streams_pb2.ReadLatestAtSubjectRequest(
            stream=stream, subject=subject), via)
    except RaftlogError as err:
        if err.reason is Reason.MESSAGE_NOT_FOUND:
            return False  # removed since it was listed
        raise
    if clock.wall_ms() - marker.ts_ms < limits.object_upload_idle_s * 1000:
        return False
    name = layout.decode_marker(marker.payload)
    if name and await _is_live(streams, bucket=bucket, name=name, upload=upload, via=via):
        return False
    taken = streams_pb2.PublishRequest(stream=stream, subject=subject, payload=marker.payload,
                                       expected_last_subject_seq=marker.seq)
    try:
        await streams.publish(taken, via)  # the upload cannot publish its metadata any more
    except RaftlogError as err:
        if err.reason is Reason.WRONG_LAST_SUBJECT_SEQ:
            return False  # the upload is alive after all
        raise
    if name and await _is_live(streams, bucket=bucket, name=name, upload=upload, via=via):
        return False
    await remove_upload(streams, bucket=bucket, upload=upload, via=via)
    log.info("bucket %s: collected the chunks of upload %s (%r)", bucket, upload, name)
    return True


async def _is_live(streams: StreamOps, *, bucket: str, name: str, upload: str,
                   via: Call) -> bool:
    try:
        subject = layout.meta_subject(bucket, name)
    except RaftlogError:
        return False  # not a name a put could have made
    try:
        message: types_pb2.Message = await streams.read_latest(
            streams_pb2.ReadLatestAtSubjectRequest(stream=layout.bucket_stream(bucket),
                                                   subject=subject), via)
    except RaftlogError as err:
        if err.reason is Reason.MESSAGE_NOT_FOUND:
            return False
        raise
    try:
        return layout.decode_meta(message.payload).upload == upload
    except RaftlogError:
        return False
