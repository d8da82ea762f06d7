"""Issue 16 items 2 and 3 end to end on one 3-node cluster (docs/auth.md): calls work before
any user exists; `raftlog auth user add` turns authentication on; a call without a token or
with an unknown one is UNAUTHENTICATED; a user who may only publish to `orders.eu.>` is
PERMISSION_DENIED elsewhere (nothing stored), also through a node that forwards to the stream's
primary, on fetch through a consumer whose filter reaches outside, and through every seed
front-end: Kafka-Pixy, the Waymaker API (gRPC statuses), RocketMQ v2 and v1 (the signed
authorization header; a denial in the response status) and the Numaflow sidecar (its --token;
a denied ReadFn, no start without a token); a client
certificate whose common name is a user's TLS subject authenticates as that user (the cluster
runs TLS; node 3 requires client certificates); a client that sends the node-to-node identity
header itself is UNAUTHENTICATED; token rotation keeps the old token until --revoke-old. The last
test removes every user: authentication is off again.

The tests run in order and share the users they add (module state in `USERS`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import code_pb2

from raftlog.base import topics as topic_names
from raftlog.base.errors import RaftlogError, Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.compat import kafkapixy_pb2, kafkapixy_pb2_grpc
from raftlog.compat import rocketmq_v1_definition_pb2 as rmq1
from raftlog.compat import rocketmq_v1_service_pb2 as mq1
from raftlog.compat import rocketmq_v1_service_pb2_grpc as mq1_grpc
from raftlog.compat import rocketmq_v2_definition_pb2 as rmq
from raftlog.compat import rocketmq_v2_service_pb2 as rmq_svc
from raftlog.compat import rocketmq_v2_service_pb2_grpc as rmq_grpc
from raftlog.compat import waymaker_streams_pb2 as wm
from raftlog.compat import waymaker_streams_pb2_grpc as wm_grpc
from raftlog.node.cli import certs
from raftlog.node.transport.auth import IDENTITY_HEADER, mq_signature
from raftlog.node.transport.credentials import Credential
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import (
    cluster_pb2,
    consumers_pb2,
    streams_pb2,
    streams_pb2_grpc,
    topics_pb2,
    topics_pb2_grpc,
    types_pb2,
)
from tests.process.cluster_helpers import error_reason as reason_of

call_timeout_s = 10.0
spread_timeout_s = 10.0  # a user change reaches every node's metadata within this
STREAM = "orders"
CERT_NODE = 3  # requires a client certificate
USERS: dict[str, str] = {}  # name -> current token
MQ_KEYS: dict[str, str] = {}  # name -> RocketMQ secret key


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    made = LocalCluster(tmp_path_factory.mktemp("auth") / "cluster", nodes=3, tls=True,
                        node_args=lambda spec: (["--tls-client-auth", "require"]
                                                if spec.index == CERT_NODE else []))
    try:
        yield made.start_all()
    finally:
        made.stop_all()


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]




def publish(cluster: LocalCluster, i: int, subject: str, token: str | None) -> Any:
    return cluster.streams(i).Publish(
        streams_pb2.PublishRequest(stream=STREAM, subject=subject, payload=b"x"),
        timeout=call_timeout_s, metadata=bearer(token) if token else None)


def last_seq(cluster: LocalCluster) -> int:
    info = cluster.streams(1).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name=STREAM),
                                            timeout=call_timeout_s,
                                            metadata=bearer(USERS["admin"]))
    return int(info.state.last_seq)


def raftlog_cli(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTLOG_TOKEN",
                                                              "RAFTLOG_SECRET_FILE")}
    done = subprocess.run(
        [sys.executable, "-m", "raftlog.node.cli", *args, "--server", cluster.address(1),
         "--tls-ca", str(client_files(cluster).ca), "--json"], capture_output=True, text=True,
        timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def client_files(cluster: LocalCluster) -> certs.TlsPaths:
    return certs.paths_of(cluster.root.resolve(), certs.CLIENT_NAME)


def primary_and_other(cluster: LocalCluster) -> tuple[int, int]:
    route = cluster.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(stream=STREAM),
                                            timeout=call_timeout_s,
                                            metadata=bearer(USERS["admin"]))
    primary = cluster.index_of(route.primary)
    return primary, next(i for i in (1, 2, 3) if i != primary)


def test_calls_work_before_any_user(cluster: LocalCluster) -> None:
    def created() -> bool:
        try:
            cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(
                config=types_pb2.StreamConfig(name=STREAM, subjects=["orders.>"], replicas=3)),
                timeout=call_timeout_s)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True

    wait_until(created, 15, interval_s=0.1, what="stream created")
    wait_until(lambda: reason_of(lambda: publish(cluster, 2, "orders.us.a", None)) is None,
               15, interval_s=0.1, what="first publish")
    for i in (1, 2, 3):
        assert publish(cluster, i, "orders.us.a", None).seq >= 1


def test_adding_users_turns_authentication_on(cluster: LocalCluster) -> None:
    admin = raftlog_cli(cluster, "auth", "user", "add", "admin", "--publish", ">",
                        "--subscribe", ">", "--admin", "streams,consumers,cluster",
                        "--secret-file", str(cluster.secret_path))
    USERS["admin"] = admin["token"]
    limited = raftlog_cli(cluster, "auth", "user", "add", "eu", "--publish", "orders.eu.>",
                          "--subscribe", "orders.eu.>", "--token", USERS["admin"])
    USERS["eu"], MQ_KEYS["eu"] = limited["token"], limited["rocketmq_secret_key"]
    for i in (1, 2, 3):
        wait_until(lambda i=i: reason_of(lambda: publish(cluster, i, "orders.eu.a", None))
                   is Reason.UNAUTHENTICATED, spread_timeout_s, what=f"auth on at node {i}")
    listed = raftlog_cli(cluster, "auth", "user", "ls", "--token", USERS["admin"])
    assert [user["name"] for user in listed["users"]] == ["admin", "eu"]
    assert "sha256" not in json.dumps(listed) and USERS["eu"] not in json.dumps(listed)


def test_a_call_without_a_valid_token_is_unauthenticated(cluster: LocalCluster) -> None:
    before = last_seq(cluster)
    assert reason_of(lambda: publish(cluster, 1, "orders.eu.a", None)) is Reason.UNAUTHENTICATED
    assert reason_of(lambda: publish(cluster, 1, "orders.eu.a", "rl_not-a-token")
                     ) is Reason.UNAUTHENTICATED
    assert reason_of(lambda: cluster.streams(1).ListStreams(
        streams_pb2.ListStreamsRequest(), timeout=call_timeout_s)) is Reason.UNAUTHENTICATED
    assert last_seq(cluster) == before


def test_a_limited_user_is_denied_elsewhere_here_and_through_forwarding(
        cluster: LocalCluster) -> None:
    primary, other = primary_and_other(cluster)
    for i in (primary, other):  # `other` forwards to the primary
        before = last_seq(cluster)
        assert reason_of(lambda i=i: publish(cluster, i, "orders.us.x", USERS["eu"])
                         ) is Reason.PERMISSION_DENIED
        assert last_seq(cluster) == before, "a denied publish stored something"
        assert publish(cluster, i, "orders.eu.x", USERS["eu"]).seq == before + 1
    batch = streams_pb2.PublishBatchRequest(stream=STREAM, entries=[
        streams_pb2.PublishEntry(subject="orders.eu.y", payload=b"1"),
        streams_pb2.PublishEntry(subject="orders.us.y", payload=b"2")])
    before = last_seq(cluster)
    assert reason_of(lambda: cluster.streams(other).PublishBatch(
        batch, timeout=call_timeout_s, metadata=bearer(USERS["eu"]))) is Reason.PERMISSION_DENIED
    assert last_seq(cluster) == before
    assert reason_of(lambda: cluster.streams(other).DeleteStream(
        streams_pb2.DeleteStreamRequest(name=STREAM), timeout=call_timeout_s,
        metadata=bearer(USERS["eu"]))) is Reason.PERMISSION_DENIED


def test_fetch_is_checked_against_the_consumer_filter(cluster: LocalCluster) -> None:
    _, other = primary_and_other(cluster)
    for name, subject in (("eu-reader", "orders.eu.>"), ("us-reader", "orders.us.>")):
        cluster.consumers(1).CreateConsumer(consumers_pb2.CreateConsumerRequest(
            stream=STREAM, config=consumers_pb2.ConsumerConfig(name=name,
                                                               filter_subject=subject)),
            timeout=call_timeout_s, metadata=bearer(USERS["admin"]))
    assert reason_of(lambda: cluster.consumers(1).CreateConsumer(
        consumers_pb2.CreateConsumerRequest(stream=STREAM, config=consumers_pb2.ConsumerConfig(
            name="mine")), timeout=call_timeout_s, metadata=bearer(USERS["eu"]))
    ) is Reason.PERMISSION_DENIED

    def fetch(consumer: str) -> Any:
        return cluster.consumers(other).Fetch(consumers_pb2.FetchRequest(
            stream=STREAM, consumer=consumer, batch=5), timeout=call_timeout_s,
            metadata=bearer(USERS["eu"]))

    wait_until(lambda: reason_of(lambda: fetch("us-reader")) is Reason.PERMISSION_DENIED,
               spread_timeout_s, what="the consumers reach every node")
    got = fetch("eu-reader")
    assert got.messages and all(m.subject.startswith("orders.eu.") for m in got.messages)


def test_a_forged_identity_header_is_unauthenticated(cluster: LocalCluster) -> None:
    wrong = Credential("f" * 16 + "0123456789abcdef" * 3)
    forged = wrong.token(principal="user-admin", method="/raftlog.v1.Streams/Publish")
    for header in (forged, f"v1.user-admin.{int(time.time() * 1000)}.00.bad"):
        before = last_seq(cluster)
        assert reason_of(lambda header=header: cluster.streams(1).Publish(
            streams_pb2.PublishRequest(stream=STREAM, subject="orders.us.f", payload=b"x"),
            timeout=call_timeout_s, metadata=[(IDENTITY_HEADER, header),
                                              *bearer(USERS["eu"])])
        ) is Reason.UNAUTHENTICATED
        assert last_seq(cluster) == before


def test_kafkapixy_and_rocketmq_deny_the_same_way(cluster: LocalCluster) -> None:
    topics: Any = topics_pb2_grpc.TopicsStub(cluster.channel(1))  # type: ignore[no-untyped-call]
    for topic in ("orders.eu.kp", "orders.us.kp"):
        request = topics_pb2.CreateTopicRequest(name=topic, partitions=1,
                                                config=types_pb2.StreamConfig(replicas=1))
        wait_until(lambda request=request: reason_of(lambda: topics.CreateTopic(
            request, timeout=call_timeout_s, metadata=bearer(USERS["admin"]))) is None,
            15, interval_s=0.2, what=f"topic {topic}")
    pixy: Any = kafkapixy_pb2_grpc.KafkaPixyStub(cluster.channel(2))  # type: ignore[no-untyped-call]

    def produce(topic: str) -> Any:
        return pixy.Produce(kafkapixy_pb2.ProdRq(topic=topic, message=b"m", key_undefined=True),
                            timeout=call_timeout_s, metadata=bearer(USERS["eu"]))

    assert reason_of(lambda: produce("orders.us.kp")) is Reason.PERMISSION_DENIED
    wait_until(lambda: reason_of(lambda: produce("orders.eu.kp")) is None, 15,
               interval_s=0.2, what="kafka-pixy produce")
    assert reason_of(lambda: pixy.Produce(kafkapixy_pb2.ProdRq(
        topic="orders.eu.kp", message=b"m", key_undefined=True), timeout=call_timeout_s)
    ) is Reason.UNAUTHENTICATED

    mq: Any = rmq_grpc.MessagingServiceStub(cluster.channel(3))  # type: ignore[no-untyped-call]

    def send(topic: str, secret: str) -> Any:
        date_time = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        signature = mq_signature(secret, date_time)
        header = (f"MQv2-HMAC-SHA1 Credential=eu/default, SignedHeaders=x-mq-date-time, "
                  f"Signature={signature}")
        message = rmq.Message(topic=rmq.Resource(name=topic.replace(".", "%")), body=b"b",
                              system_properties=rmq.SystemProperties(
                                  message_id=f"id-{time.monotonic_ns()}",
                                  message_type=rmq.NORMAL))
        return mq.SendMessage(rmq_svc.SendMessageRequest(messages=[message]),
                              timeout=call_timeout_s,
                              metadata=[("authorization", header), ("x-mq-date-time", date_time)])

    assert send("orders.us.kp", MQ_KEYS["eu"]).status.code == rmq.FORBIDDEN
    assert send("orders.eu.kp", MQ_KEYS["eu"]).status.code == rmq.OK
    assert reason_of(lambda: send("orders.eu.kp", "0" * 64)) is Reason.UNAUTHENTICATED


def test_waymaker_denies_as_a_grpc_status(cluster: LocalCluster) -> None:
    """The Waymaker API answers a denial or a missing credential as the gRPC status (its
    result_code table has no code for them, node/api/waymaker_codes.py)."""
    way: Any = wm_grpc.WaymakerStreamsServiceStub(cluster.channel(2))  # type: ignore[no-untyped-call]

    def publish_wm(subject: str, token: str | None) -> Any:
        return way.Publish(wm.PublishRequest(stream=STREAM, subject=subject, payload=b"w"),
                           timeout=call_timeout_s, metadata=bearer(token) if token else None)

    before = last_seq(cluster)
    assert reason_of(lambda: publish_wm("orders.us.w", USERS["eu"])) is Reason.PERMISSION_DENIED
    assert reason_of(lambda: publish_wm("orders.eu.w", None)) is Reason.UNAUTHENTICATED
    assert last_seq(cluster) == before, "a refused Waymaker publish stored something"
    allowed = publish_wm("orders.eu.w", USERS["eu"])
    assert allowed.success and allowed.result_code == "ok" and allowed.seq == before + 1


def test_rocketmq_v1_denies_in_its_response_status(cluster: LocalCluster) -> None:
    """RocketMQ v1 clients sign with the same MQv2-HMAC-SHA1 header as v2 ones; a denial is
    google.rpc PERMISSION_DENIED in ResponseCommon.status, a bad signature the gRPC status."""
    mq: Any = mq1_grpc.MessagingServiceStub(cluster.channel(1))  # type: ignore[no-untyped-call]

    def stored() -> list[int]:
        return [int(cluster.streams(1).GetStreamInfo(streams_pb2.GetStreamInfoRequest(
            name=topic_names.partition_stream(topic, 0)), timeout=call_timeout_s,
            metadata=bearer(USERS["admin"])).state.last_seq)
            for topic in ("orders.eu.kp", "orders.us.kp")]

    def send(topic: str, secret: str) -> Any:
        date_time = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        header = (f"MQv2-HMAC-SHA1 Credential=eu/default, SignedHeaders=x-mq-date-time, "
                  f"Signature={mq_signature(secret, date_time)}")
        message = rmq1.Message(topic=rmq1.Resource(name=topic.replace(".", "%")), body=b"b",
                               system_attribute=rmq1.SystemAttribute(
                                   message_id=f"v1-{time.monotonic_ns()}"))
        return mq.SendMessage(mq1.SendMessageRequest(message=message), timeout=call_timeout_s,
                              metadata=[("authorization", header), ("x-mq-date-time", date_time)])

    before = stored()
    denied = send("orders.us.kp", MQ_KEYS["eu"])
    assert denied.common.status.code == code_pb2.PERMISSION_DENIED, denied
    assert denied.common.error_info.reason == Reason.PERMISSION_DENIED.name
    assert reason_of(lambda: send("orders.eu.kp", "0" * 64)) is Reason.UNAUTHENTICATED
    assert reason_of(lambda: mq.SendMessage(mq1.SendMessageRequest(message=rmq1.Message(
        topic=rmq1.Resource(name="orders%eu%kp"), body=b"b")), timeout=call_timeout_s)
    ) is Reason.UNAUTHENTICATED
    assert stored() == before, "a refused RocketMQ v1 send stored something"
    assert send("orders.eu.kp", MQ_KEYS["eu"]).common.status.code == code_pb2.OK
    assert stored() != before


def numaflow_argv(cluster: LocalCluster, socket: Path, consumer: str,
                  token: str | None) -> list[str]:
    return [sys.executable, "-m", "raftlog.node.cli", "--tls-ca", str(client_files(cluster).ca),
            "numaflow-source", "--stream", STREAM, "--consumer", consumer, "--socket",
            str(socket), "--server-info", f"{socket}.info", "--server", cluster.address(1),
            *(["--token", token] if token else [])]


@contextmanager
def numaflow_sidecar(cluster: LocalCluster, socket: Path, consumer: str,
                     token: str) -> Iterator[str]:
    """The sidecar serving `consumer` as the user of `token`; yields its gRPC target."""
    process = subprocess.Popen(numaflow_argv(cluster, socket, consumer, token),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env=without_credentials())
    try:
        info = Path(f"{socket}.info")
        wait_until(lambda: process.poll() is None and info.exists() and
                   info.read_text().endswith("__END__"), 20, interval_s=0.05,
                   what=f"the numaflow sidecar of {consumer} serves")
        yield f"unix://{socket}"
    finally:
        process.terminate()
        try:
            process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate(timeout=10)


async def numaflow_read(target: str, pb: Any, pb_grpc: Any) -> list[Any]:
    """A handshake and one read of up to 10 records as numa does it, then an ack of them."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.SourceStub(channel)
        read = stub.ReadFn()
        await read.write(pb.ReadRequest(handshake=pb.Handshake(sot=True)))
        assert (await read.read()).handshake.sot
        await read.write(pb.ReadRequest(request=pb.ReadRequest.Request(num_records=10,
                                                                       timeout_in_ms=1000)))
        results = []
        while not (answer := await asyncio.wait_for(read.read(), call_timeout_s)).status.eot:
            results.append(answer.result)
        await read.done_writing()
        ack = stub.AckFn()
        await ack.write(pb.AckRequest(handshake=pb.Handshake(sot=True)))
        await asyncio.wait_for(ack.read(), call_timeout_s)
        await ack.write(pb.AckRequest(request=pb.AckRequest.Request(
            offsets=[result.offset for result in results])))
        assert (await asyncio.wait_for(ack.read(), call_timeout_s)).result.HasField("success")
        await ack.done_writing()
        return results


