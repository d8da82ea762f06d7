"""Issue 17, item 2: `PublishFrames`, a stream of frames that each carry many messages, on a real
3-node cluster: every frame answered in order, the frames of one stream stored in their order
(through the primary, through another node, and mixed with frames for a stream led elsewhere),
and a frame that fails answers each of its messages with the error while the call goes on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftlog.base import limits
from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.node.ops.batches import expand_results
from raftlog.v1 import cluster_pb2, streams_pb2, types_pb2

call_timeout_s = 30.0
per_frame = 40


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("publish-frames") / "cluster"
    made = LocalCluster(root, nodes=3)
    try:
        yield made.start_all()
    finally:
        made.stop_all()


def led_by(cluster: LocalCluster, index: int, prefix: str) -> str:
    """A new R3 stream whose primary is node `index`."""
    for k in range(1000):
        name = f"{prefix}{k}"
        route = cluster.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(stream=name),
                                                timeout=call_timeout_s)
        if cluster.index_of(route.primary) == index:
            cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(
                config=types_pb2.StreamConfig(name=name, subjects=[f"{name}.>"], replicas=3)),
                timeout=call_timeout_s)
            cluster.streams(index).Publish(streams_pb2.PublishRequest(
                stream=name, subject=f"{name}.ready", payload=b"-"), timeout=call_timeout_s)
            return name
    raise AssertionError(f"no stream name placed on n{index}")


def frame(stream: str, tag: str, count: int = per_frame) -> streams_pb2.PublishBatchRequest:
    return streams_pb2.PublishBatchRequest(stream=stream, entries=[
        streams_pb2.PublishEntry(subject=f"{stream}.x", payload=f"{tag}/{i}".encode())
        for i in range(count)])


def send(cluster: LocalCluster, via: int, frames: list[streams_pb2.PublishBatchRequest]
         ) -> list[streams_pb2.PublishBatchResponse]:
    answers = cluster.streams(via).PublishFrames(iter(frames), timeout=call_timeout_s)
    return list(answers)


def stored_payloads(cluster: LocalCluster, stream: str) -> list[bytes]:
    payloads: list[bytes] = []
    next_seq = 1
    while True:
        page = cluster.streams(1).ReadMessages(streams_pb2.ReadMessagesRequest(
            stream=stream, from_seq=next_seq, limit=1000), timeout=call_timeout_s)
        payloads += [m.payload for m in page.messages if m.subject != f"{stream}.ready"]
        if not page.messages:
            return payloads
        next_seq = page.next_seq


def seqs_of(answer: streams_pb2.PublishBatchResponse) -> list[int]:
    return [result.ack.seq for result in expand_results(answer)]


@pytest.mark.parametrize("via", ["primary", "another node"])
def test_frames_are_answered_in_order_and_stored_in_their_order(
        cluster: LocalCluster, via: str) -> None:
    name = led_by(cluster, 2, f"frames-{via.replace(' ', '-')}-")
    frames = [frame(name, f"f{k}") for k in range(3 * limits.publish_frames_inflight_max)]
    answers = send(cluster, 2 if via == "primary" else 3, frames)
    assert [a.acked for a in answers] == [per_frame] * len(frames)
    seqs = [seq for answer in answers for seq in seqs_of(answer)]
    assert seqs == list(range(2, 2 + len(frames) * per_frame))  # seq 1 is the ready message
    expected = [entry.payload for f in frames for entry in f.entries]
    assert stored_payloads(cluster, name) == expected


def test_frames_for_streams_led_here_and_elsewhere_keep_each_streams_order(
        cluster: LocalCluster) -> None:
    here, there = led_by(cluster, 1, "mixed-here-"), led_by(cluster, 3, "mixed-there-")
    frames = [frame(here if k % 3 else there, f"m{k}") for k in range(30)]
    answers = send(cluster, 1, frames)
    assert [a.acked for a in answers] == [per_frame] * len(frames)
    for name in (here, there):
        mine = [k for k, f in enumerate(frames) if f.stream == name]
        answer_seqs = [seq for k in mine for seq in seqs_of(answers[k])]
        assert answer_seqs == sorted(answer_seqs) and answer_seqs[0] == 2
        expected = [entry.payload for k in mine for entry in frames[k].entries]
        assert stored_payloads(cluster, name) == expected


def test_a_failed_frame_answers_each_message_and_the_call_goes_on(cluster: LocalCluster) -> None:
    name = led_by(cluster, 2, "frames-bad-")
    frames = [
        frame(name, "ok0"),
        frame("no-such-stream", "lost", count=3),
        frame(name, "big", count=limits.batch_messages_max + 1),
        frame("bad name!", "lost", count=2),
        frame(name, "ok1"),
    ]
    answers = send(cluster, 1, frames)
    assert [a.acked for a in answers] == [per_frame, 0, 0, 0, per_frame]
    reasons = [{r.error.reason for r in a.results} for a in answers[1:4]]
    assert reasons == [{Reason.STREAM_NOT_FOUND.name}, {Reason.BATCH_TOO_LARGE.name},
                       {Reason.INVALID_NAME.name}]
    assert [a.failed for a in answers[1:4]] == [3, limits.batch_messages_max + 1, 2]
    assert stored_payloads(cluster, name) == [entry.payload for f in (frames[0], frames[4])
                                              for entry in f.entries]


def test_a_call_without_frames_ends_at_once(cluster: LocalCluster) -> None:
    assert send(cluster, 1, []) == []


def test_a_frame_that_does_not_parse_ends_the_call_after_storing_nothing_of_it(
        cluster: LocalCluster) -> None:
    name = led_by(cluster, 1, "frames-garbage-")
    method = cluster.channel(1).stream_stream(
        "/raftlog.v1.Streams/PublishFrames", request_serializer=None,
        response_deserializer=streams_pb2.PublishBatchResponse.FromString)
    good = frame(name, "kept").SerializeToString()
    with pytest.raises(grpc.RpcError) as caught:
        list(method(iter([good, b"\xff\xff\xff"]), timeout=call_timeout_s))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert stored_payloads(cluster, name) == [e.payload for e in frame(name, "kept").entries]
