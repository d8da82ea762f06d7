"""KV buckets, whatever protocol asked: each call becomes stream operations (`StreamOps`) on the
bucket's stream, so a bucket works on a node on its own and in a cluster alike, every call
served by the stream's primary (forwarded there), and revisions (stream seqs) survive failover.

The mapping (kv_entries.py): bucket B is stream `KV_B`, key K subject `$KV.B.K`, a revision is
a seq. Put publishes; Create publishes expecting the key's last seq to be 0, or the seq of its
latest entry when that is a marker or an expired value; Update expects the caller's revision;
Delete and Purge publish markers (Purge then removes the key's older seqs); Touch publishes the
live value again with a new expiry (so its revision changes).

TTLs are lazy: a value past its `KV-Expires-Ms` reads as absent (Get, Keys, Create, Watch), and
is removed from storage only when the key's later revisions push it out of the history, or by
the bucket's max_age_ms, or a Purge. Nothing is written when a TTL passes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from raftlog.base import limits, subjects
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import kv_entries as kv
from raftlog.node.ops.kv_watch import Watch
from raftlog.node.ops.streams import StreamOps
from raftlog.node.transport.calls import Call
from raftlog.v1 import kv_pb2, streams_pb2, types_pb2

T = TypeVar("T")

_MAPPED = {
    Reason.STREAM_NOT_FOUND: Reason.BUCKET_NOT_FOUND,
    Reason.STREAM_EXISTS: Reason.BUCKET_EXISTS,
    Reason.MESSAGE_NOT_FOUND: Reason.KEY_NOT_FOUND,
    Reason.MESSAGE_TOO_LARGE: Reason.VALUE_TOO_LARGE,
}


def kv_error(err: RaftlogError, *, bucket: str, key: str = "") -> RaftlogError:
    """A stream operation's failure in the words of a bucket (other failures as they are)."""
    if err.reason == Reason.WRONG_LAST_SUBJECT_SEQ:
        revision = err.metadata.get("last_subject_seq", "0")
        return RaftlogError(Reason.WRONG_REVISION, f"key {key!r} of bucket {bucket!r} is at "
                            f"revision {revision}", bucket=bucket, key=key, revision=revision)
    reason = _MAPPED.get(err.reason)
    if reason is None:
        return err
    if reason == Reason.BUCKET_NOT_FOUND:
        return RaftlogError(reason, f"no bucket {bucket!r}", bucket=bucket)
    if reason == Reason.BUCKET_EXISTS:
        return RaftlogError(reason, f"bucket {bucket!r} exists", bucket=bucket)
    if reason == Reason.KEY_NOT_FOUND:
        return RaftlogError(reason, f"bucket {bucket!r} has no key {key!r}", bucket=bucket,
                            key=key)
    return RaftlogError(reason, err.message, **err.metadata)


async def mapped(awaitable: Awaitable[T], *, bucket: str, key: str = "") -> T:
    try:
        return await awaitable
    except RaftlogError as err:
        raise kv_error(err, bucket=bucket, key=key) from None


def _key_not_found(bucket: str, key: str, *, revision: int = 0,
                   why: str = "") -> RaftlogError:
    return RaftlogError(Reason.KEY_NOT_FOUND, f"bucket {bucket!r} has no key {key!r}"
                        f"{f' ({why})' if why else ''}", bucket=bucket, key=key,
                        revision=revision)


@dataclass(frozen=True, slots=True)
class _Settings:
    """What a write needs of a bucket, as read at `read_s` (monotonic)."""

    value_size_max: int
    read_s: float


