"""Issue 16 item 4, per user, on one 3-node cluster (docs/quotas.md): a user's storage quota
bounds the max_bytes of the streams it creates (checked by the metadata's state machine, so
through any node), its connections and subscriptions are bounded on each node it calls, each
refusal is RESOURCE_EXHAUSTED / QUOTA_EXCEEDED, and each recovers once the user lets go.
`raftlog auth user update` changes a user's quotas and rates while its token keeps working.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import (
    consumers_pb2,
    consumers_pb2_grpc,
    streams_pb2,
    streams_pb2_grpc,
    types_pb2,
)
from tests.process.cluster_helpers import error_reason as reason_of

call_timeout_s = 10.0
spread_timeout_s = 10.0  # a user change reaches every node's metadata within this
recover_timeout_s = 15.0
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # a channel with its own TCP link
KIB = 1024
TOKENS: dict[str, str] = {}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    made = LocalCluster(tmp_path_factory.mktemp("user-quotas") / "cluster", nodes=3)
    try:
        yield made.start_all()
    finally:
        made.stop_all()


def cli(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTLOG_")}
    done = subprocess.run(
        [sys.executable, "-m", "raftlog.node.cli", *args, "--server", cluster.address(1),
         "--secret-file", str(cluster.secret_path), "--json"],
        capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def as_user(name: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {TOKENS[name]}")]




def quota_refusal(call: Callable[[], Any]) -> dict[str, str] | None:
    """The ErrorInfo metadata of a QUOTA_EXCEEDED refusal, None when `call` succeeds."""
    try:
        call()
    except grpc.RpcError as err:
        raised = from_rpc_error(err)  # type: ignore[arg-type]
        assert raised is not None and raised.reason is Reason.QUOTA_EXCEEDED, err
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
        return dict(raised.metadata)
    return None


def user_info(cluster: LocalCluster, name: str) -> dict[str, Any]:
    users = cli(cluster, "auth", "user", "ls")["users"]
    return next(user for user in users if user["name"] == name)


def create_stream(cluster: LocalCluster, via: int, name: str, max_bytes: int, user: str) -> Any:
    return cluster.streams(via).CreateStream(streams_pb2.CreateStreamRequest(
        config=types_pb2.StreamConfig(name=name, subjects=[f"{name}.>"], max_bytes=max_bytes)),
        timeout=call_timeout_s, metadata=as_user(user))


def test_users_with_quotas_are_added_and_listed(cluster: LocalCluster) -> None:
    for name, flags in (("store", ["--max-bytes-stored", "100KiB"]),
                        ("conn", ["--max-connections", "1"]),
                        ("subs", ["--max-subscriptions", "1"])):
        added = cli(cluster, "auth", "user", "add", name, "--publish", ">", "--subscribe", ">",
                    "--admin", "streams,consumers", *flags)
        TOKENS[name] = added["token"]
    assert user_info(cluster, "store")["quotas"]["max_bytes_stored"] == 100 * KIB
    assert user_info(cluster, "conn")["quotas"]["max_connections"] == 1

    def everywhere() -> bool:  # every node knows the users (auth is on everywhere)
        return all(reason_of(lambda i=i: cluster.streams(i).ListStreams(
            streams_pb2.ListStreamsRequest(), timeout=call_timeout_s)) is Reason.UNAUTHENTICATED
            for i in (1, 2, 3))

    wait_until(everywhere, spread_timeout_s, interval_s=0.2, what="auth on every node")


def test_a_storage_quota_bounds_the_streams_a_user_creates_through_any_node(
        cluster: LocalCluster) -> None:
    # Without a max_bytes a stream of this user could grow past its quota: refused.
    refusal = quota_refusal(lambda: create_stream(cluster, 1, "unbounded", 0, "store"))
    assert refusal is not None
    assert quota_refusal(lambda: create_stream(cluster, 1, "s1", 60 * KIB, "store")) is None
    # Through every node (the create reaches the stream's primary, forwarded or not): 60 KiB
    # are taken, so 50 more are past the quota wherever the call lands.
    for via in (1, 2, 3):
        assert quota_refusal(lambda via=via: create_stream(
            cluster, via, f"s2-{via}", 50 * KIB, "store")) is not None
    names = [s.config.name for s in cluster.streams(2).ListStreams(
        streams_pb2.ListStreamsRequest(), timeout=call_timeout_s,
        metadata=as_user("store")).streams]
    assert names == ["s1"]
    info = cluster.streams(3).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="s1"),
                                            timeout=call_timeout_s, metadata=as_user("store"))
    assert info.owner == "store"
    assert user_info(cluster, "store")["bytes_reserved"] == 60 * KIB
    # Growing s1 past the quota is refused and changes nothing; deleting it gives it all back.
    assert reason_of(lambda: cluster.streams(2).UpdateStream(streams_pb2.UpdateStreamRequest(
        name="s1", max_bytes=200 * KIB), timeout=call_timeout_s,
        metadata=as_user("store"))) is Reason.QUOTA_EXCEEDED
    assert cluster.streams(1).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="s1"),
                                            timeout=call_timeout_s, metadata=as_user("store")
                                            ).config.max_bytes == 60 * KIB
    cluster.streams(1).DeleteStream(streams_pb2.DeleteStreamRequest(name="s1"),
                                    timeout=call_timeout_s, metadata=as_user("store"))
    assert quota_refusal(lambda: create_stream(cluster, 2, "s3", 100 * KIB, "store")) is None
    assert user_info(cluster, "store")["bytes_reserved"] == 100 * KIB


class Held:
    """A Subscribe left open on a connection of its own, until `close`."""

    def __init__(self, address: str, user: str, consumer: str) -> None:
        self.channel = grpc.insecure_channel(address, options=OWN_CONNECTION)
        stub = consumers_pb2_grpc.ConsumersStub(self.channel)  # type: ignore[no-untyped-call]
        self.call = stub.Subscribe(consumers_pb2.SubscribeRequest(
            stream="q", consumer=consumer, heartbeat_ms=30_000), timeout=120,
            metadata=as_user(user))

    def close(self) -> None:
        self.call.cancel()
        self.channel.close()


def new_connection_call(address: str, user: str) -> Callable[[], Any]:
    """A unary call of `user` on a connection of its own."""
    def call() -> Any:
        with grpc.insecure_channel(address, options=OWN_CONNECTION) as channel:
            stub = streams_pb2_grpc.StreamsStub(channel)  # type: ignore[no-untyped-call]
            return stub.GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="q"),
                                      timeout=call_timeout_s, metadata=as_user(user))
    return call


def subscribe_once(address: str, user: str, consumer: str) -> Callable[[], Any]:
    """A Subscribe of `user` that ends once its consumer is drained."""
    def call() -> Any:
        with grpc.insecure_channel(address, options=OWN_CONNECTION) as channel:
            stub = consumers_pb2_grpc.ConsumersStub(channel)  # type: ignore[no-untyped-call]
            return list(stub.Subscribe(consumers_pb2.SubscribeRequest(
                stream="q", consumer=consumer, stop_when_empty=True), timeout=call_timeout_s,
                metadata=as_user(user)))
    return call


def tripped(call: Callable[[], Any], measure: str) -> bool:
    refusal = quota_refusal(call)
    if refusal is None:
        return False
    assert refusal["measure"] == measure and int(refusal["retry_after_ms"]) > 0, refusal
    return True


@pytest.mark.parametrize(("user", "measure"), [("conn", "connections"),
                                               ("subs", "subscriptions")])
def test_connections_and_subscriptions_of_a_user_trip_per_node_and_recover(
        cluster: LocalCluster, user: str, measure: str) -> None:
    if reason_of(lambda: cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(
            config=types_pb2.StreamConfig(name="q", subjects=["q.>"], max_bytes=0)),
            timeout=call_timeout_s, metadata=as_user("conn"))) is None:
        for consumer in ("hold", "probe"):
            cluster.consumers(1).CreateConsumer(consumers_pb2.CreateConsumerRequest(
                stream="q", config=consumers_pb2.ConsumerConfig(name=consumer)),
                timeout=call_timeout_s, metadata=as_user("conn"))
    node, other = 1, 2
    address = cluster.address(node)
    probe = (new_connection_call(address, user) if measure == "connections"
             else subscribe_once(address, user, "probe"))
    assert not tripped(probe, measure)
    held = Held(address, user, "hold")
    try:
        wait_until(lambda: tripped(probe, measure), recover_timeout_s, interval_s=0.2,
                   what=f"{user}'s {measure} quota trips on n{node}")
        # Per node: the same call through another node is served.
        elsewhere = (new_connection_call(cluster.address(other), user)
                     if measure == "connections"
                     else subscribe_once(cluster.address(other), user, "probe"))
        assert not tripped(elsewhere, measure)
    finally:
        held.close()
    wait_until(lambda: not tripped(probe, measure), recover_timeout_s, interval_s=0.2,
               what=f"{user}'s {measure} come back")


def test_update_changes_quotas_and_rates_and_keeps_the_token(cluster: LocalCluster) -> None:
    updated = cli(cluster, "auth", "user", "update", "conn", "--max-connections", "0",
                  "--max-msgs-per-s", "5")
    assert updated["max_msgs_per_s"] == 5 and updated["quotas"]["max_connections"] == 0
    assert updated["permissions"]["publish_allow"] == [">"]  # not given: kept
    assert user_info(cluster, "conn")["tokens"] == 1

    def rate_limited() -> bool:
        reasons = [reason_of(lambda: cluster.streams(1).Publish(streams_pb2.PublishRequest(
            stream="q", subject="q.x", payload=b"x"), timeout=call_timeout_s,
            metadata=as_user("conn"))) for _ in range(20)]
        assert set(reasons) <= {None, Reason.RATE_LIMITED}, reasons
        return Reason.RATE_LIMITED in reasons

    wait_until(rate_limited, spread_timeout_s, interval_s=0.5, what="the new rate applies")
    cli_fails(cluster, "auth", "user", "update", "ghost")


def cli_fails(cluster: LocalCluster, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTLOG_")}
    done = subprocess.run(
        [sys.executable, "-m", "raftlog.node.cli", *args, "--server", cluster.address(1),
         "--secret-file", str(cluster.secret_path)],
        capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode != 0 and "USER_NOT_FOUND" in done.stderr + done.stdout, done
