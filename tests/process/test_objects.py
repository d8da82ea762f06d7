"""The object store end to end on a 3-node cluster (one per module), through gRPC: raftlog.v1
Objects (unary and streaming put and get, ranges, revisions and tombstones, lists, the removal
of an aborted put's chunks, bad input, a put whose bucket primary is killed -9 midway) and the
same store through the waymaker API's object RPCs.

Every call goes to a node chosen on purpose: puts through one node, reads through another, so
forwarding to the bucket's primary is part of every path.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftlog.base import limits
from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.compat import waymaker_streams_pb2 as wm
from raftlog.compat import waymaker_streams_pb2_grpc as wm_grpc
from raftlog.node.transport.rpc import from_rpc_error, grpc_status
from raftlog.v1 import (
    cluster_pb2,
    objects_pb2,
    objects_pb2_grpc,
    streams_pb2,
    streams_pb2_grpc,
    types_pb2,
)

call_timeout_s = 30.0
failover_timeout_s = 30.0
cleanup_timeout_s = 15.0
BUCKET = "files"
MiB = 1024 * 1024
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", limits.request_bytes_max),
                   ("grpc.max_send_message_length", limits.request_bytes_max)]


class Clients:
    """One channel per node that carries the 16 MiB messages a unary object call may hold."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self._channels: dict[int, grpc.Channel] = {}

    def channel(self, i: int) -> grpc.Channel:
        if i not in self._channels:
            self._channels[i] = grpc.insecure_channel(self.cluster.address(i),
                                                      options=CHANNEL_OPTIONS)
        return self._channels[i]

    def objects(self, i: int) -> objects_pb2_grpc.ObjectsStub:
        return objects_pb2_grpc.ObjectsStub(self.channel(i))

    def drop(self, i: int) -> None:
        channel = self._channels.pop(i, None)
        if channel is not None:
            channel.close()

    def close(self) -> None:
        for i in list(self._channels):
            self.drop(i)


@pytest.fixture(scope="module")
def clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clients]:
    cluster = LocalCluster(tmp_path_factory.mktemp("objects") / "cluster", nodes=3)
    made = Clients(cluster)
    try:
        cluster.start_all()

        def created() -> bool:
            try:
                made.objects(1).CreateBucket(objects_pb2.CreateBucketRequest(
                    config=objects_pb2.BucketConfig(name=BUCKET, replicas=3)),
                    timeout=call_timeout_s)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                return False
            return True

        wait_until(created, 20, interval_s=0.1, what="bucket created")
        for i in (1, 2, 3):
            wait_until(functools.partial(_writable, made, i), 20, interval_s=0.1,
                       what=f"the bucket writable through n{i}")
        yield made
    finally:
        made.close()
        cluster.stop_all()


def _writable(clients: Clients, i: int) -> bool:
    try:
        clients.objects(i).Put(objects_pb2.PutObjectRequest(
            bucket=BUCKET, name=f"probe/{i}", payload=b"p"), timeout=5)
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        return False
    return True


