"""Issue 16 item 4 end to end on one 3-node cluster: per-stream publish quotas (msgs/s, bytes/s)
trip with RESOURCE_EXHAUSTED / RATE_LIMITED and a retry hint, store nothing of what they
refuse, recover, and survive a kill of the stream's primary (they are in the Raft-held config);
node-wide subscription and connection limits trip and recover (docs/quotas.md).

Node 2 runs with `--subscriptions-max 2`, node 3 with `--connections-max 3`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftlog.base import limits
from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.node.cli.localcluster import NodeSpec
from raftlog.node.ops.batches import expand_results
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import (
    cluster_pb2,
    consumers_pb2,
    consumers_pb2_grpc,
    streams_pb2,
    types_pb2,
)

call_timeout_s = 10.0
recover_timeout_s = 10.0
failover_timeout_s = 30.0
SUBSCRIPTIONS_NODE, SUBSCRIPTIONS_MAX = 2, 2
CONNECTIONS_NODE, CONNECTIONS_MAX = 3, 3
SUBSCRIBE = "/raftlog.v1.Consumers/Subscribe"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    def node_args(spec: NodeSpec) -> list[str]:
        if spec.index == SUBSCRIPTIONS_NODE:
            return ["--subscriptions-max", str(SUBSCRIPTIONS_MAX)]
        if spec.index == CONNECTIONS_NODE:
            return ["--connections-max", str(CONNECTIONS_MAX)]
        return []

    root: Path = tmp_path_factory.mktemp("quotas") / "cluster"
    local = LocalCluster(root, nodes=3, node_args=node_args)
    try:
        yield local.start_all()
    finally:
        local.stop_all()


def primary_index(cluster: LocalCluster, stream: str, *, via: int = 1) -> int:
    route = cluster.cluster(via).ExplainRoute(cluster_pb2.ExplainRouteRequest(stream=stream),
                                              timeout=call_timeout_s)
    return cluster.index_of(route.primary)


def other_than(cluster: LocalCluster, index: int) -> int:
    return min(i for i in cluster.running if i != index)


def create(cluster: LocalCluster, name: str, **quotas: int) -> None:
    cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(
        config=types_pb2.StreamConfig(name=name, subjects=[f"{name}.>"], **quotas)),
        timeout=call_timeout_s)


def stored(cluster: LocalCluster, name: str, *, via: int) -> int:
    info = cluster.streams(via).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name=name),
                                              timeout=call_timeout_s)
    return int(info.state.messages)


def burst(stub: Any, stream: str, count: int) -> tuple[int, list[dict[str, str]]]:
    """`count` unary publishes in flight at once: (accepted, the refusals' metadata)."""
    futures = [stub.Publish.future(streams_pb2.PublishRequest(
        stream=stream, subject=f"{stream}.x", payload=b"p"), timeout=call_timeout_s)
        for _ in range(count)]
    accepted, refused = 0, []
    for future in futures:
        try:
            future.result()
            accepted += 1
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err  # type: ignore[attr-defined]
            parsed = from_rpc_error(err)
            assert parsed is not None and parsed.reason is Reason.RATE_LIMITED, err
            refused.append(parsed.metadata)
    return accepted, refused


def publishes_again(stub: Any, stream: str) -> bool:
    try:
        stub.Publish(streams_pb2.PublishRequest(stream=stream, subject=f"{stream}.x"),
                     timeout=call_timeout_s)
    except grpc.RpcError as err:
        parsed = from_rpc_error(err)
        assert parsed is not None and parsed.reason is Reason.RATE_LIMITED, err
        return False
    return True


def test_msgs_per_s_trips_with_a_retry_hint_stores_only_what_it_accepts_and_recovers(
        cluster: LocalCluster) -> None:
    create(cluster, "rated", max_msgs_per_s=20)
    via = other_than(cluster, primary_index(cluster, "rated"))  # forwarded to the primary
    stub = cluster.streams(via)
    accepted, refused = burst(stub, "rated", 100)
    assert refused and accepted >= 20, (accepted, len(refused))
    assert all(int(meta["retry_after_ms"]) > 0 and meta["limit"] == "20" for meta in refused)
    assert stored(cluster, "rated", via=via) == accepted
    wait_until(lambda: publishes_again(stub, "rated"), recover_timeout_s,
               interval_s=0.05, what="the quota lets publishes through again")
    info = stub.GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="rated"),
                              timeout=call_timeout_s)
    assert info.config.max_msgs_per_s == 20 and info.state.messages == accepted + 1


