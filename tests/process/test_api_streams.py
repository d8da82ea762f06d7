"""The Streams API end to end: a real node process, spoken to over gRPC."""

from __future__ import annotations

import grpc
import pytest

from raftlog.base import limits
from raftlog.base.errors import Reason
from raftlog.chaos.nodeproc import NodeProcess
from raftlog.node.ops.batches import acked_seqs
from raftlog.node.transport.rpc import from_rpc_error, grpc_status
from raftlog.v1 import streams_pb2, types_pb2
from tests.conftest import Clients


def expect_error(call: object, request: object, reason: Reason) -> dict[str, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)  # type: ignore[operator]
    assert info.value.code() == grpc_status(reason), info.value.details()
    err = from_rpc_error(info.value)
    assert err is not None and err.reason is reason, info.value.details()
    return err.metadata


def create(clients: Clients, name: str = "orders", **fields: object) -> types_pb2.StreamInfo:
    config = types_pb2.StreamConfig(name=name, **fields)  # type: ignore[arg-type]
    info: types_pb2.StreamInfo = clients.streams.CreateStream(
        streams_pb2.CreateStreamRequest(config=config), timeout=10)
    return info


def publish(clients: Clients, subject: str, payload: bytes = b"x", stream: str = "orders",
            **fields: object) -> streams_pb2.PublishAck:
    ack: streams_pb2.PublishAck = clients.streams.Publish(streams_pb2.PublishRequest(
        stream=stream, subject=subject, payload=payload, **fields), timeout=10)  # type: ignore[arg-type]
    return ack


def test_stream_lifecycle(clients: Clients) -> None:
    info = create(clients, subjects=["orders.>"], max_msgs=100, description="demo")
    assert info.config.replicas == limits.replicas_default
    assert clients.streams.GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="orders")).config \
        .description == "demo"
    create(clients, name="other")
    names = [s.config.name for s in clients.streams.ListStreams(
        streams_pb2.ListStreamsRequest()).streams]
    assert names == ["orders", "other"]
    for i in range(10):
        publish(clients, f"orders.{i % 3}")
    reply = clients.streams.UpdateStream(streams_pb2.UpdateStreamRequest(name="orders",
                                                                         max_msgs=4))
    assert reply.pruned == 6 and reply.info.state.messages == 4
    clients.streams.DeleteStream(streams_pb2.DeleteStreamRequest(name="other"))
    expect_error(clients.streams.GetStreamInfo, streams_pb2.GetStreamInfoRequest(name="other"),
                 Reason.STREAM_NOT_FOUND)


def test_publish_unary_batch_and_stream(clients: Clients) -> None:
    create(clients, subjects=["orders.>"])
    ack = publish(clients, "orders.eu", b"one", headers=[types_pb2.Header(key="k", value="v")])
    assert (ack.stream, ack.seq, ack.duplicate) == ("orders", 1, False)
    batch = clients.streams.PublishBatch(streams_pb2.PublishBatchRequest(
        stream="orders",
        entries=[streams_pb2.PublishEntry(subject="orders.eu", payload=b"%d" % i)
                 for i in range(100)] + [streams_pb2.PublishEntry(subject="bad", payload=b"")],
    ))
    assert (batch.acked, batch.failed, batch.first_seq) == (100, 1, 0)
    assert [r.ack.seq for r in batch.results[:100]] == list(range(2, 102))
    assert batch.results[100].error.reason == "SUBJECT_NOT_IN_STREAM"
    assert batch.results[100].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    requests = [streams_pb2.PublishRequest(stream="orders", subject="orders.us", payload=b"s")
                for _ in range(2500)]
    requests.append(streams_pb2.PublishRequest(stream="missing", subject="x", payload=b""))
    streamed = clients.streams.PublishStream(iter(requests), timeout=30)
    assert (streamed.acked, streamed.failed, streamed.first_seq) == (2500, 1, 0)
    assert streamed.results[-2].ack.seq == 2601
    assert streamed.results[-1].error.reason == "STREAM_NOT_FOUND"
    message = clients.streams.GetMessage(streams_pb2.GetMessageRequest(stream="orders", seq=1))
    assert (message.subject, message.payload, message.headers[0].key) == ("orders.eu", b"one", "k")
    assert message.ts_ms > 0


