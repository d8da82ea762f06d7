"""Topics end to end on a real 3-process cluster (one cluster for the module): a 6-partition
topic whose partitions have primaries on all three nodes, keys routed as sarama's hash
partitioner routes them whichever node is asked, a keyless publish with a msg_id repeated
through another node stored once, a consumer group across the partitions with
its offsets read and set, an incomplete topic refused and repaired, delete, bad input, the CLI,
and (last) a kill -9 of a partition's primary after which the partition takes writes again with
every acknowledged message kept.

Processes are signalled by pid through LocalCluster, which stops them all afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftlog.base import topics
from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.node.ops.partitions import key_of, partition_for, partition_for_key
from raftlog.node.transport.rpc import from_rpc_error, grpc_status
from raftlog.v1 import consumers_pb2, streams_pb2, topics_pb2, topics_pb2_grpc, types_pb2

call_timeout_s = 10.0
failover_timeout_s = 30.0
cli_timeout_s = 60.0
TOPIC = "orders.eu"
PARTITIONS = 6
GROUP = "billing"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    made = LocalCluster(tmp_path_factory.mktemp("topics") / "cluster", nodes=3)
    try:
        yield made.start_all()
    finally:
        made.stop_all()


def api(cluster: LocalCluster, i: int) -> Any:
    return topics_pb2_grpc.TopicsStub(cluster.channel(i))  # type: ignore[no-untyped-call]


def expect_error(call: Any, request: object, reason: Reason) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=call_timeout_s)
    assert info.value.code() == grpc_status(reason), info.value.details()
    err = from_rpc_error(info.value)
    assert err is not None and err.reason is reason, info.value.details()


def publish(cluster: LocalCluster, i: int, *, topic: str = TOPIC, **fields: Any
            ) -> topics_pb2.PublishToTopicResponse:
    reply: topics_pb2.PublishToTopicResponse = api(cluster, i).PublishToTopic(
        topics_pb2.PublishToTopicRequest(topic=topic, **fields), timeout=call_timeout_s)
    return reply


def publish_when_writable(cluster: LocalCluster, i: int, **fields: Any
                          ) -> topics_pb2.PublishToTopicResponse:
    """A new partition stream answers UNAVAILABLE until its primary heard from its replicas,
    as any new stream does: retried (bounded)."""
    replies = []

    def published() -> bool:
        try:
            replies.append(publish(cluster, i, **fields))
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True

    wait_until(published, failover_timeout_s, interval_s=0.1, what="a partition writable")
    return replies[0]


@pytest.fixture(scope="module")
def topic(cluster: LocalCluster) -> topics_pb2.TopicInfo:
    info: topics_pb2.TopicInfo = api(cluster, 1).CreateTopic(topics_pb2.CreateTopicRequest(
        name=TOPIC, partitions=PARTITIONS), timeout=call_timeout_s)
    return info


def test_a_topics_partitions_have_primaries_on_every_node(cluster: LocalCluster,
                                                          topic: topics_pb2.TopicInfo) -> None:
    assert topic.complete and topic.partitions == PARTITIONS
    assert [p.stream for p in topic.partition_infos] == [
        topics.partition_stream(TOPIC, i) for i in range(PARTITIONS)]
    primaries = [publish_when_writable(cluster, 2, partition=i, payload=b"hello").primary
                 for i in range(PARTITIONS)]
    assert sorted(primaries) == ["n1", "n1", "n2", "n2", "n3", "n3"]
    seen = api(cluster, 3).GetTopic(topics_pb2.GetTopicRequest(name=TOPIC),
                                    timeout=call_timeout_s)
    assert seen.complete and [p.info.state.last_seq for p in seen.partition_infos] == [1] * 6
    listed = api(cluster, 2).ListTopics(topics_pb2.ListTopicsRequest(), timeout=call_timeout_s)
    assert TOPIC in [t.name for t in listed.topics]


def test_a_key_goes_to_its_hash_partition_through_any_node(
        cluster: LocalCluster, topic: topics_pb2.TopicInfo) -> None:
    last: dict[int, int] = {}
    for n in range(30):
        key = f"customer-{n % 10}".encode()
        reply = publish(cluster, 1 + n % 3, key=key, payload=f"m{n}".encode())
        assert reply.partition == partition_for_key(key, PARTITIONS)
        assert reply.seq > last.get(reply.partition, 0)  # each partition its own order
        last[reply.partition] = reply.seq
    assert publish(cluster, 3, key=b"", payload=b"empty key").partition == \
        partition_for_key(b"", PARTITIONS)
    assert 0 <= publish(cluster, 2, payload=b"no key").partition < PARTITIONS


def test_a_keyless_publish_repeated_through_another_node_is_stored_once(
        cluster: LocalCluster, topic: topics_pb2.TopicInfo) -> None:
    """No key: the msg_id's hash picks the partition, so a retry through any node reaches
    the partition of the first send, whose dedupe window answers it with the first seq."""
    for n in range(6):
        msg_id = f"once-{n}"
        first = publish(cluster, 1 + n % 3, msg_id=msg_id, payload=b"first")
        again = publish(cluster, 1 + (n + 1) % 3, msg_id=msg_id, payload=b"retry")
        assert first.partition == partition_for(key=None, msg_id=msg_id, partitions=PARTITIONS)
        assert not first.duplicate and again.duplicate
        assert (again.partition, again.stream, again.seq) == (
            first.partition, first.stream, first.seq)
    stored: dict[str, list[bytes]] = {}
    for part in topic.partition_infos:
        read = cluster.streams(2).ReadMessages(streams_pb2.ReadMessagesRequest(
            stream=part.stream, from_seq=1, limit=1000), timeout=call_timeout_s)
        for message in read.messages:
            if message.msg_id.startswith("once-"):
                stored.setdefault(message.msg_id, []).append(message.payload)
    assert stored == {f"once-{n}": [b"first"] for n in range(6)}


def test_a_group_consumes_every_partition_and_its_offsets_move(
        cluster: LocalCluster, topic: topics_pb2.TopicInfo) -> None:
    made = api(cluster, 2).CreateTopicGroup(topics_pb2.CreateTopicGroupRequest(
        topic=TOPIC, config=consumers_pb2.ConsumerConfig(name=GROUP)), timeout=call_timeout_s)
    assert [c.stream for c in made.consumers] == [p.stream for p in topic.partition_infos]
    counts = {}
    for part in topic.partition_infos:
        fetched = cluster.consumers(1 + part.partition % 3).Fetch(consumers_pb2.FetchRequest(
            stream=part.stream, consumer=GROUP, batch=1000), timeout=call_timeout_s).messages
        for message in fetched:
            key = key_of(message)
            if key is not None:
                assert partition_for_key(key, PARTITIONS) == part.partition
        assert [m.seq for m in fetched] == list(range(1, len(fetched) + 1))
        cluster.consumers(3).Ack(consumers_pb2.AckRequest(
            stream=part.stream, consumer=GROUP, seqs=[m.seq for m in fetched]),
            timeout=call_timeout_s)
        counts[part.partition] = len(fetched)
    offsets = api(cluster, 3).GetTopicOffsets(topics_pb2.GetTopicOffsetsRequest(
        topic=TOPIC, group=GROUP), timeout=call_timeout_s)
    assert {p.partition: (p.ack_floor, p.last_seq) for p in offsets.partitions} == {
        i: (n, n) for i, n in counts.items()}

    moved = api(cluster, 1).SetTopicOffsets(topics_pb2.SetTopicOffsetsRequest(
        topic=TOPIC, group=GROUP, offsets=[topics_pb2.PartitionFloor(partition=0, ack_floor=0)]),
        timeout=call_timeout_s)
    assert [(p.partition, p.ack_floor) for p in moved.partitions] == [(0, 0)]
    again = cluster.consumers(2).Fetch(consumers_pb2.FetchRequest(
        stream=topic.partition_infos[0].stream, consumer=GROUP, batch=1000),
        timeout=call_timeout_s).messages
    assert [m.seq for m in again] == list(range(1, counts[0] + 1))  # delivered again
    expect_error(api(cluster, 2).SetTopicOffsets, topics_pb2.SetTopicOffsetsRequest(
        topic=TOPIC, group=GROUP, offsets=[topics_pb2.PartitionFloor(
            partition=1, ack_floor=counts[1] + 5)]), Reason.PAST_COMMITTED_END)


def test_bad_input_is_refused_with_its_reason(cluster: LocalCluster,
                                              topic: topics_pb2.TopicInfo) -> None:
    stub = api(cluster, 2)
    create = topics_pb2.CreateTopicRequest
    expect_error(stub.CreateTopic, create(name="a b", partitions=2), Reason.INVALID_NAME)
    expect_error(stub.CreateTopic, create(name="ok", partitions=0), Reason.INVALID_ARGUMENT)
    expect_error(stub.CreateTopic, create(name=TOPIC, partitions=3), Reason.TOPIC_EXISTS)
    expect_error(stub.CreateTopic, create(name="named", partitions=1,
                                          config=types_pb2.StreamConfig(name="x")),
                 Reason.INVALID_CONFIG)
    expect_error(stub.GetTopic, topics_pb2.GetTopicRequest(name="nope"), Reason.TOPIC_NOT_FOUND)
    expect_error(stub.PublishToTopic, topics_pb2.PublishToTopicRequest(topic="nope", key=b"k"),
                 Reason.TOPIC_NOT_FOUND)
    expect_error(stub.PublishToTopic, topics_pb2.PublishToTopicRequest(
        topic=TOPIC, partition=PARTITIONS), Reason.PARTITION_OUT_OF_RANGE)
    expect_error(stub.GetTopicOffsets, topics_pb2.GetTopicOffsetsRequest(
        topic=TOPIC, group="nobody"), Reason.CONSUMER_NOT_FOUND)
    expect_error(cluster.streams(1).CreateStream, streams_pb2.CreateStreamRequest(
        config=types_pb2.StreamConfig(name=topics.partition_stream("sneaky", 0))),
        Reason.INVALID_NAME)


def test_an_incomplete_topic_is_refused_then_repaired_and_deleted(cluster: LocalCluster) -> None:
    name = "half_done"
    cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(
        name=topics.partition_stream(name, 0),
        partition=types_pb2.TopicPartition(topic=name, index=0, count=3))),
        timeout=call_timeout_s)  # what a create cut short after one partition leaves
    stub = api(cluster, 3)
    info = stub.GetTopic(topics_pb2.GetTopicRequest(name=name), timeout=call_timeout_s)
    assert not info.complete and [p.HasField("info") for p in info.partition_infos] == [
        True, False, False]
    expect_error(stub.PublishToTopic, topics_pb2.PublishToTopicRequest(topic=name, partition=2),
                 Reason.TOPIC_INCOMPLETE)
    repaired = stub.CreateTopic(topics_pb2.CreateTopicRequest(name=name, partitions=3),
                                timeout=call_timeout_s)
    assert repaired.complete
    assert publish_when_writable(cluster, 3, topic=name, partition=2).seq == 1
    deleted = api(cluster, 1).DeleteTopic(topics_pb2.DeleteTopicRequest(name=name),
                                          timeout=call_timeout_s)
    assert deleted.deleted == 3
    expect_error(stub.GetTopic, topics_pb2.GetTopicRequest(name=name), Reason.TOPIC_NOT_FOUND)
    expect_error(stub.DeleteTopic, topics_pb2.DeleteTopicRequest(name=name),
                 Reason.TOPIC_NOT_FOUND)
    left = cluster.streams(2).ListStreams(streams_pb2.ListStreamsRequest(
        prefix=topics.partition_stream(name, 0)[:-1]), timeout=call_timeout_s)
    assert list(left.streams) == []


def cli(cluster: LocalCluster, *args: str) -> Any:
    env = {**os.environ, "RAFTLOG_SERVER": cluster.address(2)}
    done = subprocess.run([sys.executable, "-m", "raftlog.node.cli", *args, "--json"],
                          capture_output=True, text=True, timeout=cli_timeout_s, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_cli_creates_publishes_lists_and_removes(cluster: LocalCluster) -> None:
    made = cli(cluster, "topic", "create", "cli.t", "--partitions", "4")
    assert made["complete"] and made["partitions"] == 4
    sent = cli(cluster, "topic", "publish", "cli.t", "--key", "k1", "v1")
    assert sent["partition"] == partition_for_key(b"k1", 4) and sent["seq"] == 1
    assert "cli.t" in [t["name"] for t in cli(cluster, "topic", "ls")["topics"]]
    assert cli(cluster, "topic", "rm", "cli.t")["deleted"] == 4


def test_a_killed_partition_primary_loses_nothing_acknowledged(
        cluster: LocalCluster, topic: topics_pb2.TopicInfo, tmp_path: Path) -> None:
    partition = 1
    stream = topic.partition_infos[partition].stream
    victim = cluster.index_of(publish(cluster, 1, partition=partition, payload=b"x").primary)
    others = [i for i in (1, 2, 3) if i != victim]
    acked = {publish(cluster, others[n % 2], partition=partition,
                     payload=f"acked-{n}".encode()).seq: f"acked-{n}".encode()
             for n in range(20)}
    cluster.kill9(victim)
    started = time.monotonic()

    def writable() -> bool:
        try:
            publish(cluster, others[0], partition=partition, payload=b"after")
        except grpc.RpcError:
            return False
        return True

    wait_until(writable, failover_timeout_s, what=f"partition {partition} writable again")
    assert time.monotonic() - started < failover_timeout_s
    read = cluster.streams(others[1]).ReadMessages(streams_pb2.ReadMessagesRequest(
        stream=stream, from_seq=min(acked), limit=1000), timeout=call_timeout_s)
    stored = {m.seq: m.payload for m in read.messages}
    assert {seq: stored.get(seq) for seq in acked} == acked