def test_bytes_per_s_refuses_a_batch_whole_and_a_stream_by_its_tail(
        cluster: LocalCluster) -> None:
    create(cluster, "bytes", max_bytes_per_s=10_000)
    stub = cluster.streams(1)
    entries = [streams_pb2.PublishEntry(subject="bytes.x", payload=b"b" * 990)
               for _ in range(10)]  # 9,970 bytes with the subjects: the next takes ~1 s
    batch = streams_pb2.PublishBatchRequest(stream="bytes", entries=entries)
    assert stub.PublishBatch(batch, timeout=call_timeout_s).acked == 10
    with pytest.raises(grpc.RpcError) as info:
        stub.PublishBatch(batch, timeout=call_timeout_s)
    parsed = from_rpc_error(info.value)
    assert parsed is not None and parsed.reason is Reason.RATE_LIMITED, info.value
    assert parsed.metadata["measure"] == "bytes" and int(parsed.metadata["retry_after_ms"]) > 0
    assert stored(cluster, "bytes", via=1) == 10  # nothing of the refused batch
    too_big = streams_pb2.PublishBatchRequest(stream="bytes", entries=entries * 2)
    with pytest.raises(grpc.RpcError) as info:
        stub.PublishBatch(too_big, timeout=call_timeout_s)
    parsed = from_rpc_error(info.value)
    assert parsed is not None and parsed.reason is Reason.BATCH_TOO_LARGE, info.value

    def batch_passes() -> bool:
        try:
            return bool(stub.PublishBatch(batch, timeout=call_timeout_s).acked == 10)
        except grpc.RpcError as err:
            assert from_rpc_error(err).reason is Reason.RATE_LIMITED  # type: ignore[union-attr]
            return False

    wait_until(batch_passes, recover_timeout_s, interval_s=0.1, what="the batch fits again")
    # A PublishStream right after: a prefix is stored, the rest refused message by message.
    reply = stub.PublishStream(iter([streams_pb2.PublishRequest(
        stream="bytes", subject="bytes.x", payload=b"s" * 900) for _ in range(30)]),
        timeout=call_timeout_s)
    results = expand_results(reply)
    acked = sum(1 for result in results if result.HasField("ack"))
    assert [r.HasField("ack") for r in results] == [True] * acked + [False] * (30 - acked)
    assert acked < 30 and {r.error.reason for r in results[acked:]} == {"RATE_LIMITED"}
    assert stored(cluster, "bytes", via=1) == 20 + acked


def test_a_forwarded_publish_stream_goes_on_in_bounded_parts_in_order(
        cluster: LocalCluster) -> None:
    create(cluster, "split")
    via = other_than(cluster, primary_index(cluster, "split"))
    count = limits.stream_split_messages_max * 2 + 500
    reply = cluster.streams(via).PublishStream(iter([streams_pb2.PublishRequest(
        stream="split", subject="split.x", payload=str(i).encode()) for i in range(count)]),
        timeout=60)
    assert [r.ack.seq for r in expand_results(reply)] == list(range(1, count + 1))
    assert stored(cluster, "split", via=via) == count


def test_discard_new_refuses_past_max_msgs_with_a_retry_hint(cluster: LocalCluster) -> None:
    create(cluster, "full", max_msgs=3, discard=types_pb2.DISCARD_NEW)
    stub = cluster.streams(2)
    refusals = []
    for _ in range(5):
        try:
            stub.Publish(streams_pb2.PublishRequest(stream="full", subject="full.x"),
                         timeout=call_timeout_s)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err  # type: ignore[attr-defined]
            refusals.append(from_rpc_error(err))
    assert len(refusals) == 2 and all(
        r is not None and r.reason is Reason.STREAM_FULL and int(r.metadata["retry_after_ms"]) > 0
        for r in refusals), refusals
    info = stub.GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="full"),
                              timeout=call_timeout_s)
    assert (info.state.first_seq, info.state.last_seq) == (1, 3)


def test_quota_update_by_cli_survives_a_kill_of_the_primary(cluster: LocalCluster) -> None:
    create(cluster, "kept", max_msgs_per_s=1000)
    env = {**os.environ, "RAFTLOG_SERVER": cluster.address(1)}
    shown = subprocess.run(
        [str(Path(sys.executable).parent / "raftlog"), "stream", "update", "kept",
         "--max-msgs-per-s", "5", "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(shown.stdout)["info"]["config"]["max_msgs_per_s"] == 5, shown.stdout
    old = primary_index(cluster, "kept")
    cluster.kill9(old)
    try:
        survivor = other_than(cluster, old)
        stub = cluster.streams(survivor)

        def new_primary_serves() -> bool:
            with contextlib.suppress(grpc.RpcError):
                return primary_index(cluster, "kept", via=survivor) != old and \
                    stored(cluster, "kept", via=survivor) == 0
            return False

        wait_until(new_primary_serves, failover_timeout_s, interval_s=0.2,
                   what="a new primary serves the stream")
        info = stub.GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="kept"),
                                  timeout=call_timeout_s)
        assert info.config.max_msgs_per_s == 5
        accepted, refused = burst(stub, "kept", 30)
        assert refused and accepted >= 5, (accepted, len(refused))
        assert stored(cluster, "kept", via=survivor) == accepted
    finally:
        cluster.restart(old)
        wait_until(lambda: answers(cluster, "kept", via=old), failover_timeout_s,
                   interval_s=0.2, what="the restarted node answers for the stream")