def test_the_numaflow_sidecar_reads_with_its_users_rights(cluster: LocalCluster) -> None:
    """The sidecar's --token goes with every call: a consumer the user may not read fails
    ReadFn with PERMISSION_DENIED (nothing delivered); without a token the sidecar does not
    start (UNAUTHENTICATED)."""
    pb = pytest.importorskip("pynumaflow.proto.sourcer.source_pb2")
    pb_grpc = pytest.importorskip("pynumaflow.proto.sourcer.source_pb2_grpc")
    sockets = Path(tempfile.mkdtemp(prefix="nfauth", dir="/tmp"))
    try:
        refused = subprocess.run(numaflow_argv(cluster, sockets / "none.sock", "eu-reader", None),
                                 capture_output=True, text=True, timeout=60, check=False,
                                 env=without_credentials())
        assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr, refused.stderr

        def us_reader() -> Any:
            return cluster.consumers(1).GetConsumerInfo(consumers_pb2.GetConsumerInfoRequest(
                stream=STREAM, consumer="us-reader"), timeout=call_timeout_s,
                metadata=bearer(USERS["admin"]))

        delivered = us_reader().state.delivered_seq
        with numaflow_sidecar(cluster, sockets / "us.sock", "us-reader", USERS["eu"]) as target:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                asyncio.run(numaflow_read(target, pb, pb_grpc))
            assert failed.value.code() == grpc.StatusCode.PERMISSION_DENIED, failed.value
        assert us_reader().state.delivered_seq == delivered, "a denied read delivered"

        publish(cluster, 1, "orders.eu.nf", USERS["eu"])
        with numaflow_sidecar(cluster, sockets / "eu.sock", "eu-reader", USERS["eu"]) as target:
            results = asyncio.run(numaflow_read(target, pb, pb_grpc))
        subjects = [result.keys[0] for result in results]
        assert "orders.eu.nf" in subjects and all(s.startswith("orders.eu.") for s in subjects)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)


