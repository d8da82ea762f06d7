"""The Waymaker API on a node that runs alone (`raftlog node` without --raft): a client compiled
from the seed document (test_waymaker_api's loader) drives the stream, publish, read, consumer,
transfer, source and object calls, and each call about the cluster answers UNIMPLEMENTED with a
message that says why, while the node keeps serving.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from raftlog.chaos.nodeproc import NodeProcess, wait_until
from raftlog.v1 import objects_pb2, objects_pb2_grpc, types_pb2
from tests.process.test_waymaker_api import seed_client

call_timeout_s = 10.0
copy_timeout_s = 20.0
CLUSTER_ONLY = ("MigrateStream", "RebalanceStreams", "GetClusterStreamStats", "WatchStreams",
                "ClearStreamAuthority", "ListStreamAuthorityOverrides", "SetStreamPinned")


@pytest.fixture(scope="module")
def wm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return seed_client(tmp_path_factory.mktemp("seed"))


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    alone = NodeProcess(tmp_path_factory.mktemp("standalone") / "node1").start()
    try:
        yield alone
    finally:
        alone.cleanup()


@pytest.fixture(scope="module")
def channel(node: NodeProcess) -> Iterator[grpc.Channel]:
    with node.channel() as opened:
        yield opened


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel, wm: Any) -> Any:
    return wm.grpc.WaymakerStreamsServiceStub(channel)


def ok(reply: Any) -> Any:
    assert (reply.success, reply.result_code) == (True, "ok"), reply
    return reply


def failed(reply: Any, code: str) -> None:
    assert (reply.success, reply.result_code) == (False, code), reply
    assert reply.message


def test_streams_publish_and_reads_alone(stub: Any, wm: Any) -> None:
    ok(stub.CreateStream(wm.CreateStreamRequest(config=wm.StreamConfigPb(
        name="solo", subjects_filter=["s.>"], retention=wm.Retention(
            limits=wm.LimitsRetention(max_msgs=50)))), timeout=call_timeout_s))
    failed(stub.CreateStream(wm.CreateStreamRequest(config=wm.StreamConfigPb(name="solo")),
                             timeout=call_timeout_s), "already_exists")
    assert "solo" in stub.ListStreams(wm.ListStreamsRequest(), timeout=call_timeout_s).names
    for k in range(6):
        published = ok(stub.Publish(wm.PublishRequest(stream="solo", subject=f"s.{k % 2}",
                                                      payload=b"p%d" % k),
                                    timeout=call_timeout_s))
        assert published.seq == k + 1
    stale = stub.Publish(wm.PublishRequest(stream="solo", subject="s.0", payload=b"x",
                                           expected_last_seq=1), timeout=call_timeout_s)
    failed(stale, "wrong_revision")
    assert stale.seq == 5
    failed(stub.Publish(wm.PublishRequest(stream="solo", subject="t.0", payload=b"x"),
                        timeout=call_timeout_s), "subject_rejected")

    info = ok(stub.GetStreamInfo(wm.GetStreamInfoRequest(name="solo"), timeout=call_timeout_s))
    assert (info.stats.last_seq, info.stats.msg_count, info.config.retention.limits.max_msgs) \
        == (6, 6, 50)
    assert (info.ring_owner_node_id, info.HasField("authority_override"), info.pinned) == (
        0, False, False)  # no ring, no overrides on a node alone
    updated = ok(stub.UpdateStream(wm.UpdateStreamRequest(name="solo", max_msgs=4),
                                   timeout=call_timeout_s))
    assert (updated.pruned, updated.config.retention.limits.max_msgs) == (2, 4)

    latest = ok(stub.ReadLatestAtSubject(wm.ReadLatestAtSubjectRequest(
        stream="solo", subject="s.1"), timeout=call_timeout_s))
    assert (latest.latest.seq, latest.latest.payload) == (6, b"p5")
    scanned = ok(stub.ScanExactAtSubject(wm.ScanExactAtSubjectRequest(
        stream="solo", subject="s.0"), timeout=call_timeout_s))
    assert [m.seq for m in scanned.messages] == [3, 5]  # 1 was pruned
    subjects = ok(stub.ListSubjectsByPrefix(wm.ListSubjectsByPrefixRequest(
        stream="solo", prefix="s."), timeout=call_timeout_s))
    assert sorted(subjects.subjects) == ["s.0", "s.1"]

    chunks = list(stub.TransferStream(wm.TransferStreamRequest(name="solo"),
                                      timeout=call_timeout_s))
    data = b"".join(c.data for c in chunks[:-1])
    assert (chunks[-1].summary.total_bytes, chunks[-1].summary.stream_last_seq) == (len(data), 6)
    seqs, offset = [], 0
    while offset < len(data):
        (size,) = struct.unpack_from(">I", data, offset)
        seqs.append(types_pb2.Message.FromString(data[offset + 4:offset + 4 + size]).seq)
        offset += 4 + size
    assert seqs == [3, 4, 5, 6]

    ok(stub.DeleteStream(wm.DeleteStreamRequest(name="solo"), timeout=call_timeout_s))
    failed(stub.GetStreamInfo(wm.GetStreamInfoRequest(name="solo"), timeout=call_timeout_s),
           "no_such_stream")


def test_consumers_alone(stub: Any, wm: Any) -> None:
    ok(stub.CreateStream(wm.CreateStreamRequest(config=wm.StreamConfigPb(
        name="solo-jobs", subjects_filter=["j.>"])), timeout=call_timeout_s))
    for k in range(1, 5):
        ok(stub.Publish(wm.PublishRequest(stream="solo-jobs", subject="j.x", payload=b"%d" % k),
                        timeout=call_timeout_s))
    ok(stub.CreateConsumer(wm.CreateConsumerRequest(stream="solo-jobs", config=wm.ConsumerConfigPb(
        name="w", ack_wait_ms=30_000)), timeout=call_timeout_s))
    fetched = ok(stub.Fetch(wm.FetchRequest(stream="solo-jobs", consumer="w", batch_size=4),
                            timeout=call_timeout_s))
    assert [(m.seq, m.deliver_count) for m in fetched.messages] == [(1, 1), (2, 1), (3, 1),
                                                                     (4, 1)]
    ok(stub.Ack(wm.AckRequest(stream="solo-jobs", consumer="w", seq=1), timeout=call_timeout_s))
    ok(stub.Nak(wm.NakRequest(stream="solo-jobs", consumer="w", seq=2), timeout=call_timeout_s))
    ok(stub.Term(wm.TermRequest(stream="solo-jobs", consumer="w", seq=3), timeout=call_timeout_s))
    ok(stub.InProgress(wm.InProgressRequest(stream="solo-jobs", consumer="w", seq=4),
                       timeout=call_timeout_s))
    again = ok(stub.Fetch(wm.FetchRequest(stream="solo-jobs", consumer="w", batch_size=4),
                          timeout=call_timeout_s))
    assert [(m.seq, m.deliver_count) for m in again.messages] == [(2, 2)]
    ok(stub.Ack(wm.AckRequest(stream="solo-jobs", consumer="w", seq=2), timeout=call_timeout_s))
    ok(stub.Ack(wm.AckRequest(stream="solo-jobs", consumer="w", seq=4), timeout=call_timeout_s))
    state = ok(stub.GetConsumerInfo(wm.GetConsumerInfoRequest(stream="solo-jobs", consumer="w"),
                                    timeout=call_timeout_s)).consumer
    assert (state.ack_floor, state.last_delivered) == (4, 4)
    failed(stub.Ack(wm.AckRequest(stream="solo-jobs", consumer="nobody", seq=1),
                    timeout=call_timeout_s), "no_such_consumer")

    ok(stub.CreateConsumer(wm.CreateConsumerRequest(stream="solo-jobs", config=wm.ConsumerConfigPb(
        name="tail", delivery_policy=wm.DeliveryPolicyPb(type=wm.DELIVERY_BY_START_SEQ,
                                                         start_seq=3))),
        timeout=call_timeout_s))
    assert sorted(c.config.name for c in ok(stub.ListConsumers(wm.ListConsumersRequest(
        stream="solo-jobs"), timeout=call_timeout_s)).consumers) == ["tail", "w"]
    events = list(stub.Subscribe(wm.SubscribeRequest(stream="solo-jobs", consumer="tail",
                                                     stop_when_empty=True),
                                 timeout=call_timeout_s))
    assert [e.message.seq for e in events if e.WhichOneof("event") == "message"] == [3, 4]
    assert events[-1].WhichOneof("event") == "stopped"
    ok(stub.DeleteConsumer(wm.DeleteConsumerRequest(stream="solo-jobs", consumer="tail"),
                           timeout=call_timeout_s))
    failed(stub.DeleteConsumer(wm.DeleteConsumerRequest(stream="solo-jobs", consumer="tail"),
                               timeout=call_timeout_s), "no_such_consumer")


def test_sources_and_objects_alone(channel: grpc.Channel, stub: Any, wm: Any) -> None:
    ok(stub.CreateStream(wm.CreateStreamRequest(config=wm.StreamConfigPb(
        name="solo-src", subjects_filter=["o.>"])), timeout=call_timeout_s))
    ok(stub.CreateStream(wm.CreateStreamRequest(config=wm.StreamConfigPb(
        name="solo-copy", sources=[wm.StreamSourceConfigPb(source_stream="solo-src")])),
        timeout=call_timeout_s))
    for k in range(3):
        ok(stub.Publish(wm.PublishRequest(stream="solo-src", subject="o.x", payload=b"%d" % k),
                        timeout=call_timeout_s))

    def tail_seq() -> list[int]:
        listed = ok(stub.GetStreamSources(wm.GetStreamSourcesRequest(), timeout=call_timeout_s))
        return [e.last_sourced_seq for e in listed.entries if e.sourcing_stream == "solo-copy"]

    wait_until(lambda: tail_seq() == [3], copy_timeout_s, interval_s=0.2, what="the copy")
    info = ok(stub.GetStreamInfo(wm.GetStreamInfoRequest(name="solo-copy"),
                                 timeout=call_timeout_s))
    assert [(s.source_stream, s.last_sourced_seq) for s in info.sources_status] == [
        ("solo-src", 3)]

    objects_pb2_grpc.ObjectsStub(channel).CreateBucket(objects_pb2.CreateBucketRequest(
        config=objects_pb2.BucketConfig(name="solo")), timeout=call_timeout_s)
    data = b"alone" * 1000
    put = ok(stub.PutObject(wm.PutObjectRequest(bucket="solo", name="f", payload=data,
                                                chunk_size=1024), timeout=call_timeout_s))
    assert (put.info.chunk_count, put.info.sha256) == (5, hashlib.sha256(data).hexdigest())
    assert ok(stub.GetObject(wm.GetObjectRequest(bucket="solo", name="f"),
                             timeout=call_timeout_s)).payload == data
    ranged = ok(stub.GetObjectRange(wm.GetObjectRangeRequest(bucket="solo", name="f",
                                                             offset=1020, len=10),
                                    timeout=call_timeout_s))
    assert ranged.payload == data[1020:1030]
    failed(stub.GetObject(wm.GetObjectRequest(bucket="none", name="f"), timeout=call_timeout_s),
           "no_such_bucket")


def test_cluster_calls_answer_unimplemented_alone(node: NodeProcess, stub: Any, wm: Any) -> None:
    """No token is needed to learn that: a node alone refuses before it checks credentials."""
    for method in CLUSTER_ONLY:
        request = getattr(wm, f"{method}Request")()
        with pytest.raises(grpc.RpcError) as refused:
            reply = getattr(stub, method)(request, timeout=call_timeout_s)
            if method == "WatchStreams":
                next(reply)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED, method
        assert f"{method} needs a cluster" in (refused.value.details() or ""), method
    ok(stub.CreateStream(wm.CreateStreamRequest(config=wm.StreamConfigPb(name="solo-after")),
                         timeout=call_timeout_s))  # still serving
    assert node.proc is not None and node.proc.poll() is None