def answers(cluster: LocalCluster, name: str, *, via: int) -> bool:
    try:
        stored(cluster, name, via=via)
    except grpc.RpcError:
        return False
    return True


OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # a channel with its own TCP link


class HeldCalls:
    """Calls that stay open (an unread Subscribe, or a Fetch waiting for messages), each on a
    connection of its own; `top_up` replaces those a limit refused, `close` cancels them."""

    def __init__(self, address: str, *, subscribe: bool) -> None:
        self._address = address
        self._subscribe = subscribe
        self.channels: list[grpc.Channel] = []
        self.calls: list[Any] = []

    def _open(self) -> Any:
        channel = grpc.insecure_channel(self._address, options=OWN_CONNECTION)
        self.channels.append(channel)
        stub = consumers_pb2_grpc.ConsumersStub(channel)  # type: ignore[no-untyped-call]
        if self._subscribe:
            return stub.Subscribe(consumers_pb2.SubscribeRequest(
                stream="idle", consumer="hold", heartbeat_ms=30_000), timeout=120)
        return stub.Fetch.future(consumers_pb2.FetchRequest(
            stream="idle", consumer="hold", max_wait_ms=30_000), timeout=120)

    def top_up(self, count: int, reason: Reason) -> None:
        """`count` calls open; one that ended must have been refused for `reason`: the other
        nodes' forwarded and relayed calls count on a node too (docs/quotas.md)."""
        for call in [call for call in self.calls if call.done()]:
            refused = from_rpc_error(call)
            assert refused is not None and refused.reason is reason, call
            self.calls.remove(call)
        while len(self.calls) < count:
            self.calls.append(self._open())

    def close(self) -> None:
        for call in self.calls:
            call.cancel()
        for channel in self.channels:
            channel.close()


def served(address: str, reason: Reason) -> bool:
    """Whether a call on a new connection is served (a Subscribe that ends once its consumer
    is drained); False when it is refused for `reason` with a retry hint."""
    with grpc.insecure_channel(address, options=OWN_CONNECTION) as channel:
        stub = consumers_pb2_grpc.ConsumersStub(channel)  # type: ignore[no-untyped-call]
        try:
            list(stub.Subscribe(consumers_pb2.SubscribeRequest(
                stream="idle", consumer="probe", stop_when_empty=True), timeout=call_timeout_s))
        except grpc.RpcError as err:
            parsed = from_rpc_error(err)
            assert parsed is not None and parsed.reason is reason, err
            assert int(parsed.metadata["retry_after_ms"]) > 0, parsed.metadata
            return False
    return True


@pytest.mark.parametrize(("node", "held_max", "reason"), [
    (SUBSCRIPTIONS_NODE, SUBSCRIPTIONS_MAX, Reason.TOO_MANY_SUBSCRIPTIONS),
    (CONNECTIONS_NODE, CONNECTIONS_MAX, Reason.TOO_MANY_CONNECTIONS),
])
def test_node_limit_trips_and_recovers(cluster: LocalCluster, node: int, held_max: int,
                                       reason: Reason) -> None:
    streams = cluster.streams(1)
    consumers = cluster.consumers(1)

    def made(create: Callable[[], object]) -> bool:
        """Created, or there already (the first parameter creates them); False while the
        cluster answers UNAVAILABLE (a node restarted by the test before is catching up)."""
        try:
            create()
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.ALREADY_EXISTS:  # type: ignore[attr-defined]
                return True
            if err.code() != grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                raise
            return False
        return True

    wait_until(lambda: made(lambda: streams.CreateStream(streams_pb2.CreateStreamRequest(
        config=types_pb2.StreamConfig(name="idle", subjects=["idle.>"])),
        timeout=call_timeout_s)), failover_timeout_s, interval_s=0.2, what="stream idle")
    for name in ("hold", "probe"):
        wait_until(lambda name=name: made(lambda: consumers.CreateConsumer(
            consumers_pb2.CreateConsumerRequest(stream="idle", config=consumers_pb2.
                                                ConsumerConfig(name=name)),
            timeout=call_timeout_s)), failover_timeout_s, interval_s=0.2,
            what=f"consumer {name}")
    address = cluster.address(node)
    assert served(address, reason)
    held = HeldCalls(address, subscribe=reason is Reason.TOO_MANY_SUBSCRIPTIONS)
    try:
        def trips() -> bool:
            held.top_up(held_max, reason)
            return not served(address, reason)

        wait_until(trips, recover_timeout_s, interval_s=0.2, what=f"{reason.name} trips")
    finally:
        held.close()
    wait_until(lambda: served(address, reason), recover_timeout_s, interval_s=0.2,
               what="a slot frees up")


