"""Issue 16 item 3 end to end on one 3-node cluster (docs/auth.md), beside test_auth.py:

- the stream's primary itself enforces the identity a forwarded call carries: a call signed
  as a forwarding node would sign it (the `raftlog-identity` header, made with the cluster
  secret) for a user who may only publish to `orders.eu.>` is PERMISSION_DENIED by the primary
  for `orders.us.x` (if the primary trusted a forwarder blindly, it would be stored); the
  header's principal cannot be swapped, nor the header reused for another method, and one
  naming no user is refused;
- denied admin and publish calls of a user without the rights (DeleteStream, CreateConsumer,
  DeleteConsumer, a Kafka-Pixy Produce, a RocketMQ v2 SendMessage), here and through a node
  that forwards, change and store nothing;
- users and their tokens survive a restart of every node (the cluster down, then up on the
  same data).

The tests run in order and share the users they add (module state in `USERS`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest

from raftlog.base import topics as topic_names
from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.compat import kafkapixy_pb2, kafkapixy_pb2_grpc
from raftlog.compat import rocketmq_v2_definition_pb2 as rmq
from raftlog.compat import rocketmq_v2_service_pb2 as rmq_svc
from raftlog.compat import rocketmq_v2_service_pb2_grpc as rmq_grpc
from raftlog.node.transport.auth import IDENTITY_HEADER, mq_signature
from raftlog.v1 import (
    cluster_pb2,
    consumers_pb2,
    streams_pb2,
    topics_pb2,
    topics_pb2_grpc,
    types_pb2,
)
from tests.process.cluster_helpers import error_reason as reason_of

call_timeout_s = 10.0
spread_timeout_s = 10.0  # a user change reaches every node's metadata within this
restart_timeout_s = 60.0
STREAM = "orders"
TOPICS = ("orders.eu.kp", "orders.us.kp")
PUBLISH = "/raftlog.v1.Streams/Publish"
USERS: dict[str, str] = {}  # name -> token
MQ_KEYS: dict[str, str] = {}  # name -> RocketMQ secret key


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    made = LocalCluster(tmp_path_factory.mktemp("auth-forwarding") / "cluster", nodes=3)
    try:
        yield made.start_all()
    finally:
        made.stop_all()


def bearer(user: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {USERS[user]}")]


def cli(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTLOG_")}
    done = subprocess.run(
        [sys.executable, "-m", "raftlog.node.cli", *args, "--server", cluster.address(1),
         "--secret-file", str(cluster.secret_path), "--json"],
        capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def stream_info(cluster: LocalCluster, name: str = STREAM, *, via: int = 1
                ) -> types_pb2.StreamInfo:
    info: types_pb2.StreamInfo = cluster.streams(via).GetStreamInfo(
        streams_pb2.GetStreamInfoRequest(name=name), timeout=call_timeout_s,
        metadata=bearer("admin"))
    return info


def last_seq(cluster: LocalCluster, name: str = STREAM) -> int:
    return int(stream_info(cluster, name).state.last_seq)


def consumer_names(cluster: LocalCluster) -> list[str]:
    listed = cluster.consumers(1).ListConsumers(consumers_pb2.ListConsumersRequest(
        stream=STREAM), timeout=call_timeout_s, metadata=bearer("admin"))
    return sorted(consumer.config.name for consumer in listed.consumers)


def primary_and_others(cluster: LocalCluster) -> tuple[int, list[int]]:
    route = cluster.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(stream=STREAM),
                                            timeout=call_timeout_s, metadata=bearer("admin"))
    primary = cluster.index_of(route.primary)
    return primary, [i for i in sorted(cluster.running) if i != primary]


def forwarded_as(cluster: LocalCluster, user: str, method: str = PUBLISH) -> str:
    """The identity header a forwarding node sends for `user`'s call of `method`
    (auth.identity_headers): a call token signed with the cluster secret."""
    return cluster.credential().token(principal=f"user-{user}", method=method)


def publish_forwarded(cluster: LocalCluster, node: int, subject: str, header: str) -> Any:
    """A Publish as a forwarding node sends it: the signed identity, no token of the user."""
    return cluster.streams(node).Publish(
        streams_pb2.PublishRequest(stream=STREAM, subject=subject, payload=b"f"),
        timeout=call_timeout_s, metadata=[(IDENTITY_HEADER, header)])


def test_setup_a_stream_and_users(cluster: LocalCluster) -> None:
    def created() -> bool:
        try:
            cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(
                config=types_pb2.StreamConfig(name=STREAM, subjects=["orders.>"], replicas=3)),
                timeout=call_timeout_s)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                raise
            return False
        return True

    wait_until(created, 15, interval_s=0.1, what="stream created")
    cluster.consumers(1).CreateConsumer(consumers_pb2.CreateConsumerRequest(
        stream=STREAM, config=consumers_pb2.ConsumerConfig(name="all")), timeout=call_timeout_s)
    topics: Any = topics_pb2_grpc.TopicsStub(cluster.channel(1))  # type: ignore[no-untyped-call]
    for topic in TOPICS:
        request = topics_pb2.CreateTopicRequest(name=topic, partitions=1,
                                                config=types_pb2.StreamConfig(replicas=3))
        wait_until(lambda request=request: reason_of(lambda: topics.CreateTopic(
            request, timeout=call_timeout_s)) is None, 15, interval_s=0.2,
            what=f"topic {request.name}")
    for name, flags in (("admin", ["--publish", ">", "--subscribe", ">",
                                   "--admin", "streams,consumers,cluster"]),
                        ("eu", ["--publish", "orders.eu.>", "--subscribe", "orders.eu.>"]),
                        ("nobody", [])):
        added = cli(cluster, "auth", "user", "add", name, *flags)
        USERS[name], MQ_KEYS[name] = added["token"], added["rocketmq_secret_key"]
    wait_until(lambda: all(reason_of(lambda i=i: cluster.streams(i).ListStreams(
        streams_pb2.ListStreamsRequest(), timeout=call_timeout_s)) is Reason.UNAUTHENTICATED
        for i in (1, 2, 3)), spread_timeout_s, interval_s=0.2, what="auth on every node")


def test_the_primary_enforces_the_forwarded_identity_itself(cluster: LocalCluster) -> None:
    """Straight to the primary, as a node that forwards (and so checked nothing) would send
    it: the primary applies the named user's rules from its own metadata."""
    primary, _ = primary_and_others(cluster)
    wait_until(lambda: reason_of(lambda: publish_forwarded(
        cluster, primary, "orders.eu.f", forwarded_as(cluster, "eu"))) is None,
        spread_timeout_s, interval_s=0.2, what="the primary knows user eu")
    before = last_seq(cluster)
    assert reason_of(lambda: publish_forwarded(
        cluster, primary, "orders.us.f", forwarded_as(cluster, "eu"))
    ) is Reason.PERMISSION_DENIED, "the primary trusted the forwarded call blindly"
    assert last_seq(cluster) == before, "a forwarded publish the user may not make was stored"
    # A read through a consumer whose subjects reach outside the user's rules: denied too.
    fetch_path = "/raftlog.v1.Consumers/Fetch"
    assert reason_of(lambda: cluster.consumers(primary).Fetch(consumers_pb2.FetchRequest(
        stream=STREAM, consumer="all", batch=1), timeout=call_timeout_s,
        metadata=[(IDENTITY_HEADER, forwarded_as(cluster, "eu", fetch_path))])
    ) is Reason.PERMISSION_DENIED
    # The signature binds the principal and the method: a header whose user is swapped for
    # one with more rights, or reused for another method, or naming no user, is refused.
    version, _, ts_ms, nonce, mac = forwarded_as(cluster, "eu").split(".")
    swapped = ".".join((version, "user-admin", ts_ms, nonce, mac))
    for header in (swapped, forwarded_as(cluster, "ghost")):
        assert reason_of(lambda header=header: publish_forwarded(
            cluster, primary, "orders.us.f", header)) is Reason.UNAUTHENTICATED
    assert reason_of(lambda: cluster.streams(primary).DeleteStream(
        streams_pb2.DeleteStreamRequest(name=STREAM), timeout=call_timeout_s,
        metadata=[(IDENTITY_HEADER, forwarded_as(cluster, "admin"))])
    ) is Reason.UNAUTHENTICATED  # signed for Publish, not DeleteStream
    assert last_seq(cluster) == before
    # The same user's allowed publish, forwarded for real by another node, is stored.
    _, others = primary_and_others(cluster)
    stored = cluster.streams(others[0]).Publish(streams_pb2.PublishRequest(
        stream=STREAM, subject="orders.eu.g", payload=b"g"), timeout=call_timeout_s,
        metadata=bearer("eu"))
    assert stored.seq == before + 1