class KVOps:
    def __init__(self, streams: StreamOps, *, clock: Clock) -> None:
        self._streams = streams
        self._clock = clock
        self._settings_cache: dict[str, _Settings] = {}
        self._watches = 0

    # ------------------------------------------------------------------ buckets

    async def create_bucket(self, request: kv_pb2.KvCreateBucketRequest, via: Call
                            ) -> kv_pb2.KvBucketInfo:
        config = kv.stream_config(request.config)
        if config.max_bytes and config.max_msg_bytes > config.max_bytes:
            raise RaftlogError(Reason.INVALID_CONFIG, "max_bytes must be at least max_value_size "
                               f"+ {limits.kv_entry_overhead_bytes}", field="max_bytes")
        bucket = request.config.bucket
        info = await mapped(self._streams.create(
            streams_pb2.CreateStreamRequest(config=config), via), bucket=bucket)
        self._settings_cache.pop(bucket, None)
        return kv.bucket_info(info)

    async def delete_bucket(self, request: kv_pb2.KvDeleteBucketRequest, via: Call
                            ) -> kv_pb2.KvDeleteBucketResponse:
        await self.bucket_info(kv_pb2.KvGetBucketInfoRequest(bucket=request.bucket), via)
        await mapped(self._streams.delete(streams_pb2.DeleteStreamRequest(
            name=kv.stream_name(request.bucket)), via), bucket=request.bucket)
        self._settings_cache.pop(request.bucket, None)
        return kv_pb2.KvDeleteBucketResponse()

    async def bucket_info(self, request: kv_pb2.KvGetBucketInfoRequest, via: Call
                          ) -> kv_pb2.KvBucketInfo:
        bucket = kv.validate_bucket(request.bucket)
        info = await mapped(self._streams.info(streams_pb2.GetStreamInfoRequest(
            name=kv.stream_name(bucket)), via), bucket=bucket)
        if not kv.is_bucket_stream(info.config):
            raise RaftlogError(Reason.BUCKET_NOT_FOUND, f"no bucket {bucket!r} (stream "
                               f"{info.config.name!r} is not a bucket's)", bucket=bucket)
        return kv.bucket_info(info)

    async def list_buckets(self, request: kv_pb2.KvListBucketsRequest, via: Call
                           ) -> kv_pb2.KvListBucketsResponse:
        listed = await self._streams.list(streams_pb2.ListStreamsRequest(
            prefix=kv.STREAM_PREFIX + request.prefix), via)
        return kv_pb2.KvListBucketsResponse(buckets=[
            kv.bucket_info(info) for info in listed.streams if kv.is_bucket_stream(info.config)])

    async def _settings(self, bucket: str, via: Call) -> _Settings:
        """The bucket's settings, read again once older than limits.kv_bucket_cache_ms."""
        now_s = self._clock.monotonic_s()
        cached = self._settings_cache.get(bucket)
        if cached is not None and now_s - cached.read_s < limits.kv_bucket_cache_ms / 1000:
            return cached
        info = await self.bucket_info(kv_pb2.KvGetBucketInfoRequest(bucket=bucket), via)
        if len(self._settings_cache) >= limits.kv_buckets_cached_max:
            self._settings_cache.clear()
        settings = _Settings(value_size_max=int(info.config.max_value_size), read_s=now_s)
        self._settings_cache[bucket] = settings
        return settings

    # ------------------------------------------------------------------ writes

    async def _publish(self, bucket: str, key: str, via: Call, *, value: bytes = b"",
                       headers: Sequence[types_pb2.Header] = (),
                       expected: int | None = None) -> int:
        request = streams_pb2.PublishRequest(stream=kv.stream_name(bucket),
                                             subject=kv.key_subject(bucket, key),
                                             payload=value, headers=headers)
        if expected is not None:
            request.expected_last_subject_seq = expected
        try:
            ack = await self._streams.publish(request, via)
        except RaftlogError as err:
            if err.reason == Reason.STREAM_NOT_FOUND:
                self._settings_cache.pop(bucket, None)
            raise kv_error(err, bucket=bucket, key=key) from None
        return int(ack.seq)

    async def _write_value(self, bucket: str, key: str, value: bytes, ttl: int, via: Call, *,
                           expected: int | None) -> kv_pb2.KvWriteResponse:
        """Writes a value (checked against the bucket's max_value_size) with its expiry."""
        settings = await self._settings(bucket, via)
        size_max = settings.value_size_max or limits.kv_value_bytes_max
        if len(value) > size_max:
            raise RaftlogError(Reason.VALUE_TOO_LARGE, f"value of {len(value)} bytes exceeds "
                               f"the bucket's limit of {size_max}", bucket=bucket,
                               size=len(value), limit=size_max)
        expires = kv.expires_ms(ttl=ttl, now_ms=self._clock.wall_ms())
        revision = await self._publish(bucket, key, via, value=value,
                                       headers=kv.value_headers(expires=expires),
                                       expected=expected)
        return kv_pb2.KvWriteResponse(revision=revision, expires_ms=expires)

    def _checked(self, bucket: str, key: str) -> None:
        kv.validate_bucket(bucket)
        kv.validate_key(key, bucket=bucket)

    async def put(self, request: kv_pb2.KvPutRequest, via: Call) -> kv_pb2.KvWriteResponse:
        self._checked(request.bucket, request.key)
        return await self._write_value(request.bucket, request.key, request.value,
                                       kv.ttl_ms(request.ttl_ms), via, expected=None)

    async def update(self, request: kv_pb2.KvUpdateRequest, via: Call
                     ) -> kv_pb2.KvWriteResponse:
        self._checked(request.bucket, request.key)
        return await self._write_value(request.bucket, request.key, request.value,
                                       kv.ttl_ms(request.ttl_ms), via,
                                       expected=request.revision)

    async def create(self, request: kv_pb2.KvCreateRequest, via: Call
                     ) -> kv_pb2.KvWriteResponse:
        """Only when the key has no live value: expects the key's last revision to be the one
        that says so (none, a marker, an expired value); a race lost to another write reads
        the key again, up to limits.kv_write_attempts_max times."""
        bucket, key = request.bucket, request.key
        self._checked(bucket, key)
        ttl = kv.ttl_ms(request.ttl_ms)
        for attempt in range(1, limits.kv_write_attempts_max + 1):
            latest = await self._latest(bucket, key, via)
            if latest is not None and kv.read_headers(latest).live(self._clock.wall_ms()):
                raise RaftlogError(Reason.KEY_EXISTS, f"key {key!r} of bucket {bucket!r} "
                                   f"exists at revision {latest.seq}", bucket=bucket, key=key,
                                   revision=latest.seq)
            try:
                return await self._write_value(bucket, key, request.value, ttl, via,
                                               expected=0 if latest is None else latest.seq)
            except RaftlogError as err:
                if err.reason != Reason.WRONG_REVISION or attempt == limits.kv_write_attempts_max:
                    raise
        raise RaftlogError(Reason.INTERNAL, "create: no attempt was made")  # range is not empty

    async def delete(self, request: kv_pb2.KvDeleteRequest, via: Call
                     ) -> kv_pb2.KvWriteResponse:
        self._checked(request.bucket, request.key)
        expected = request.revision if request.HasField("revision") else None
        revision = await self._publish(request.bucket, request.key, via,
                                       headers=kv.marker_headers(kv_pb2.KV_OPERATION_DELETE),
                                       expected=expected)
        return kv_pb2.KvWriteResponse(revision=revision)

    async def purge(self, request: kv_pb2.KvPurgeRequest, via: Call) -> kv_pb2.KvPurgeResponse:
        """A purge marker, then every seq of the key below it removed (a write that comes
        between the two is above the marker and stays)."""
        bucket, key = request.bucket, request.key
        self._checked(bucket, key)
        revision = await self._publish(bucket, key, via,
                                       headers=kv.marker_headers(kv_pb2.KV_OPERATION_PURGE))
        purged = await mapped(self._streams.purge(streams_pb2.PurgeStreamRequest(
            name=kv.stream_name(bucket), subject=kv.key_subject(bucket, key),
            below_seq=revision), via), bucket=bucket, key=key)
        return kv_pb2.KvPurgeResponse(revision=revision, purged=purged.purged)

    async def touch(self, request: kv_pb2.KvTouchRequest, via: Call) -> kv_pb2.KvWriteResponse:
        """The live value written again with the new TTL, expecting its revision (a write in
        between makes it read again, up to limits.kv_write_attempts_max times)."""
        bucket, key = request.bucket, request.key
        self._checked(bucket, key)
        ttl = kv.ttl_ms(request.ttl_ms)
        for attempt in range(1, limits.kv_write_attempts_max + 1):
            live = await self._live(bucket, key, via)
            try:
                return await self._write_value(bucket, key, live.payload, ttl, via,
                                               expected=live.seq)
            except RaftlogError as err:
                if err.reason != Reason.WRONG_REVISION or attempt == limits.kv_write_attempts_max:
                    raise
        raise RaftlogError(Reason.INTERNAL, "touch: no attempt was made")  # range is not empty

    # ------------------------------------------------------------------ reads

    async def _latest(self, bucket: str, key: str, via: Call) -> types_pb2.Message | None:
        """The key's latest stored message, whatever it is; None when it has none."""
        try:
            return await self._streams.read_latest(streams_pb2.ReadLatestAtSubjectRequest(
                stream=kv.stream_name(bucket), subject=kv.key_subject(bucket, key)), via)
        except RaftlogError as err:
            if err.reason == Reason.MESSAGE_NOT_FOUND:
                return None
            raise kv_error(err, bucket=bucket, key=key) from None

    async def _live(self, bucket: str, key: str, via: Call) -> types_pb2.Message:
        """The key's live value, or KEY_NOT_FOUND (with the revision that ended it)."""
        latest = await self._latest(bucket, key, via)
        if latest is None:
            raise _key_not_found(bucket, key)
        stored = kv.read_headers(latest)
        if stored.live(self._clock.wall_ms()):
            return latest
        why = "its TTL passed" if stored.expired(self._clock.wall_ms()) else "deleted"
        raise _key_not_found(bucket, key, revision=latest.seq, why=why)

    async def get(self, request: kv_pb2.KvGetRequest, via: Call) -> kv_pb2.KvEntry:
        bucket, key = request.bucket, request.key
        self._checked(bucket, key)
        if not request.revision:
            return kv.to_entry(bucket, await self._live(bucket, key, via))
        message = await mapped(self._streams.get_message(streams_pb2.GetMessageRequest(
            stream=kv.stream_name(bucket), seq=request.revision), via), bucket=bucket, key=key)
        if message.subject != kv.key_subject(bucket, key):
            raise _key_not_found(bucket, key, why=f"revision {request.revision} is another key's")
        if kv.read_headers(message).operation != kv_pb2.KV_OPERATION_PUT:
            raise _key_not_found(bucket, key, revision=message.seq,
                                 why=f"revision {message.seq} is a marker")
        return kv.to_entry(bucket, message)

    async def keys(self, request: kv_pb2.KvKeysRequest, via: Call) -> kv_pb2.KvKeysResponse:
        bucket = kv.validate_bucket(request.bucket)
        pattern = kv.validate_filter(request.filter, bucket=bucket)
        limit = request.limit or limits.list_subjects_limit_default
        if limit > limits.list_subjects_limit_max:
            raise RaftlogError(Reason.INVALID_ARGUMENT, "limit may be at most "
                               f"{limits.list_subjects_limit_max}", field="limit",
                               limit=limits.list_subjects_limit_max)
        listed, truncated = await self.latest_revisions(bucket, pattern, via, limit=limit)
        found = [kv_pb2.KvKeyEntry(key=key, revision=revision) for key, revision in listed]
        if not request.include_deleted:
            live = await self.live_entries(bucket, [entry.revision for entry in found], via)
            found = [entry for entry in found if entry.revision in live]
        else:
            dead = await self._dead_revisions(bucket, [entry.revision for entry in found], via)
            for entry in found:
                entry.deleted = entry.revision in dead
        return kv_pb2.KvKeysResponse(keys=found, truncated=truncated)

    async def latest_revisions(self, bucket: str, pattern: str, via: Call, *, limit: int
                               ) -> tuple[list[tuple[str, int]], bool]:
        """(key, latest revision) of the keys matching `pattern`, in key order, and whether
        more keys started with the pattern's literal prefix than `limit`."""
        listed = await mapped(self._streams.list_subjects(streams_pb2.ListSubjectsByPrefixRequest(
            stream=kv.stream_name(bucket), prefix=kv.listing_prefix(bucket, pattern),
            limit=limit), via), bucket=bucket)
        wanted = kv.filter_subject(bucket, pattern)
        start = len(kv.subject_prefix(bucket))
        return [(summary.subject[start:], int(summary.last_seq)) for summary in listed.subjects
                if subjects.matches(wanted, summary.subject)], listed.truncated

    async def messages(self, bucket: str, revisions: Sequence[int], via: Call
                        ) -> list[types_pb2.Message]:
        """The messages at `revisions` (those still stored), limits.kv_reads_parallel_max
        reads at a time."""
        found: list[types_pb2.Message] = []
        for at in range(0, len(revisions), limits.kv_reads_parallel_max):
            chunk = revisions[at:at + limits.kv_reads_parallel_max]
            read = await asyncio.gather(*(self.message_at(bucket, revision, via)
                                          for revision in chunk))
            found.extend(message for message in read if message is not None)
        return found

    async def message_at(self, bucket: str, revision: int, via: Call
                         ) -> types_pb2.Message | None:
        """The bucket's message at `revision`; None when it is no longer stored."""
        try:
            return await self._streams.get_message(streams_pb2.GetMessageRequest(
                stream=kv.stream_name(bucket), seq=revision), via)
        except RaftlogError as err:
            if err.reason == Reason.MESSAGE_NOT_FOUND:
                return None
            raise kv_error(err, bucket=bucket) from None

    async def live_entries(self, bucket: str, revisions: Sequence[int], via: Call
                           ) -> dict[int, kv_pb2.KvEntry]:
        """The entries at `revisions` that are live values, by revision."""
        now_ms = self._clock.wall_ms()
        return {message.seq: kv.to_entry(bucket, message)
                for message in await self.messages(bucket, revisions, via)
                if kv.read_headers(message).live(now_ms)}

    async def _dead_revisions(self, bucket: str, revisions: Sequence[int], via: Call
                              ) -> set[int]:
        live = await self.live_entries(bucket, revisions, via)
        return {revision for revision in revisions if revision not in live}

    async def history(self, request: kv_pb2.KvHistoryRequest, via: Call
                      ) -> kv_pb2.KvHistoryResponse:
        bucket, key = request.bucket, request.key
        self._checked(bucket, key)
        messages, next_revision = await self.key_revisions(
            bucket, key, via, from_revision=request.from_revision, limit=request.limit)
        if not messages and not request.from_revision:
            raise _key_not_found(bucket, key, why="no revision is stored")
        return kv_pb2.KvHistoryResponse(
            entries=[kv.to_entry(bucket, message) for message in messages],
            next_revision=next_revision)

    # ------------------------------------------------------------------ watch

    async def watch(self, request: kv_pb2.KvWatchRequest, via: Call
                    ) -> AsyncIterator[kv_pb2.KvWatchEvent]:
        """Watch (kv_watch.py) with one of limits.kv_watches_max slots of this node."""
        bucket = kv.validate_bucket(request.bucket)
        kv.validate_filter(request.key, bucket=bucket)
        if request.include_history and request.updates_only:
            raise RaftlogError(Reason.INVALID_ARGUMENT, "include_history and updates_only "
                               "exclude each other", field="updates_only")
        if self._watches >= limits.kv_watches_max:
            raise RaftlogError(Reason.TOO_MANY_SUBSCRIPTIONS, f"this node serves "
                               f"{self._watches} watches, its limit; watch through another "
                               "node", limit=limits.kv_watches_max)
        self._watches += 1
        try:
            async for event in Watch(self, request, via, clock=self._clock).events():
                yield event
        finally:
            self._watches -= 1

    async def revision_range(self, bucket: str, via: Call) -> tuple[int, int]:
        """(first stored revision, highest committed revision) of the bucket."""
        info = await mapped(self._streams.info(streams_pb2.GetStreamInfoRequest(
            name=kv.stream_name(bucket)), via), bucket=bucket)
        if not kv.is_bucket_stream(info.config):
            raise RaftlogError(Reason.BUCKET_NOT_FOUND, f"no bucket {bucket!r}", bucket=bucket)
        return int(info.state.first_seq), int(info.state.commit_seq)

    async def key_revisions(self, bucket: str, key: str, via: Call, *, from_revision: int,
                            limit: int) -> tuple[list[types_pb2.Message], int]:
        """One key's stored messages from `from_revision` (at most `limit`) and where the next
        page starts (0: no more)."""
        scanned = await mapped(self._streams.scan_subject(streams_pb2.ScanExactAtSubjectRequest(
            stream=kv.stream_name(bucket), subject=kv.key_subject(bucket, key),
            from_seq=from_revision, limit=limit), via), bucket=bucket, key=key)
        return list(scanned.messages), int(scanned.next_seq)

    async def read_revisions(self, bucket: str, pattern: str, via: Call, *,
                             from_revision: int, limit: int, wait_ms: int
                             ) -> tuple[list[types_pb2.Message], int]:
        """ReadMessages of the keys matching `pattern` (see kv_watch.BucketReads)."""
        read = await mapped(self._streams.read_messages(streams_pb2.ReadMessagesRequest(
            stream=kv.stream_name(bucket), from_seq=from_revision,
            filter_subject=kv.filter_subject(bucket, pattern), limit=limit,
            max_wait_ms=wait_ms), via), bucket=bucket)
        return list(read.messages), int(read.next_seq)

    async def latest_message(self, bucket: str, key: str, via: Call
                             ) -> types_pb2.Message | None:
        return await self._latest(bucket, key, via)