def test_optimistic_concurrency_and_dedupe(clients: Clients) -> None:
    create(clients)
    publish(clients, "a", msg_id="m-1")
    publish(clients, "b")
    again = publish(clients, "a", b"retry", msg_id="m-1")
    assert (again.seq, again.duplicate) == (1, True)
    metadata = expect_error(clients.streams.Publish, streams_pb2.PublishRequest(
        stream="orders", subject="a", expected_last_seq=1), Reason.WRONG_LAST_SEQ)
    assert metadata == {"last_seq": "2"}
    metadata = expect_error(clients.streams.Publish, streams_pb2.PublishRequest(
        stream="orders", subject="a", expected_last_subject_seq=0), Reason.WRONG_LAST_SUBJECT_SEQ)
    assert metadata == {"last_subject_seq": "1"}
    assert publish(clients, "a", expected_last_seq=2, expected_last_subject_seq=1).seq == 3


def test_subject_reads_and_purge(clients: Clients) -> None:
    create(clients)
    for subject in ["kv.a", "kv.b", "kv.a", "z", "kv.a"]:
        publish(clients, subject)
    latest = clients.streams.ReadLatestAtSubject(streams_pb2.ReadLatestAtSubjectRequest(
        stream="orders", subject="kv.a"))
    assert latest.seq == 5
    listed = clients.streams.ListSubjectsByPrefix(streams_pb2.ListSubjectsByPrefixRequest(
        stream="orders", prefix="kv.", limit=1))
    assert [s.subject for s in listed.subjects] == ["kv.a"] and listed.truncated
    scanned = clients.streams.ScanExactAtSubject(streams_pb2.ScanExactAtSubjectRequest(
        stream="orders", subject="kv.a", from_seq=2))
    assert [m.seq for m in scanned.messages] == [3, 5] and scanned.next_seq == 0
    purged = clients.streams.PurgeStream(streams_pb2.PurgeStreamRequest(name="orders",
                                                                         subject="kv.>"))
    assert purged.purged == 4
    expect_error(clients.streams.GetMessage, streams_pb2.GetMessageRequest(stream="orders", seq=1),
                 Reason.MESSAGE_NOT_FOUND)
    assert clients.streams.GetMessage(streams_pb2.GetMessageRequest(stream="orders", seq=4)) \
        .subject == "z"