def without_credentials() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("RAFTLOG_TOKEN",
                                                              "RAFTLOG_SECRET_FILE")}


def test_a_client_certificate_authenticates_as_its_tls_subject(cluster: LocalCluster) -> None:
    raftlog_cli(cluster, "auth", "user", "add", "certy", "--publish", "orders.cert.>",
                "--tls-subject", certs.CLIENT_NAME, "--token", USERS["admin"])
    paths = client_files(cluster)
    with grpc.secure_channel(cluster.address(CERT_NODE), grpc.ssl_channel_credentials(
            root_certificates=paths.ca.read_bytes(), private_key=paths.key.read_bytes(),
            certificate_chain=paths.cert.read_bytes())) as channel:
        streams: Any = streams_pb2_grpc.StreamsStub(channel)  # type: ignore[no-untyped-call]

        def publish_with_cert(subject: str) -> Any:
            return streams.Publish(streams_pb2.PublishRequest(
                stream=STREAM, subject=subject, payload=b"c"), timeout=call_timeout_s)

        wait_until(lambda: reason_of(lambda: publish_with_cert("orders.cert.a")) is None,
                   spread_timeout_s, what="the certificate's user reaches node 3")
        before = last_seq(cluster)
        assert reason_of(lambda: publish_with_cert("orders.eu.a")) is Reason.PERMISSION_DENIED
        assert last_seq(cluster) == before
    raftlog_cli(cluster, "auth", "user", "rm", "certy", "--token", USERS["admin"])


