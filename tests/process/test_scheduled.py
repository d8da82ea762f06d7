"""Scheduled (delayed) messages end to end on a real 3-process cluster, over raftlog.v1 and the
CLI (docs/scheduled.md).

- A publish due in a few seconds answers with its schedule stream and seq; the target shows
  nothing (GetStreamInfo, ReadMessages) until it is due, then holds it once, with the original
  msg_id and the Raftlog-Scheduled-At header; the schedule is empty afterwards. A time in the
  past publishes at once; one too far ahead is INVALID_ARGUMENT.
- ListScheduled and CancelScheduled through a node that is not the schedule stream's primary;
  a cancelled message is never delivered, a second cancel is NOT_FOUND.
- PublishToTopic with deliver_at_ms: the key's partition gets it when due.
- kill -9 of the schedule stream's primary (another node than the target's) before the
  messages are due: the new primary delivers every one of them, each once.
- The CLI: `pub --delay`, `stream scheduled --json`, `stream unschedule`.

One cluster for the module; processes are signalled by pid and stopped at the end.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from raftlog.base import limits
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.node.cli.main import main as cli_main
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import (
    cluster_pb2,
    streams_pb2,
    topics_pb2,
    topics_pb2_grpc,
    types_pb2,
)

T = TypeVar("T")
call_timeout_s = 5.0
due_timeout_s = 20.0  # due -> in the target
failover_timeout_s = 40.0  # kill -9 of the schedule's primary -> delivered by the new one


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("scheduled") / "cluster"
    local = LocalCluster(root, nodes=3)
    try:
        yield local.start_all()
    finally:
        local.stop_all()


@pytest.fixture(autouse=True)
def _every_node_back(cluster: LocalCluster) -> Iterator[None]:
    yield
    stopped = [i for i in cluster.specs if i not in cluster.running]
    for i in stopped:
        cluster.start(i)
    if stopped:
        cluster.wait_for_leader(failover_timeout_s)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _any(cluster: LocalCluster, call: Callable[[int], T], *, timeout_s: float = 20.0) -> T:
    """`call(i)` through the running nodes in turn until one answers."""
    deadline = time.monotonic() + timeout_s
    while True:
        for i in sorted(cluster.running):
            try:
                return call(i)
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.DEADLINE_EXCEEDED,
                                      grpc.StatusCode.CANCELLED):
                    raise
                if time.monotonic() > deadline:
                    raise
        time.sleep(0.1)


def _primary(cluster: LocalCluster, stream: str) -> int:
    route = _any(cluster, lambda i: cluster.cluster(i).ExplainRoute(
        cluster_pb2.ExplainRouteRequest(stream=stream), timeout=call_timeout_s))
    return cluster.index_of(route.primary)


def _target(cluster: LocalCluster, prefix: str, *, primary: int, schedule_primary: int) -> str:
    """A new stream name whose primary is `primary` and whose schedule stream's (by the
    ring) is `schedule_primary`; the stream is created."""
    for k in range(2000):
        name = f"{prefix}{k}"
        if _primary(cluster, name) == primary and \
                _primary(cluster, f"SCHED_{name}") == schedule_primary:
            _create(cluster, name)
            return name
    raise AssertionError(f"no name for primaries {primary}, {schedule_primary}")


def _create(cluster: LocalCluster, name: str) -> None:
    request = streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(name=name))
    _any(cluster, lambda i: cluster.streams(i).CreateStream(request, timeout=call_timeout_s))


def _publish(cluster: LocalCluster, via: int, stream: str, subject: str, *, deliver_at_ms: int,
             msg_id: str = "") -> streams_pb2.PublishAck:
    ack: streams_pb2.PublishAck = cluster.streams(via).Publish(streams_pb2.PublishRequest(
        stream=stream, subject=subject, payload=subject.encode(), msg_id=msg_id,
        deliver_at_ms=deliver_at_ms), timeout=call_timeout_s)
    return ack


def _read_all(cluster: LocalCluster, stream: str) -> list[types_pb2.Message]:
    reply = _any(cluster, lambda i: cluster.streams(i).ReadMessages(
        streams_pb2.ReadMessagesRequest(stream=stream, limit=1000), timeout=call_timeout_s))
    return list(reply.messages)


def _listed(cluster: LocalCluster, stream: str, *, via: int | None = None
            ) -> list[streams_pb2.ScheduledMessage]:
    request = streams_pb2.ListScheduledRequest(stream=stream)
    if via is not None:
        return list(cluster.streams(via).ListScheduled(request, timeout=call_timeout_s).messages)
    return list(_any(cluster, lambda i: cluster.streams(i).ListScheduled(
        request, timeout=call_timeout_s)).messages)


def _refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error = from_rpc_error(caught.value)
    return caught.value.code(), error.reason.name if error else ""


def test_a_delayed_publish_appears_once_when_due(cluster: LocalCluster) -> None:
    target = _target(cluster, "late-", primary=1, schedule_primary=2)
    due = _now_ms() + 3_000
    ack = _publish(cluster, 3, target, "late.a", deliver_at_ms=due, msg_id="m-1")
    assert (ack.scheduled, ack.stream, ack.seq, ack.deliver_at_ms) == (
        True, f"SCHED_{target}", 1, due)
    info = cluster.streams(3).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name=target),
                                            timeout=call_timeout_s)
    assert info.state.messages == 0 and _read_all(cluster, target) == []
    (listed,) = _listed(cluster, target, via=1)
    assert (listed.schedule_seq, listed.deliver_at_ms, listed.subject, listed.msg_id) == (
        1, due, "late.a", "m-1")

    wait_until(lambda: len(_read_all(cluster, target)) == 1, due_timeout_s, interval_s=0.2,
               what="the delayed message in its stream")
    assert _now_ms() >= due
    (message,) = _read_all(cluster, target)
    headers = {h.key: h.value for h in message.headers}
    assert (message.subject, message.payload, message.msg_id) == ("late.a", b"late.a", "m-1")
    assert headers["Raftlog-Scheduled-At"] == str(due)
    wait_until(lambda: _listed(cluster, target) == [], due_timeout_s, interval_s=0.2,
               what="the schedule emptied")
    time.sleep(limits.scheduled_poll_ms * 3 / 1000)  # a repeated delivery would show by now
    assert len(_read_all(cluster, target)) == 1

    past = _publish(cluster, 2, target, "late.b", deliver_at_ms=_now_ms() - 60_000)
    assert not past.scheduled and past.stream == target and past.seq == 2
    code, reason = _refused(lambda: _publish(
        cluster, 1, target, "late.c",
        deliver_at_ms=_now_ms() + limits.scheduled_delay_ms_max + 60_000))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")


def test_list_and_cancel_through_any_node(cluster: LocalCluster) -> None:
    target = _target(cluster, "cancel-", primary=2, schedule_primary=3)
    due = _now_ms() + 4_000
    for k in range(3):
        _publish(cluster, 1, target, f"c.{k}", deliver_at_ms=due + k)
    assert [m.schedule_seq for m in _listed(cluster, target, via=1)] == [1, 2, 3]
    cancelled = cluster.streams(1).CancelScheduled(streams_pb2.CancelScheduledRequest(
        stream=target, schedule_seq=2), timeout=call_timeout_s)
    assert cancelled.message.subject == "c.1"
    assert [m.schedule_seq for m in _listed(cluster, target, via=2)] == [1, 3]
    code, reason = _refused(lambda: cluster.streams(2).CancelScheduled(
        streams_pb2.CancelScheduledRequest(stream=target, schedule_seq=2),
        timeout=call_timeout_s))
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "MESSAGE_NOT_FOUND")
    wait_until(lambda: len(_read_all(cluster, target)) == 2, due_timeout_s, interval_s=0.2,
               what="the two left delivered")
    assert [m.subject for m in _read_all(cluster, target)] == ["c.0", "c.2"]


def test_a_topic_publish_waits_for_its_partition(cluster: LocalCluster) -> None:
    topics = topics_pb2_grpc.TopicsStub(cluster.channel(1))
    topics.CreateTopic(topics_pb2.CreateTopicRequest(name="later.topic", partitions=2),
                       timeout=call_timeout_s)
    due = _now_ms() + 2_000
    reply = topics_pb2_grpc.TopicsStub(cluster.channel(3)).PublishToTopic(
        topics_pb2.PublishToTopicRequest(topic="later.topic", key=b"k1", payload=b"p",
                                         deliver_at_ms=due), timeout=call_timeout_s)
    partition_stream = f"TOPIC_later_dtopic_p{reply.partition}"
    assert reply.scheduled and reply.stream == f"SCHED_{partition_stream}"
    assert reply.deliver_at_ms == due
    wait_until(lambda: len(_read_all(cluster, partition_stream)) == 1, due_timeout_s,
               interval_s=0.2, what="the topic message in its partition")
    (message,) = _read_all(cluster, partition_stream)
    assert message.payload == b"p"


def test_kill9_of_the_schedule_primary_before_due_delivers_each_once(
        cluster: LocalCluster) -> None:
    target = _target(cluster, "survive-", primary=1, schedule_primary=2)
    due = _now_ms() + 3_000
    for k in range(5):
        _publish(cluster, 1, target, f"s.{k}", deliver_at_ms=due + 10 * k)
    assert _primary(cluster, f"SCHED_{target}") == 2
    cluster.kill9(2)
    wait_until(lambda: len(_read_all(cluster, target)) >= 5, failover_timeout_s,
               interval_s=0.3, what="every message delivered by the new schedule primary")
    cluster.start(2)
    cluster.wait_for_leader(failover_timeout_s)
    wait_until(lambda: _listed(cluster, target) == [], due_timeout_s, interval_s=0.3,
               what="the schedule emptied")
    time.sleep(limits.scheduled_poll_ms * 3 / 1000)
    messages = _read_all(cluster, target)
    assert [m.subject for m in messages] == [f"s.{k}" for k in range(5)]
    assert sorted(m.msg_id for m in messages) == [f"sched:{k}" for k in range(1, 6)]


def test_cli_pub_delay_scheduled_and_unschedule(cluster: LocalCluster,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    target = _target(cluster, "cli-late-", primary=3, schedule_primary=1)
    server = ["--server", cluster.address(2)]
    capsys.readouterr()
    assert cli_main([*server, "pub", target, "cli.a", "one", "--delay", "1h", "--json"]) == 0
    ack = json.loads(capsys.readouterr().out)["acks"][0]
    assert ack["scheduled"] is True and ack["stream"] == f"SCHED_{target}"
    assert cli_main([*server, "pub", target, "cli.b", "two", "--delay", "2s"]) == 0
    assert "scheduled #2 cli.b" in capsys.readouterr().out
    assert cli_main([*server, "stream", "scheduled", target, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["messages"]
    assert [m["subject"] for m in listed] == ["cli.a", "cli.b"]
    assert cli_main([*server, "stream", "unschedule", target, "1"]) == 0
    assert "cancelled #1 cli.a" in capsys.readouterr().out
    wait_until(lambda: [m.subject for m in _read_all(cluster, target)] == ["cli.b"],
               due_timeout_s, interval_s=0.2, what="the 2s message delivered")
    assert cli_main([*server, "stream", "scheduled", target]) == 0
    assert "no scheduled messages" in capsys.readouterr().out
    assert cli_main([*server, "pub", target, "cli.c", "now", "--deliver-at",
                     str(_now_ms() - 1_000), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["acks"][0]["seq"] == 2
    assert cli_main([*server, "stream", "unschedule", target, "1"]) == 1
    assert "MESSAGE_NOT_FOUND" in capsys.readouterr().err