def raftlog_cli(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    env = {**os.environ, "RAFTLOG_SERVER": cluster.address(1)}
    done = subprocess.run([str(Path(sys.executable).parent / "raftlog"), *args, "--json"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def stream_refusal(address: str, stream: str) -> dict[str, str] | None:
    """A Subscribe through `address` on a connection of its own, which ends once its consumer
    is drained: None when served, the metadata when the stream's limit refuses it."""
    with grpc.insecure_channel(address, options=OWN_CONNECTION) as channel:
        stub = consumers_pb2_grpc.ConsumersStub(channel)  # type: ignore[no-untyped-call]
        try:
            list(stub.Subscribe(consumers_pb2.SubscribeRequest(
                stream=stream, consumer="probe", stop_when_empty=True), timeout=call_timeout_s))
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err  # type: ignore[attr-defined]
            parsed = from_rpc_error(err)  # type: ignore[arg-type]
            assert parsed is not None and parsed.reason is Reason.TOO_MANY_SUBSCRIPTIONS, err
            assert parsed.metadata.get("stream") == stream, parsed.metadata  # not a node's
            return dict(parsed.metadata)
    return None


def test_a_streams_subscription_limit_trips_on_its_primary_through_any_node_and_recovers(
        cluster: LocalCluster) -> None:
    """`--max-subscriptions 1` (CLI, held in the config): one Subscribe relayed by a node that
    is not the primary is served (the relayed call counts once), and while it is open the
    primary refuses one more that arrives through the other node, which holds nothing of the
    stream itself; ending it frees the slot; an update raises the limit."""
    created = raftlog_cli(cluster, "stream", "create", "subs", "--subjects", "subs.>",
                          "--max-subscriptions", "1")
    assert created["config"]["max_subscriptions"] == 1, created
    for name in ("hold", "probe"):
        cluster.consumers(1).CreateConsumer(consumers_pb2.CreateConsumerRequest(
            stream="subs", config=consumers_pb2.ConsumerConfig(name=name)),
            timeout=call_timeout_s)
    primary = primary_index(cluster, "subs")
    relay, other = sorted(i for i in cluster.running if i != primary)
    # Served through a relaying node at a limit of 1: not counted there and on the primary.
    wait_until(lambda: stream_refusal(cluster.address(relay), "subs") is None,
               recover_timeout_s, interval_s=0.2, what="a relayed subscription is served")
    channel = grpc.insecure_channel(cluster.address(relay), options=OWN_CONNECTION)
    held = consumers_pb2_grpc.ConsumersStub(channel).Subscribe(  # type: ignore[no-untyped-call]
        consumers_pb2.SubscribeRequest(stream="subs", consumer="hold", heartbeat_ms=30_000),
        timeout=120)
    try:
        refusals: list[dict[str, str]] = []

        def trips() -> bool:
            refusal = stream_refusal(cluster.address(other), "subs")
            refusals.extend([refusal] if refusal else [])
            return refusal is not None

        wait_until(trips, recover_timeout_s, interval_s=0.2,
                   what="the stream's limit trips through the other node")
        assert refusals[-1]["limit"] == "1" and int(refusals[-1]["retry_after_ms"]) > 0
        updated = raftlog_cli(cluster, "stream", "update", "subs", "--max-subscriptions", "2")
        assert updated["info"]["config"]["max_subscriptions"] == 2, updated
        wait_until(lambda: stream_refusal(cluster.address(other), "subs") is None,
                   recover_timeout_s, interval_s=0.2, what="a raised limit lets one more in")
        raftlog_cli(cluster, "stream", "update", "subs", "--max-subscriptions", "1")
        wait_until(lambda: stream_refusal(cluster.address(other), "subs") is not None,
                   recover_timeout_s, interval_s=0.2, what="the lowered limit trips again")
    finally:
        held.cancel()
        channel.close()
    wait_until(lambda: stream_refusal(cluster.address(other), "subs") is None,
               recover_timeout_s, interval_s=0.2, what="the slot comes back")
    info = cluster.streams(other).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="subs"),
                                                timeout=call_timeout_s)
    assert info.config.max_subscriptions == 1