def content(size: int, seed: int = 0) -> bytes:
    """Bytes that differ in every chunk (a mixed-up chunk order shows)."""
    block = hashlib.sha256(b"%d" % seed).digest() * 2048  # 64 KiB
    return (block * (size // len(block) + 1))[:size] if size < 4 * MiB else \
        os.urandom(size)


def expect(reason: Reason, call: object, request: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        result = call(request, timeout=call_timeout_s)  # type: ignore[operator]
        if hasattr(result, "__iter__") and not isinstance(result, bytes):
            list(result)
    err = from_rpc_error(caught.value)
    assert caught.value.code() == grpc_status(reason), caught.value.details()
    assert err is not None and err.reason is reason, caught.value.details()
    return caught.value


def put_stream_frames(name: str, data: bytes, *, frame_bytes: int, chunk_size: int = 0,
                      sha256: str = "", finish: bool = True
                      ) -> Iterator[objects_pb2.PutObjectFrame]:
    yield objects_pb2.PutObjectFrame(start=objects_pb2.PutObjectStart(
        bucket=BUCKET, name=name, chunk_size=chunk_size))
    for offset in range(0, len(data), frame_bytes):
        yield objects_pb2.PutObjectFrame(data=data[offset:offset + frame_bytes])
    if finish:
        yield objects_pb2.PutObjectFrame(finish=objects_pb2.PutObjectFinish(
            sha256=sha256 or hashlib.sha256(data).hexdigest()))


def get_stream(clients: Clients, i: int, name: str) -> tuple[objects_pb2.ObjectInfo, bytes, int]:
    """Info, content and the largest data frame of a GetStream through node i."""
    frames = list(clients.objects(i).GetStream(objects_pb2.GetObjectRequest(
        bucket=BUCKET, name=name), timeout=call_timeout_s))
    assert frames[0].WhichOneof("frame") == "info"
    data = [frame.data for frame in frames[1:]]
    return frames[0].info, b"".join(data), max((len(d) for d in data), default=0)


def chunk_subjects(clients: Clients) -> set[str]:
    listed = streams_pb2_grpc.StreamsStub(clients.channel(2)).ListSubjectsByPrefix(
        streams_pb2.ListSubjectsByPrefixRequest(stream=f"OBJ_{BUCKET}",
                                                prefix=f"$O.{BUCKET}.C."),
        timeout=call_timeout_s)
    return {summary.subject for summary in listed.subjects}


def test_unary_put_and_get_through_different_nodes(clients: Clients) -> None:
    data = content(3 * MiB + 12345, seed=1)
    info = clients.objects(2).Put(objects_pb2.PutObjectRequest(
        bucket=BUCKET, name="unary/a.bin", payload=data,
        headers=[types_pb2.Header(key="type", value="bin")]), timeout=call_timeout_s)
    assert info.size == len(data) and info.sha256 == hashlib.sha256(data).hexdigest()
    assert info.chunk_size == limits.object_chunk_bytes_default
    assert info.chunk_count == 7 and info.revision > 0
    got = clients.objects(3).Get(objects_pb2.GetObjectRequest(bucket=BUCKET, name="unary/a.bin"),
                                 timeout=call_timeout_s)
    assert got.payload == data
    assert (got.info.revision, got.info.sha256) == (info.revision, info.sha256)
    assert [(h.key, h.value) for h in got.info.headers] == [("type", "bin")]
    streamed_info, streamed, largest = get_stream(clients, 1, "unary/a.bin")
    assert streamed == data and streamed_info.revision == info.revision
    assert largest == limits.object_chunk_bytes_default
    empty = clients.objects(1).Put(objects_pb2.PutObjectRequest(
        bucket=BUCKET, name="unary/empty", payload=b""), timeout=call_timeout_s)
    assert (empty.size, empty.chunk_count) == (0, 0)
    assert clients.objects(3).Get(objects_pb2.GetObjectRequest(
        bucket=BUCKET, name="unary/empty"), timeout=call_timeout_s).payload == b""


def test_streaming_put_rechunks_frames_and_get_ranges(clients: Clients) -> None:
    data = content(2 * MiB + 777, seed=2)
    chunk = 256 * 1024
    info = clients.objects(3).PutStream(put_stream_frames(
        "stream/b.bin", data, frame_bytes=100_000, chunk_size=chunk), timeout=call_timeout_s)
    assert (info.size, info.chunk_size, info.chunk_count) == (len(data), chunk, 9)
    _, streamed, largest = get_stream(clients, 2, "stream/b.bin")
    assert streamed == data and largest == chunk
    ranges = [(0, 10), (chunk - 5, 10), (chunk, chunk), (len(data) - 3, 100),
              (len(data), 5), (len(data) + 50, 5), (1000, 0)]
    for offset, length in ranges:
        reply = clients.objects(1).GetRange(objects_pb2.GetObjectRangeRequest(
            bucket=BUCKET, name="stream/b.bin", offset=offset, length=length),
            timeout=call_timeout_s)
        assert reply.payload == data[offset:offset + length], (offset, length)
        assert reply.offset == min(offset, len(data))
        assert reply.info.size == len(data)
    tail = clients.objects(2).GetRange(objects_pb2.GetObjectRangeRequest(
        bucket=BUCKET, name="stream/b.bin", offset=len(data) - 1000), timeout=call_timeout_s)
    assert tail.payload == data[-1000:]


def test_revisions_tombstones_and_lists(clients: Clients) -> None:
    objects = clients.objects
    first = objects(1).Put(objects_pb2.PutObjectRequest(
        bucket=BUCKET, name="docs/readme", payload=b"one" * 1000), timeout=call_timeout_s)
    second = objects(2).Put(objects_pb2.PutObjectRequest(
        bucket=BUCKET, name="docs/readme", payload=b"two" * 2000), timeout=call_timeout_s)
    assert second.revision > first.revision
    objects(3).Put(objects_pb2.PutObjectRequest(bucket=BUCKET, name="docs/gone",
                                                payload=b"x"), timeout=call_timeout_s)
    objects(3).Put(objects_pb2.PutObjectRequest(bucket=BUCKET, name="docs.other",
                                                payload=b"y"), timeout=call_timeout_s)
    deleted = objects(1).Delete(objects_pb2.DeleteObjectRequest(
        bucket=BUCKET, name="docs/gone"), timeout=call_timeout_s)
    assert objects(2).Get(objects_pb2.GetObjectRequest(bucket=BUCKET, name="docs/readme"),
                          timeout=call_timeout_s).payload == b"two" * 2000
    expect(Reason.OBJECT_NOT_FOUND, objects(2).Get,
           objects_pb2.GetObjectRequest(bucket=BUCKET, name="docs/gone"))
    tomb = objects(3).GetInfo(objects_pb2.GetObjectInfoRequest(
        bucket=BUCKET, name="docs/gone", include_deleted=True), timeout=call_timeout_s)
    assert tomb.deleted and tomb.revision == deleted.revision
    revisions = objects(3).ListRevisions(objects_pb2.ListObjectRevisionsRequest(
        bucket=BUCKET, name="docs/readme"), timeout=call_timeout_s).revisions
    assert [(r.revision, r.size) for r in revisions] == [(first.revision, 3000),
                                                         (second.revision, 6000)]
    gone = objects(3).ListRevisions(objects_pb2.ListObjectRevisionsRequest(
        bucket=BUCKET, name="docs/gone"), timeout=call_timeout_s).revisions
    assert [r.deleted for r in gone] == [False, True]

    def names(prefix: str, include_deleted: bool = False) -> list[str]:
        listed = objects(2).List(objects_pb2.ListObjectsRequest(
            bucket=BUCKET, prefix=prefix, include_deleted=include_deleted),
            timeout=call_timeout_s)
        return sorted(info.name for info in listed.objects)

    assert names("docs/") == ["docs/readme"]
    assert names("docs/", include_deleted=True) == ["docs/gone", "docs/readme"]
    assert names("docs") == ["docs.other", "docs/readme"]
    # The replaced and deleted revisions' chunks are removed (after the answer).
    live_with_chunks = len(names("")) - 1  # unary/empty has none
    wait_until(lambda: len([s for s in chunk_subjects(clients) if s.endswith(".0")])
               == live_with_chunks, cleanup_timeout_s, what="replaced chunks removed")


def test_an_aborted_streaming_put_leaves_no_chunks(clients: Clients) -> None:
    before = chunk_subjects(clients)
    data = content(3 * MiB, seed=3)
    sent = threading.Event()

    def frames() -> Iterator[objects_pb2.PutObjectFrame]:
        yield from put_stream_frames("aborted", data, frame_bytes=MiB, finish=False)
        sent.set()
        # The client ends its side without a finish frame.

    expect(Reason.INVALID_ARGUMENT, clients.objects(2).PutStream, frames())
    assert sent.is_set()

    cancelled = clients.objects(3).PutStream.future(
        put_stream_frames("cancelled", data + data, frame_bytes=MiB // 2, finish=False),
        timeout=call_timeout_s)
    wait_until(lambda: len(chunk_subjects(clients) - before) > 0, 10, what="chunks stored")
    cancelled.cancel()
    wait_until(lambda: chunk_subjects(clients) == before, cleanup_timeout_s,
               what="the aborted puts' chunks removed")
    for name in ("aborted", "cancelled"):
        expect(Reason.OBJECT_NOT_FOUND, clients.objects(1).GetInfo,
               objects_pb2.GetObjectInfoRequest(bucket=BUCKET, name=name))


def test_bad_input(clients: Clients) -> None:
    objects = clients.objects
    expect(Reason.BUCKET_NOT_FOUND, objects(1).Put,
           objects_pb2.PutObjectRequest(bucket="nope", name="a", payload=b"1"))
    expect(Reason.BUCKET_NOT_FOUND, objects(2).Get,
           objects_pb2.GetObjectRequest(bucket="nope", name="a"))
    expect(Reason.BUCKET_NOT_FOUND, objects(3).List, objects_pb2.ListObjectsRequest(bucket="nope"))
    expect(Reason.OBJECT_NOT_FOUND, objects(3).Get,
           objects_pb2.GetObjectRequest(bucket=BUCKET, name="never"))
    expect(Reason.OBJECT_NOT_FOUND, objects(3).GetRange,
           objects_pb2.GetObjectRangeRequest(bucket=BUCKET, name="never"))
    expect(Reason.OBJECT_NOT_FOUND, objects(1).Delete,
           objects_pb2.DeleteObjectRequest(bucket=BUCKET, name="never"))
    before = chunk_subjects(clients)
    wrong = hashlib.sha256(b"not it").hexdigest()
    expect(Reason.SHA_MISMATCH, objects(1).Put, objects_pb2.PutObjectRequest(
        bucket=BUCKET, name="bad-sha", payload=b"z" * MiB, sha256=wrong))
    expect(Reason.SHA_MISMATCH, objects(2).PutStream, put_stream_frames(
        "bad-sha", b"z" * MiB, frame_bytes=300_000, sha256=wrong))
    expect(Reason.INVALID_ARGUMENT, objects(1).Put, objects_pb2.PutObjectRequest(
        bucket=BUCKET, name="bad-sha", payload=b"z", sha256="xyz"))
    expect(Reason.MESSAGE_TOO_LARGE, objects(1).Put, objects_pb2.PutObjectRequest(
        bucket=BUCKET, name="big-chunks", payload=b"z",
        chunk_size=limits.object_chunk_bytes_max + 1))
    expect(Reason.INVALID_NAME, objects(1).Put, objects_pb2.PutObjectRequest(
        bucket=BUCKET, name="", payload=b"z"))
    expect(Reason.INVALID_ARGUMENT, objects(2).PutStream,
           iter([objects_pb2.PutObjectFrame(data=b"no start")]))
    expect(Reason.BUCKET_EXISTS, objects(2).CreateBucket, objects_pb2.CreateBucketRequest(
        config=objects_pb2.BucketConfig(name=BUCKET, description="another")))
    wait_until(lambda: chunk_subjects(clients) == before, cleanup_timeout_s,
               what="the refused puts' chunks removed")
    expect(Reason.OBJECT_NOT_FOUND, objects(3).GetInfo,
           objects_pb2.GetObjectInfoRequest(bucket=BUCKET, name="bad-sha"))


def test_a_too_large_unary_get_points_at_the_stream(clients: Clients) -> None:
    data = content(limits.object_unary_bytes_max + 1, seed=4)
    clients.objects(1).PutStream(put_stream_frames("large", data, frame_bytes=4 * MiB),
                                 timeout=call_timeout_s)
    err = expect(Reason.OBJECT_TOO_LARGE, clients.objects(2).Get,
                 objects_pb2.GetObjectRequest(bucket=BUCKET, name="large"))
    assert "GetStream" in (err.details() or "")
    _, streamed, _ = get_stream(clients, 3, "large")
    assert hashlib.sha256(streamed).digest() == hashlib.sha256(data).digest()
    clients.objects(1).Delete(objects_pb2.DeleteObjectRequest(bucket=BUCKET, name="large"),
                              timeout=call_timeout_s)


def test_buckets_are_listed_and_deleted(clients: Clients) -> None:
    objects = clients.objects
    objects(3).CreateBucket(objects_pb2.CreateBucketRequest(
        config=objects_pb2.BucketConfig(name="scratch", description="tmp")),
        timeout=call_timeout_s)

    def listed() -> set[str]:
        reply = objects(1).ListBuckets(objects_pb2.ListBucketsRequest(), timeout=call_timeout_s)
        return {bucket.config.name for bucket in reply.buckets}

    wait_until(lambda: listed() == {BUCKET, "scratch"}, 10, what="both buckets listed")

    def put() -> bool:  # a new bucket's primary takes writes once its replicas answered
        try:
            objects(2).Put(objects_pb2.PutObjectRequest(bucket="scratch", name="a",
                                                        payload=b"1"), timeout=call_timeout_s)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True

    wait_until(put, 20, interval_s=0.1, what="a put to the new bucket")
    objects(1).DeleteBucket(objects_pb2.DeleteBucketRequest(name="scratch"),
                            timeout=call_timeout_s)
    expect(Reason.BUCKET_NOT_FOUND, objects(2).Get,
           objects_pb2.GetObjectRequest(bucket="scratch", name="a"))


def wm_stub(clients: Clients, i: int) -> wm_grpc.WaymakerStreamsServiceStub:
    return wm_grpc.WaymakerStreamsServiceStub(clients.channel(i))


def test_waymaker_object_rpcs_share_the_store(clients: Clients) -> None:
    data = content(MiB + 4321, seed=7)
    put = wm_stub(clients, 2).PutObject(wm.PutObjectRequest(
        bucket=BUCKET, name="wm/a", payload=data,
        headers=[wm.MessageHeader(key="k", value="v")]), timeout=call_timeout_s)
    assert (put.success, put.result_code) == (True, "ok"), put.message
    assert put.info.total_bytes == len(data) and put.info.metadata_seq > 0
    got = wm_stub(clients, 3).GetObject(wm.GetObjectRequest(bucket=BUCKET, name="wm/a"),
                                        timeout=call_timeout_s)
    assert got.result_code == "ok" and got.payload == data
    assert [(h.key, h.value) for h in got.info.headers] == [("k", "v")]
    same = clients.objects(1).Get(objects_pb2.GetObjectRequest(bucket=BUCKET, name="wm/a"),
                                  timeout=call_timeout_s)  # one store, two APIs
    assert same.info.revision == put.info.metadata_seq

    frames = list(wm_stub(clients, 1).GetObjectStream(
        wm.GetObjectRequest(bucket=BUCKET, name="wm/a"), timeout=call_timeout_s))
    assert frames[0].HasField("info") and frames[-1].done
    assert b"".join(f.data for f in frames[1:-1]) == data

    def wm_frames() -> Iterator[wm.PutObjectStreamFrame]:
        yield wm.PutObjectStreamFrame(start=wm.PutObjectStart(bucket=BUCKET, name="wm/s"))
        for offset in range(0, len(data), 300_000):
            yield wm.PutObjectStreamFrame(data=data[offset:offset + 300_000])
        yield wm.PutObjectStreamFrame(finish=True)

    streamed = wm_stub(clients, 3).PutObjectStream(wm_frames(), timeout=call_timeout_s)
    assert streamed.result_code == "ok", streamed.message
    assert (streamed.info.chunk_size, streamed.info.chunk_count) == (300_000, 4)
    ranged = wm_stub(clients, 2).GetObjectRange(wm.GetObjectRangeRequest(
        bucket=BUCKET, name="wm/s", offset=299_990, len=20), timeout=call_timeout_s)
    assert ranged.result_code == "ok" and ranged.payload == data[299_990:300_010]
    past = wm_stub(clients, 2).GetObjectRange(wm.GetObjectRangeRequest(
        bucket=BUCKET, name="wm/s", offset=len(data) + 5, len=20), timeout=call_timeout_s)
    assert (past.result_code, past.payload, past.actual_offset) == ("ok", b"", len(data))
    tail = wm_stub(clients, 2).GetObjectRange(wm.GetObjectRangeRequest(
        bucket=BUCKET, name="wm/s", offset=len(data) - 7), timeout=call_timeout_s)
    assert tail.payload == data[-7:]

    deleted = wm_stub(clients, 1).DeleteObject(wm.DeleteObjectRequest(
        bucket=BUCKET, name="wm/s"), timeout=call_timeout_s)
    assert deleted.result_code == "ok" and deleted.tombstone_seq > streamed.info.metadata_seq
    info = wm_stub(clients, 2).GetObjectInfo(wm.GetObjectInfoRequest(
        bucket=BUCKET, name="wm/s"), timeout=call_timeout_s)
    assert (info.result_code, info.deleted, info.HasField("info")) == ("ok", True, False)
    revisions = wm_stub(clients, 3).ListObjectRevisions(wm.ListObjectRevisionsRequest(
        bucket=BUCKET, name="wm/s"), timeout=call_timeout_s)
    assert [(r.metadata_seq, r.deleted) for r in revisions.revisions] == [
        (streamed.info.metadata_seq, False), (deleted.tombstone_seq, True)]
    listed = wm_stub(clients, 1).ListObjects(wm.ListObjectsRequest(
        bucket=BUCKET, name_prefix="wm/", include_deleted=True), timeout=call_timeout_s)
    assert sorted((e.name, e.total_bytes, e.deleted) for e in listed.entries) == [
        ("wm/a", len(data), False), ("wm/s", 0, True)]
    live = wm_stub(clients, 1).ListObjects(wm.ListObjectsRequest(
        bucket=BUCKET, name_prefix="wm/"), timeout=call_timeout_s)
    assert [e.name for e in live.entries] == ["wm/a"]


def test_waymaker_result_codes(clients: Clients) -> None:
    stub = wm_stub(clients, 2)
    codes = {
        "put to a missing bucket": stub.PutObject(wm.PutObjectRequest(
            bucket="nope", name="a", payload=b"1"), timeout=call_timeout_s).result_code,
        "get of a missing object": stub.GetObject(wm.GetObjectRequest(
            bucket=BUCKET, name="never"), timeout=call_timeout_s).result_code,
        "info of a missing bucket": stub.GetObjectInfo(wm.GetObjectInfoRequest(
            bucket="nope", name="a"), timeout=call_timeout_s).result_code,
        "range of a missing object": stub.GetObjectRange(wm.GetObjectRangeRequest(
            bucket=BUCKET, name="never"), timeout=call_timeout_s).result_code,
        "wrong sha256": stub.PutObject(wm.PutObjectRequest(
            bucket=BUCKET, name="wm/bad", payload=b"1",
            sha256=hashlib.sha256(b"2").hexdigest()), timeout=call_timeout_s).result_code,
        "dedupe": stub.PutObject(wm.PutObjectRequest(
            bucket=BUCKET, name="wm/dd", payload=b"1", dedupe=True),
            timeout=call_timeout_s).result_code,
        "list of a missing bucket": stub.ListObjects(wm.ListObjectsRequest(
            bucket="nope"), timeout=call_timeout_s).result_code,
        "delete of a missing object": stub.DeleteObject(wm.DeleteObjectRequest(
            bucket=BUCKET, name="never"), timeout=call_timeout_s).result_code,
    }
    assert codes == {
        "put to a missing bucket": "no_such_bucket", "get of a missing object": "no_such_object",
        "info of a missing bucket": "no_such_bucket",
        "range of a missing object": "no_such_object", "wrong sha256": "sha_mismatch",
        "dedupe": "invalid_config", "list of a missing bucket": "no_such_bucket",
        "delete of a missing object": "ok"}
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.GetObjectStream(wm.GetObjectRequest(bucket=BUCKET, name="never"),
                                  timeout=call_timeout_s))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_corrupt_chunk_is_reported_by_both_apis(clients: Clients) -> None:
    """A chunk overwritten through the Streams API (same size, other bytes): every whole-object
    read refuses the content (raftlog.v1: DATA_LOSS / OBJECT_CORRUPT; Waymaker: "sha_mismatch",
    and ABORTED for the stream)."""
    data = content(MiB, seed=9)
    clients.objects(1).Put(objects_pb2.PutObjectRequest(bucket=BUCKET, name="corrupt",
                                                        payload=data), timeout=call_timeout_s)
    streams = streams_pb2_grpc.StreamsStub(clients.channel(1))
    meta = streams.ReadLatestAtSubject(streams_pb2.ReadLatestAtSubjectRequest(
        stream=f"OBJ_{BUCKET}", subject=f"$O.{BUCKET}.M.corrupt"), timeout=call_timeout_s)
    upload = json.loads(meta.payload)["upload"]
    streams.Publish(streams_pb2.PublishRequest(
        stream=f"OBJ_{BUCKET}", subject=f"$O.{BUCKET}.C.{upload}.1",
        payload=bytes(limits.object_chunk_bytes_default)), timeout=call_timeout_s)
    expect(Reason.OBJECT_CORRUPT, clients.objects(2).Get,
           objects_pb2.GetObjectRequest(bucket=BUCKET, name="corrupt"))
    expect(Reason.OBJECT_CORRUPT, clients.objects(3).GetStream,
           objects_pb2.GetObjectRequest(bucket=BUCKET, name="corrupt"))
    assert wm_stub(clients, 2).GetObject(wm.GetObjectRequest(
        bucket=BUCKET, name="corrupt"), timeout=call_timeout_s).result_code == "sha_mismatch"
    with pytest.raises(grpc.RpcError) as caught:
        list(wm_stub(clients, 3).GetObjectStream(wm.GetObjectRequest(
            bucket=BUCKET, name="corrupt"), timeout=call_timeout_s))
    assert caught.value.code() == grpc.StatusCode.ABORTED
    assert "sha_mismatch" in (caught.value.details() or "")
    # A range reads bytes without the whole object's hash; the first chunk is intact.
    first = clients.objects(1).GetRange(objects_pb2.GetObjectRangeRequest(
        bucket=BUCKET, name="corrupt", offset=0, length=100), timeout=call_timeout_s)
    assert first.payload == data[:100]


def test_the_cli_puts_and_gets_a_file(clients: Clients, tmp_path: Path) -> None:
    source = tmp_path / "data.bin"
    source.write_bytes(content(3 * MiB + 5, seed=8))

    def raftlog(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "raftlog.node.cli", *args, "--server",
                               clients.cluster.address(3), "--timeout", "30"],
                              capture_output=True, text=True, timeout=120, check=False)

    put = raftlog("obj", "put", BUCKET, str(source), "--name", "cli/data.bin", "--progress")
    assert put.returncode == 0, put.stderr
    assert "100%" in put.stderr and "stored files/cli/data.bin" in put.stdout
    target = tmp_path / "back.bin"
    got = raftlog("obj", "get", BUCKET, "cli/data.bin", "-o", str(target))
    assert got.returncode == 0, got.stderr
    assert target.read_bytes() == source.read_bytes() and "(checked)" in got.stdout
    listed = raftlog("obj", "ls", BUCKET, "--prefix", "cli/", "--json")
    assert listed.returncode == 0, listed.stderr
    [entry] = json.loads(listed.stdout)["objects"]
    assert (entry["name"], int(entry["size"])) == ("cli/data.bin", 3 * MiB + 5)
    missing = raftlog("obj", "get", BUCKET, "cli/none", "-o", str(tmp_path / "x"))
    assert missing.returncode == 1 and "OBJECT_NOT_FOUND" in missing.stderr


def test_a_get_streaming_while_the_primary_dies_reads_the_whole_object(
        clients: Clients) -> None:
    """Kills the bucket's primary (-9) while a GetStream through another node is under way:
    its chunk reads are tried again across the failover, and the stream ends whole."""
    cluster = clients.cluster
    route = cluster.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(
        stream=f"OBJ_{BUCKET}"), timeout=call_timeout_s)
    primary = cluster.index_of(route.primary)
    front = next(i for i in (1, 2, 3) if i != primary)
    data = content(24 * MiB, seed=7)
    clients.objects(front).PutStream(put_stream_frames("read-across", data, frame_bytes=MiB),
                                     timeout=call_timeout_s)
    frames = clients.objects(front).GetStream(objects_pb2.GetObjectRequest(
        bucket=BUCKET, name="read-across"), timeout=call_timeout_s)
    got = [next(frames), next(frames)]  # the info, then the first data
    cluster.kill9(primary)  # the stream has most of the object still to read
    clients.drop(primary)
    got += list(frames)
    assert b"".join(frame.data for frame in got[1:]) == data
    cluster.restart(primary)
    wait_until(lambda: _serves(clients, primary, "read-across"), failover_timeout_s,
               interval_s=0.2, what="the restarted node serves objects")


def test_a_put_whose_primary_dies_leaves_no_broken_object(clients: Clients) -> None:
    """Last in the module: kills the bucket's primary (-9) while a put streams through another
    node. The put goes on across the failover (its publishes are tried again and stored once,
    node/ops/objects_upload.py) and the object reads back whole; the node comes back."""
    cluster = clients.cluster
    route = cluster.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(
        stream=f"OBJ_{BUCKET}"), timeout=call_timeout_s)
    primary = cluster.index_of(route.primary)
    front = next(i for i in (1, 2, 3) if i != primary)
    before = content(MiB + 1, seed=6)
    clients.objects(front).Put(objects_pb2.PutObjectRequest(
        bucket=BUCKET, name="before-crash", payload=before), timeout=call_timeout_s)
    data = content(8 * MiB, seed=5)
    killing, killed = threading.Event(), threading.Event()

    def frames() -> Iterator[objects_pb2.PutObjectFrame]:
        for k, frame in enumerate(put_stream_frames("crash", data, frame_bytes=MiB // 2)):
            if k == 6:
                killing.set()
                cluster.kill9(primary)
                killed.set()
            yield frame

    try:
        clients.objects(front).PutStream(frames(), timeout=call_timeout_s)
        outcome = "stored"
    except grpc.RpcError as err:
        outcome = f"{err.code().name}: {err.details()}"
    assert killing.is_set(), outcome
    assert killed.wait(call_timeout_s)
    assert outcome == "stored"
    clients.drop(primary)

    def answered() -> bool:
        try:
            clients.objects(front).GetInfo(objects_pb2.GetObjectInfoRequest(
                bucket=BUCKET, name="crash"), timeout=5)
        except grpc.RpcError as err:
            return err.code() == grpc.StatusCode.NOT_FOUND
        return True

    wait_until(answered, failover_timeout_s, interval_s=0.2, what="the bucket served again")
    try:
        got = clients.objects(front).Get(objects_pb2.GetObjectRequest(
            bucket=BUCKET, name="crash"), timeout=call_timeout_s)
    except grpc.RpcError as err:
        assert from_rpc_error(err) is not None
        assert from_rpc_error(err).reason is Reason.OBJECT_NOT_FOUND, (outcome, err.details())  # type: ignore[union-attr]
    else:
        assert got.payload == data, outcome
    cluster.restart(primary)
    wait_until(lambda: _serves(clients, primary), failover_timeout_s, interval_s=0.2,
               what="the restarted node serves objects")
    _, streamed, _ = get_stream(clients, primary, "before-crash")  # whole on every node
    assert streamed == before
    print(f"the put through n{front} while n{primary} was killed: {outcome}")


def _serves(clients: Clients, i: int, name: str = "before-crash") -> bool:
    try:
        clients.objects(i).GetInfo(objects_pb2.GetObjectInfoRequest(
            bucket=BUCKET, name=name), timeout=5)
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        return False
    return True