def test_token_rotation_keeps_the_old_token_until_revoked(cluster: LocalCluster) -> None:
    old = USERS["eu"]
    rotated = raftlog_cli(cluster, "auth", "token", "rotate", "eu", "--token", USERS["admin"])
    new = rotated["token"]
    wait_until(lambda: all(reason_of(lambda i=i: publish(cluster, i, "orders.eu.r", new))
                           is None for i in (1, 2, 3)), spread_timeout_s, what="new token")
    assert reason_of(lambda: publish(cluster, 1, "orders.eu.r", old)) is None
    raftlog_cli(cluster, "auth", "token", "rotate", "eu", "--revoke-old",
                "--secret-file", str(cluster.secret_path))
    wait_until(lambda: all(reason_of(lambda i=i: publish(cluster, i, "orders.eu.r", old))
                           is Reason.UNAUTHENTICATED for i in (1, 2, 3)), spread_timeout_s,
               what="old token revoked")
    assert reason_of(lambda: publish(cluster, 2, "orders.eu.r", new)) is None
    USERS["eu"] = new


def test_a_user_publish_rate_is_enforced_on_each_receiving_node(cluster: LocalCluster) -> None:
    """A user limited to 10 msgs/s bursts 50 publishes at a node that forwards them: some are
    RATE_LIMITED with a retry hint, exactly the accepted ones are stored, and the primary did
    not charge them again (its own bucket still takes a full second's worth). Another user is
    unaffected; after the hint the user publishes again."""
    slow = raftlog_cli(cluster, "auth", "user", "add", "slow", "--publish", "orders.slow.>",
                       "--max-msgs-per-s", "10", "--token", USERS["admin"])
    listed = raftlog_cli(cluster, "auth", "user", "ls", "--token", USERS["admin"])
    assert next(u for u in listed["users"] if u["name"] == "slow")["max_msgs_per_s"] == 10
    primary, other = primary_and_other(cluster)
    # known on both nodes: a denied publish is checked before the rate, so it charges nothing
    wait_until(lambda: all(reason_of(lambda i=i: publish(cluster, i, "orders.eu.w",
                                                         slow["token"])) is Reason.PERMISSION_DENIED
                           for i in (primary, other)), spread_timeout_s, what="slow user")

    def burst(node: int, count: int) -> list[RaftlogError | None]:
        calls = [cluster.streams(node).Publish.future(
            streams_pb2.PublishRequest(stream=STREAM, subject="orders.slow.b", payload=b"x"),
            timeout=call_timeout_s, metadata=bearer(slow["token"])) for _ in range(count)]
        outcomes: list[RaftlogError | None] = []
        for call in calls:
            try:
                call.result()
                outcomes.append(None)
            except grpc.RpcError as err:
                outcomes.append(from_rpc_error(err))  # type: ignore[arg-type]
        return outcomes

    before = last_seq(cluster)
    outcomes = burst(other, 50)
    refused = [err for err in outcomes if err is not None]
    accepted = len(outcomes) - len(refused)
    assert 10 <= accepted <= 30 and refused, outcomes  # 10 held, plus refills under load
    assert all(err.reason is Reason.RATE_LIMITED and err.metadata["key"] == "user:slow"
               and int(err.metadata["retry_after_ms"]) > 0 for err in refused), refused
    assert last_seq(cluster) == before + accepted, "a refused publish stored something"
    assert all(err is None for err in burst(primary, 10)), "forwarded calls charged twice"
    assert publish(cluster, other, "orders.eu.q", USERS["eu"]).seq > 0  # another user
    hint_s = max(int(err.metadata["retry_after_ms"]) for err in refused) / 1000
    wait_until(lambda: reason_of(lambda: publish(cluster, other, "orders.slow.c", slow["token"]))
               is None, hint_s + 2, interval_s=hint_s, what="the user's rate recovers")
    raftlog_cli(cluster, "auth", "user", "rm", "slow", "--token", USERS["admin"])


def test_removing_every_user_turns_authentication_off(cluster: LocalCluster) -> None:
    cli_refuses_user_changes(cluster, "eu")
    for name in ("eu", "admin"):
        raftlog_cli(cluster, "auth", "user", "rm", name, "--secret-file",
                    str(cluster.secret_path))
    for i in (1, 2, 3):
        wait_until(lambda i=i: reason_of(lambda: publish(cluster, i, "orders.us.z", None))
                   is None, spread_timeout_s, what=f"auth off at node {i}")


def cli_refuses_user_changes(cluster: LocalCluster, user: str) -> None:
    """A user without cluster admin cannot manage users (the CLI exits 1 with the reason)."""
    done = subprocess.run(
        [sys.executable, "-m", "raftlog.node.cli", "auth", "user", "rm", "admin", "--server",
         cluster.address(1), "--tls-ca", str(client_files(cluster).ca), "--token", USERS[user]],
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "PERMISSION_DENIED" in done.stderr, done.stderr
