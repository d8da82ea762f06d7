"""Object store operations (node/ops/objects.py) over a node on its own, in-process: the
in-memory message store, a fake clock, no gRPC. The sweep's timing is driven by the clock."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from raftlog.base import limits
from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.memory_store import MemoryMessageStore
from raftlog.node.engine.streams import NoConsumers, StreamEngine
from raftlog.node.ops import objects_layout as layout
from raftlog.node.ops.metadata import LocalStreamMetadata
from raftlog.node.ops.objects import ObjectOps, ObjectSweeper
from raftlog.node.ops.objects_upload import Upload
from raftlog.node.ops.route import LocalRoute
from raftlog.node.ops.streams import StreamOps
from raftlog.node.transport.calls import Call
from raftlog.v1 import objects_pb2, streams_pb2

VIA = Call()
CHUNK = 1024


class Store:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.engine = StreamEngine(store=MemoryMessageStore(), clock=self.clock,
                                   consumers=NoConsumers())
        self.streams = StreamOps(self.engine, metadata=LocalStreamMetadata(self.engine),
                                 where=LocalRoute())
        self.objects = ObjectOps(self.streams, clock=self.clock)

    def subjects(self, bucket: str = "b") -> list[str]:
        stream = self.engine.get(layout.bucket_stream(bucket))
        found, _ = stream.subjects_with_prefix("", limit=100_000)
        return [summary.subject for summary in found]

    def chunk_subjects(self, bucket: str = "b") -> list[str]:
        return [s for s in self.subjects(bucket) if s.startswith(f"$O.{bucket}.C.")]


def run(body: Callable[[Store], Awaitable[None]]) -> None:
    async def main() -> None:
        store = Store()
        store.engine.load()
        await store.objects.create_bucket(objects_pb2.CreateBucketRequest(
            config=objects_pb2.BucketConfig(name="b")), VIA)
        await body(store)

    asyncio.run(main())


async def put(store: Store, name: str, payload: bytes, **fields: object
              ) -> objects_pb2.ObjectInfo:
    return await store.objects.put(objects_pb2.PutObjectRequest(
        bucket="b", name=name, payload=payload, chunk_size=CHUNK, **fields), VIA)  # type: ignore[arg-type]


async def get(store: Store, name: str) -> bytes:
    reply = await store.objects.get(objects_pb2.GetObjectRequest(bucket="b", name=name), VIA)
    return reply.payload


async def reason_of(call: Awaitable[object]) -> Reason:
    with pytest.raises(RaftlogError) as caught:
        await call
    return caught.value.reason


def test_a_put_is_read_back_whole_streamed_and_by_range() -> None:
    payload = bytes(range(256)) * 17  # 4352 bytes: 4 full chunks and a short one

    async def body(store: Store) -> None:
        info = await put(store, "dir/a b.txt", payload)
        assert (info.size, info.chunk_count, info.chunk_size) == (len(payload), 5, CHUNK)
        assert info.sha256 == hashlib.sha256(payload).hexdigest()
        assert await get(store, "dir/a b.txt") == payload
        frames = [frame async for frame in store.objects.get_stream(
            objects_pb2.GetObjectRequest(bucket="b", name="dir/a b.txt"), VIA)]
        assert frames[0].WhichOneof("frame") == "info"
        assert b"".join(frame.data for frame in frames[1:]) == payload
        assert max(len(frame.data) for frame in frames[1:]) == CHUNK
        for offset, length in [(0, 1), (1000, 100), (1020, 2000), (4000, 1000), (4352, 5),
                               (9999, 5), (10, 0)]:
            reply = await store.objects.get_range(objects_pb2.GetObjectRangeRequest(
                bucket="b", name="dir/a b.txt", offset=offset, length=length), VIA)
            assert reply.payload == payload[offset:offset + length], (offset, length)
            assert reply.offset == min(offset, len(payload))
        tail = await store.objects.get_range(objects_pb2.GetObjectRangeRequest(
            bucket="b", name="dir/a b.txt", offset=4000), VIA)
        assert tail.payload == payload[4000:]

    run(body)


def test_a_replaced_revision_loses_its_chunks_and_a_delete_leaves_a_tombstone() -> None:
    async def body(store: Store) -> None:
        first = await put(store, "o", b"x" * 3000)
        first_chunks = store.chunk_subjects()
        second = await put(store, "o", b"y" * 1500)
        await store.objects.cleanups_done()
        assert second.revision > first.revision
        assert not set(first_chunks) & set(store.chunk_subjects())
        assert len(store.chunk_subjects()) == 2
        assert await get(store, "o") == b"y" * 1500
        deleted = await store.objects.delete(objects_pb2.DeleteObjectRequest(
            bucket="b", name="o"), VIA)
        await store.objects.cleanups_done()
        assert store.chunk_subjects() == []
        assert await reason_of(get(store, "o")) is Reason.OBJECT_NOT_FOUND
        tomb = await store.objects.info(objects_pb2.GetObjectInfoRequest(
            bucket="b", name="o", include_deleted=True), VIA)
        assert tomb.deleted and tomb.revision == deleted.revision
        revisions = await store.objects.revisions(objects_pb2.ListObjectRevisionsRequest(
            bucket="b", name="o"), VIA)
        assert [(r.revision, r.deleted, r.size) for r in revisions.revisions] == [
            (first.revision, False, 3000), (second.revision, False, 1500),
            (deleted.revision, True, 0)]

    run(body)


def test_list_filters_by_name_prefix_and_tombstones() -> None:
    async def body(store: Store) -> None:
        for name in ("a/1", "a/2", "a.3", "b/1", "é/x"):
            await put(store, name, name.encode())
        await store.objects.delete(objects_pb2.DeleteObjectRequest(bucket="b", name="a/2"), VIA)

        async def names(prefix: str, include_deleted: bool = False) -> list[str]:
            reply = await store.objects.list(objects_pb2.ListObjectsRequest(
                bucket="b", prefix=prefix, include_deleted=include_deleted), VIA)
            return sorted(info.name for info in reply.objects)

        assert await names("a/") == ["a/1"]
        assert await names("a/", include_deleted=True) == ["a/1", "a/2"]
        assert await names("a") == ["a.3", "a/1"]
        assert await names("é") == ["é/x"]
        assert await names("") == ["a.3", "a/1", "b/1", "é/x"]

    run(body)


def test_a_wrong_sha256_stores_nothing() -> None:
    async def body(store: Store) -> None:
        wrong = hashlib.sha256(b"other").hexdigest()
        assert await reason_of(put(store, "o", b"z" * 5000, sha256=wrong)) is \
            Reason.SHA_MISMATCH
        await store.objects.cleanups_done()
        assert [s for s in store.subjects() if not s.startswith("$O.b.M.")] == []
        assert await reason_of(get(store, "o")) is Reason.OBJECT_NOT_FOUND

    run(body)


def test_a_failed_puts_chunks_are_removed_through_retryable_refusals(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "object_cleanup_backoff_s", 0.001)
    refusals: list[Reason] = []

    async def body(store: Store) -> None:
        purge = store.streams.purge

        async def flaky_purge(request: streams_pb2.PurgeStreamRequest, via: Call) -> object:
            if refusals:
                raise RaftlogError(refusals.pop(0), "refused for the test")
            return await purge(request, via)

        monkeypatch.setattr(store.streams, "purge", flaky_purge)
        wrong = hashlib.sha256(b"other").hexdigest()
        refusals[:] = [Reason.NO_LEADER, Reason.FORWARD_FAILED]
        assert await reason_of(put(store, "o", b"z" * 5000, sha256=wrong)) is \
            Reason.SHA_MISMATCH
        await store.objects.cleanups_done()
        assert refusals == [] and store.chunk_subjects() == []
        # A refusal that will not change is not tried again: the chunks are the sweep's.
        refusals[:] = [Reason.PERMISSION_DENIED, Reason.NO_LEADER]
        assert await reason_of(put(store, "p", b"z" * 5000, sha256=wrong)) is \
            Reason.SHA_MISMATCH
        await store.objects.cleanups_done()
        assert refusals == [Reason.NO_LEADER] and len(store.chunk_subjects()) == 5
        # Retryable refusals past the attempts allowed leave them too.
        refusals[:] = [Reason.NO_LEADER] * (limits.object_cleanup_attempts_max + 1)
        assert await reason_of(put(store, "q", b"z" * 5000, sha256=wrong)) is \
            Reason.SHA_MISMATCH
        await store.objects.cleanups_done()
        assert refusals == [Reason.NO_LEADER] and len(store.chunk_subjects()) == 10

    run(body)


def test_a_put_goes_on_through_retryable_refusals_and_stores_each_chunk_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every publish of the put (first batch with the marker, chunks, metadata) is refused
    twice before it goes through: once before it is stored, once after (the answer lost, as
    when the bucket's primary fails over between its fsync and its answer). The put succeeds,
    reads back whole (through refused chunk reads too), and each message is stored once (its
    msg_id). Refused past the attempts allowed, the put fails with the refusal and nothing
    becomes live."""
    monkeypatch.setattr(limits, "object_retry_backoff_s", 0.001)
    monkeypatch.setattr(limits, "object_retry_backoff_max_s", 0.001)
    payload = bytes(range(256)) * (20 * CHUNK // 256) + b"tail"  # 21 chunks

    async def body(store: Store) -> None:
        publish, publish_batch = store.streams.publish, store.streams.publish_batch
        tries: dict[str, int] = {}
        refused_max = 2

        async def flaky(call: Callable[[Any, Call], Awaitable[Any]], key: str, request: Any,
                        via: Call) -> Any:
            tries[key] = tries.get(key, 0) + 1
            if tries[key] == 1 and refused_max:
                raise RaftlogError(Reason.NO_QUORUM, "refused before it was stored")
            if tries[key] <= refused_max:
                await call(request, via)
                raise RaftlogError(Reason.FORWARD_FAILED, "stored, but the answer was lost")
            return await call(request, via)

        async def flaky_publish(request: streams_pb2.PublishRequest, via: Call) -> Any:
            return await flaky(publish, request.msg_id, request, via)

        async def flaky_batch(request: streams_pb2.PublishBatchRequest, via: Call) -> Any:
            return await flaky(publish_batch, request.entries[0].msg_id, request, via)

        monkeypatch.setattr(store.streams, "publish", flaky_publish)
        monkeypatch.setattr(store.streams, "publish_batch", flaky_batch)
        info = await put(store, "o", payload)
        assert info.chunk_count == 21 and await get(store, "o") == payload
        assert len(tries) == 1 + 17 + 1 and set(tries.values()) == {3}  # batch, chunks, meta
        stream = store.engine.get(layout.bucket_stream("b"))
        found, _ = stream.subjects_with_prefix("", limit=1_000)
        assert len(store.chunk_subjects()) == 21
        assert {summary.messages for summary in found} == {1}, found

        read_latest, reads = store.streams.read_latest, {"refused": 0}

        async def flaky_read(request: streams_pb2.ReadLatestAtSubjectRequest, via: Call) -> Any:
            if ".C." in request.subject and reads["refused"] < 5:
                reads["refused"] += 1
                raise RaftlogError(Reason.NOT_PRIMARY, "the primary moved")
            return await read_latest(request, via)

        monkeypatch.setattr(store.streams, "read_latest", flaky_read)
        assert await get(store, "o") == payload and reads["refused"] == 5  # chunk reads too

        tries.clear()
        refused_max = limits.object_retry_attempts_max
        assert await reason_of(put(store, "p", payload)) is Reason.FORWARD_FAILED
        assert tries and set(tries.values()) == {limits.object_retry_attempts_max}
        assert await reason_of(get(store, "p")) is Reason.OBJECT_NOT_FOUND

    run(body)


def test_bad_input_is_refused() -> None:
    async def body(store: Store) -> None:
        ops = store.objects
        assert await reason_of(ops.put(objects_pb2.PutObjectRequest(
            bucket="nope", name="o", payload=b"1"), VIA)) is Reason.BUCKET_NOT_FOUND
        assert await reason_of(ops.get(objects_pb2.GetObjectRequest(
            bucket="nope", name="o"), VIA)) is Reason.BUCKET_NOT_FOUND
        assert await reason_of(ops.put(objects_pb2.PutObjectRequest(
            bucket="b", name="o", payload=b"1",
            chunk_size=limits.object_chunk_bytes_max + 1), VIA)) is Reason.MESSAGE_TOO_LARGE
        assert await reason_of(ops.put(objects_pb2.PutObjectRequest(
            bucket="b", name="", payload=b"1"), VIA)) is Reason.INVALID_NAME
        assert await reason_of(ops.put(objects_pb2.PutObjectRequest(
            bucket="b", name="x" * 200, payload=b"1"), VIA)) is Reason.INVALID_NAME
        again = await ops.create_bucket(objects_pb2.CreateBucketRequest(
            config=objects_pb2.BucketConfig(name="b")), VIA)  # the same config: idempotent
        assert again.stream == "OBJ_b"
        assert await reason_of(ops.create_bucket(objects_pb2.CreateBucketRequest(
            config=objects_pb2.BucketConfig(name="b", description="other")), VIA)) is \
            Reason.BUCKET_EXISTS
        assert await reason_of(ops.delete(objects_pb2.DeleteObjectRequest(
            bucket="b", name="never"), VIA)) is Reason.OBJECT_NOT_FOUND

        async def unfinished() -> AsyncIterator[objects_pb2.PutObjectFrame]:
            yield objects_pb2.PutObjectFrame(start=objects_pb2.PutObjectStart(
                bucket="b", name="o", chunk_size=CHUNK))
            yield objects_pb2.PutObjectFrame(data=b"q" * 5000)

        assert await reason_of(ops.put_stream(unfinished(), VIA)) is Reason.INVALID_ARGUMENT
        await ops.cleanups_done()
        assert store.chunk_subjects() == []

    run(body)


def test_the_sweep_collects_an_abandoned_upload_but_never_a_live_one() -> None:
    async def body(store: Store) -> None:
        await put(store, "live", b"l" * 3000)
        abandoned = Upload(store.streams, store.clock, bucket="b", name="gone",
                           chunk_bytes=CHUNK, headers=(), via=VIA)
        await abandoned.add(b"g" * 5000)
        await abandoned.finish(sha256="")  # its metadata is never published (a crash)
        assert len(store.chunk_subjects()) == 3 + 5
        assert await store.objects.sweep("b") == 0  # not idle yet
        store.clock.advance(limits.object_upload_idle_s + 1)
        assert await store.objects.sweep("b") == 1
        assert len(store.chunk_subjects()) == 3
        assert await get(store, "live") == b"l" * 3000
        assert f"$O.b.U.{abandoned.upload}" not in store.subjects()

    run(body)


def test_an_upload_the_sweep_took_over_cannot_commit() -> None:
    async def body(store: Store) -> None:
        upload = Upload(store.streams, store.clock, bucket="b", name="slow",
                        chunk_bytes=CHUNK, headers=(), via=VIA)
        await upload.add(b"s" * 5000)  # the marker and 4 chunks are stored
        store.clock.advance(limits.object_upload_idle_s + 1)
        assert await store.objects.sweep("b") == 1
        assert store.chunk_subjects() == []
        assert await reason_of(upload.finish(sha256="")) is Reason.UPLOAD_ABANDONED
        await upload.abort()  # what the put does on a failure: its last chunk goes too
        assert store.chunk_subjects() == []
        assert [s for s in store.subjects() if s.startswith("$O.b.U.")] == []

    run(body)


def test_a_stored_chunk_that_does_not_hash_is_reported() -> None:
    async def body(store: Store) -> None:
        await put(store, "o", b"a" * 2000)
        (first, _) = sorted(store.chunk_subjects())
        await store.streams.publish(streams_pb2.PublishRequest(
            stream="OBJ_b", subject=first, payload=b"b" * CHUNK), VIA)
        assert await reason_of(get(store, "o")) is Reason.OBJECT_CORRUPT

    run(body)


def test_the_sweeper_goes_round_every_shard_of_the_buckets_here(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "object_sweep_period_s", 0.001)

    async def body(store: Store) -> None:
        uploads = []
        for n in range(3):
            upload = Upload(store.streams, store.clock, bucket="b", name=f"gone{n}",
                            chunk_bytes=CHUNK, headers=(), via=VIA)
            await upload.add(b"g" * 5000)  # the marker and 4 chunks are stored
            uploads.append(upload)
        store.clock.advance(limits.object_upload_idle_s + 1)
        sweeper = ObjectSweeper(store.objects, buckets_here=lambda: ["b"])
        sweeper.start()
        try:
            for _ in range(2_000):  # 16 shards at 1 ms a round: well within
                if not store.chunk_subjects():
                    break
                await asyncio.sleep(0.001)
        finally:
            await sweeper.stop()
        assert store.chunk_subjects() == []
        assert [s for s in store.subjects() if s.startswith("$O.b.U.")] == []

    run(body)