def test_denied_admin_calls_change_nothing_here_or_forwarded(cluster: LocalCluster) -> None:
    primary, others = primary_and_others(cluster)
    for via in (primary, others[0]):
        info, consumers = stream_info(cluster), consumer_names(cluster)
        state = cluster.consumers(1).GetConsumerInfo(consumers_pb2.GetConsumerInfoRequest(
            stream=STREAM, consumer="all"), timeout=call_timeout_s, metadata=bearer("admin"))
        for user in ("eu", "nobody"):
            assert reason_of(lambda via=via, user=user: cluster.streams(via).DeleteStream(
                streams_pb2.DeleteStreamRequest(name=STREAM), timeout=call_timeout_s,
                metadata=bearer(user))) is Reason.PERMISSION_DENIED
            assert reason_of(lambda via=via, user=user: cluster.consumers(via).CreateConsumer(
                consumers_pb2.CreateConsumerRequest(stream=STREAM, config=consumers_pb2.
                                                    ConsumerConfig(name=f"by-{user}")),
                timeout=call_timeout_s, metadata=bearer(user))) is Reason.PERMISSION_DENIED
            assert reason_of(lambda via=via, user=user: cluster.consumers(via).DeleteConsumer(
                consumers_pb2.DeleteConsumerRequest(stream=STREAM, consumer="all"),
                timeout=call_timeout_s, metadata=bearer(user))) is Reason.PERMISSION_DENIED
        after = stream_info(cluster)
        assert (after.config, after.state, after.created_ms) == (
            info.config, info.state, info.created_ms), "a denied DeleteStream changed the stream"
        assert consumer_names(cluster) == consumers == ["all"]
        assert cluster.consumers(1).GetConsumerInfo(consumers_pb2.GetConsumerInfoRequest(
            stream=STREAM, consumer="all"), timeout=call_timeout_s,
            metadata=bearer("admin")).state == state.state