@pytest.mark.parametrize(
    ("method", "request_", "reason"),
    [
        ("CreateStream", streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(name="a/b")),
         Reason.INVALID_NAME),
        ("CreateStream", streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(
            name="x" * 200)), Reason.INVALID_NAME),
        ("CreateStream", streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(
            name="s", subjects=["a.>.b"])), Reason.INVALID_SUBJECT),
        ("CreateStream", streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(
            name="s", max_bytes=5, max_msg_bytes=10)), Reason.INVALID_CONFIG),
        ("CreateStream", streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(
            name="orders", max_msgs=1)), Reason.STREAM_EXISTS),
        ("GetStreamInfo", streams_pb2.GetStreamInfoRequest(name="nope"), Reason.STREAM_NOT_FOUND),
        ("GetStreamInfo", streams_pb2.GetStreamInfoRequest(name=""), Reason.INVALID_NAME),
        ("UpdateStream", streams_pb2.UpdateStreamRequest(name="orders", max_msgs=1,
                                                         max_msgs_per_subject=5),
         Reason.INVALID_CONFIG),
        ("Publish", streams_pb2.PublishRequest(stream="orders", subject="bad..subject"),
         Reason.INVALID_SUBJECT),
        ("Publish", streams_pb2.PublishRequest(stream="orders", subject="a.>"),
         Reason.INVALID_SUBJECT),
        ("Publish", streams_pb2.PublishRequest(stream="nope", subject="a"),
         Reason.STREAM_NOT_FOUND),
        ("Publish", streams_pb2.PublishRequest(stream="orders", subject="a",
                                               payload=b"x" * (limits.message_bytes_max + 1)),
         Reason.MESSAGE_TOO_LARGE),
        ("PublishBatch", streams_pb2.PublishBatchRequest(stream="orders", entries=[
            streams_pb2.PublishEntry(subject="a")] * (limits.batch_messages_max + 1)),
         Reason.BATCH_TOO_LARGE),
        ("GetMessage", streams_pb2.GetMessageRequest(stream="orders", seq=0),
         Reason.INVALID_ARGUMENT),
        ("GetMessage", streams_pb2.GetMessageRequest(stream="orders", seq=99),
         Reason.MESSAGE_NOT_FOUND),
        ("ReadLatestAtSubject", streams_pb2.ReadLatestAtSubjectRequest(stream="orders",
                                                                       subject="a.*"),
         Reason.INVALID_SUBJECT),
        ("ScanExactAtSubject", streams_pb2.ScanExactAtSubjectRequest(
            stream="orders", subject="a", limit=limits.scan_limit_max + 1),
         Reason.INVALID_ARGUMENT),
        ("PurgeStream", streams_pb2.PurgeStreamRequest(name="orders", subject="a.>.b"),
         Reason.INVALID_SUBJECT),
    ],
)
def test_bad_input_gets_status_and_reason_and_loses_nothing(
    clients: Clients, method: str, request_: object, reason: Reason
) -> None:
    create(clients, max_msgs=100)
    publish(clients, "a", b"keep")
    expect_error(getattr(clients.streams, method), request_, reason)
    info = clients.streams.GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="orders"))
    assert (info.state.messages, info.config.max_msgs) == (1, 100)
    assert clients.streams.GetMessage(streams_pb2.GetMessageRequest(stream="orders", seq=1)) \
        .payload == b"keep"


def test_request_over_the_size_limit_is_refused(clients: Clients) -> None:
    create(clients)
    with pytest.raises(grpc.RpcError) as info:
        publish(clients, "a", b"x" * (limits.request_bytes_max + 1))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert publish(clients, "a").seq == 1


def test_acknowledged_messages_survive_kill9_and_restart(node_proc: NodeProcess) -> None:
    with node_proc.channel() as channel:
        clients = Clients(channel)
        create(clients, subjects=["o.>"], max_msgs_per_subject=5000)
        acked = {publish(clients, f"o.{i % 7}", b"u%d" % i, msg_id=f"id{i}").seq
                 for i in range(50)}
        batch = clients.streams.PublishBatch(streams_pb2.PublishBatchRequest(
            stream="orders", entries=[streams_pb2.PublishEntry(subject="o.b", payload=b"b%d" % i)
                                      for i in range(2000)]), timeout=30)
        assert (batch.first_seq, batch.stream, batch.acked) == (51, "orders", 2000)
        acked |= set(acked_seqs(batch))
    node_proc.kill9()
    node_proc.start()
    with node_proc.channel() as channel:
        clients = Clients(channel)
        info = clients.streams.GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="orders"))
        assert info.state.messages == len(acked) == 2050
        assert info.state.last_seq == 2050
        for seq in (1, 50, 51, 2050):
            assert clients.streams.GetMessage(streams_pb2.GetMessageRequest(stream="orders",
                                                                            seq=seq)).payload
        dup = publish(clients, "o.3", b"again", msg_id="id3")
        assert (dup.seq, dup.duplicate) == (4, True)
        assert publish(clients, "o.x").seq == 2051


def test_sigterm_drains_and_exits_cleanly(node_proc: NodeProcess) -> None:
    with node_proc.channel() as channel:
        create(Clients(channel))
    assert node_proc.stop() == 0


def test_health_and_reflection_are_served(node_proc: NodeProcess) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with node_proc.channel() as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = list(stub.ServerReflectionInfo(iter([
            reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10))
        names = {s.name for s in replies[0].list_services_response.service}
        assert {"raftlog.v1.Streams", "raftlog.v1.Consumers", "grpc.health.v1.Health"} <= names