def partition_seqs(cluster: LocalCluster) -> list[int]:
    return [last_seq(cluster, topic_names.partition_stream(topic, 0)) for topic in TOPICS]


def mq_send(cluster: LocalCluster, node: int, user: str, topic: str) -> Any:
    mq: Any = rmq_grpc.MessagingServiceStub(cluster.channel(node))  # type: ignore[no-untyped-call]
    date_time = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    header = (f"MQv2-HMAC-SHA1 Credential={user}/default, SignedHeaders=x-mq-date-time, "
              f"Signature={mq_signature(MQ_KEYS[user], date_time)}")
    message = rmq.Message(topic=rmq.Resource(name=topic.replace(".", "%")), body=b"b",
                          system_properties=rmq.SystemProperties(
                              message_id=f"id-{time.monotonic_ns()}", message_type=rmq.NORMAL))
    return mq.SendMessage(rmq_svc.SendMessageRequest(messages=[message]), timeout=call_timeout_s,
                          metadata=[("authorization", header), ("x-mq-date-time", date_time)])


def test_denied_seed_protocol_sends_store_nothing(cluster: LocalCluster) -> None:
    """Kafka-Pixy and RocketMQ v2 sends by a user without the right to the subject, on every
    node (each partition stream's primary is one of them, the others forward): nothing is
    stored; an allowed send is."""
    for node in (1, 2, 3):
        pixy: Any = kafkapixy_pb2_grpc.KafkaPixyStub(  # type: ignore[no-untyped-call]
            cluster.channel(node))
        before = partition_seqs(cluster)
        for user, topic in (("eu", "orders.us.kp"), ("nobody", "orders.eu.kp")):
            assert reason_of(lambda pixy=pixy, user=user, topic=topic: pixy.Produce(
                kafkapixy_pb2.ProdRq(topic=topic, message=b"m", key_undefined=True),
                timeout=call_timeout_s, metadata=bearer(user))) is Reason.PERMISSION_DENIED
            assert mq_send(cluster, node, user, topic).status.code == rmq.FORBIDDEN
        assert partition_seqs(cluster) == before, f"a denied send through n{node} stored"
    before = partition_seqs(cluster)
    assert mq_send(cluster, 1, "eu", "orders.eu.kp").status.code == rmq.OK
    assert partition_seqs(cluster) == [before[0] + 1, before[1]]


def test_users_and_tokens_survive_a_restart_of_every_node(cluster: LocalCluster) -> None:
    listed = cli(cluster, "auth", "user", "ls")
    for i in sorted(cluster.running):
        cluster.stop(i)
    cluster.start(1)
    # Alone, before any quorum: the node must not serve a call without a credential (users
    # that had not come back yet would turn authentication off).
    anonymous = reason_of(lambda: cluster.streams(1).ListStreams(
        streams_pb2.ListStreamsRequest(), timeout=call_timeout_s))
    assert anonymous is not None, "a restarted node served a call without a credential"
    for i in (2, 3):
        cluster.start(i)

    def publishes(i: int, user: str, subject: str) -> Reason | None:
        return reason_of(lambda: cluster.streams(i).Publish(streams_pb2.PublishRequest(
            stream=STREAM, subject=subject, payload=b"r"), timeout=call_timeout_s,
            metadata=bearer(user)))

    wait_until(lambda: all(publishes(i, "eu", "orders.eu.r") is None for i in (1, 2, 3)),
               restart_timeout_s, interval_s=0.5, what="eu's token works on every node again")
    for i in (1, 2, 3):
        assert reason_of(lambda i=i: cluster.streams(i).ListStreams(
            streams_pb2.ListStreamsRequest(), timeout=call_timeout_s)) is Reason.UNAUTHENTICATED
        assert publishes(i, "eu", "orders.us.r") is Reason.PERMISSION_DENIED
        assert publishes(i, "admin", "orders.us.r") is None
        assert publishes(i, "nobody", "orders.eu.r") is Reason.PERMISSION_DENIED
    assert mq_send(cluster, 2, "eu", "orders.eu.kp").status.code == rmq.OK  # its RocketMQ key
    assert cli(cluster, "auth", "user", "ls") == listed
