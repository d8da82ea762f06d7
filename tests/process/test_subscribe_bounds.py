"""Subscribe resource bounds against real node processes (issue 10, item 10): Subscribe calls
whose client never reads cost a node a bounded amount of memory (served locally, and relayed
by a node that is not the stream's primary), and a node holds at most limits.subscriptions_max
of them: beyond it Subscribe fails with RESOURCE_EXHAUSTED / TOO_MANY_SUBSCRIPTIONS, and a slot
frees up when a call ends.

The clients are raw channels without gRPC's BDP probe, so that each call's receive window stays
at 64 KiB and whatever piles up does so in the node, not in this process. Before the fix, each
unread call held a whole fetch (64 messages by default, here 64 x 64 KiB) on the serving node
and a grown flow-control window of the primary's answer on a relaying node.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from raftlog.base import limits
from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import NodeProcess, wait_until
from raftlog.node.transport import rpc
from raftlog.v1 import (
    cluster_pb2,
    consumers_pb2,
    consumers_pb2_grpc,
    streams_pb2,
    streams_pb2_grpc,
    types_pb2,
)

call_timeout_s = 10.0
settle_timeout_s = 20.0
subscriptions = 64
payload_bytes = 64 * 1024
# Before the fix the served case grew by ~256 MiB (64 calls x 64 messages x 64 KiB) and the
# relayed one by ~4 MiB per call; after it, well under 16 MiB for either.
rss_growth_mib_max = 48
SUBSCRIBE = "/raftlog.v1.Consumers/Subscribe"
RAW_OPTIONS = [("grpc.http2.bdp_probe", 0)]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@contextlib.contextmanager
def unread_calls(address: str, requests: list[consumers_pb2.SubscribeRequest]
                 ) -> Iterator[list[Any]]:
    """Subscribe calls that nobody reads, cancelled and closed on the way out."""
    channel = grpc.insecure_channel(address, options=RAW_OPTIONS)
    subscribe = channel.unary_stream(SUBSCRIBE, request_serializer=None,
                                     response_deserializer=None)
    calls: list[Any] = []
    try:
        for request in requests:
            calls.append(subscribe(request.SerializeToString(), timeout=120))
        yield calls
    finally:
        for call in calls:
            call.cancel()
        channel.close()


def streams_stub(channel: grpc.Channel) -> Any:
    return streams_pb2_grpc.StreamsStub(channel)  # type: ignore[no-untyped-call]


def _fill(streams: Any, consumers: Any, *, stream: str, replicas: int = 0) -> list[str]:
    """A stream of 64 messages of 64 KiB and one consumer per subscription."""
    streams.CreateStream(streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(
        name=stream, subjects=[f"{stream}.>"], replicas=replicas)), timeout=call_timeout_s)
    streams.PublishBatch(streams_pb2.PublishBatchRequest(stream=stream, entries=[
        streams_pb2.PublishEntry(subject=f"{stream}.x", payload=bytes([i]) * payload_bytes)
        for i in range(64)]), timeout=call_timeout_s)
    names = [f"c{i}" for i in range(subscriptions)]
    for name in names:
        consumers.CreateConsumer(consumers_pb2.CreateConsumerRequest(
            stream=stream, config=consumers_pb2.ConsumerConfig(name=name)),
            timeout=call_timeout_s)
    return names


def _wait_delivery_settles(consumers: Any, stream: str, names: list[str]) -> list[int]:
    """Waits until every consumer delivered something and nothing moved for a poll."""
    seen: list[list[int]] = [[]]

    def settled() -> bool:
        delivered = [consumers.GetConsumerInfo(consumers_pb2.GetConsumerInfoRequest(
            stream=stream, consumer=name), timeout=call_timeout_s).state.delivered_seq
            for name in names]
        previous, seen[0] = seen[0], delivered
        return min(delivered) > 0 and delivered == previous

    wait_until(settled, settle_timeout_s, interval_s=0.5, what="deliveries settled")
    return seen[0]


def test_unread_subscriptions_hold_bounded_memory(node_proc: NodeProcess) -> None:
    with node_proc.channel() as channel:
        consumers = consumers_pb2_grpc.ConsumersStub(channel)  # type: ignore[no-untyped-call]
        names = _fill(streams_stub(channel), consumers, stream="mem")
        before = rss_mib(node_proc.pid)
        requests = [consumers_pb2.SubscribeRequest(stream="mem", consumer=n) for n in names]
        with unread_calls(node_proc.address, requests):
            delivered = _wait_delivery_settles(consumers, "mem", names)
            growth = rss_mib(node_proc.pid) - before
    print(f"served: rss {before:.0f} MiB, +{growth:.1f} MiB with {subscriptions} unread calls;"
          f" delivered per consumer {min(delivered)}..{max(delivered)}")
    assert growth < rss_growth_mib_max, (growth, delivered)


def test_unread_relayed_subscriptions_hold_bounded_memory_on_the_relay(
        cluster3: LocalCluster) -> None:
    consumers = cluster3.consumers(1)
    names = _fill(cluster3.streams(1), consumers, stream="relayed", replicas=1)
    route = cluster3.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(stream="relayed"),
                                             timeout=call_timeout_s)
    primary = cluster3.index_of(route.primary)
    relay = min(i for i in cluster3.running if i != primary)
    pids = {i: cluster3.node(i).pid for i in (relay, primary)}
    before = {i: rss_mib(pid) for i, pid in pids.items()}
    requests = [consumers_pb2.SubscribeRequest(stream="relayed", consumer=n) for n in names]
    with unread_calls(cluster3.address(relay), requests):
        delivered = _wait_delivery_settles(consumers, "relayed", names)
        growth = {i: rss_mib(pid) - before[i] for i, pid in pids.items()}
    print(f"relayed: +{growth[relay]:.1f} MiB on the relay, +{growth[primary]:.1f} MiB on the "
          f"primary with {subscriptions} unread calls; delivered {min(delivered)}.."
          f"{max(delivered)}")
    assert max(growth.values()) < rss_growth_mib_max, (growth, delivered)
    # A relayed subscription that is read still gets everything, in order.
    consumers.CreateConsumer(consumers_pb2.CreateConsumerRequest(
        stream="relayed", config=consumers_pb2.ConsumerConfig(name="reader")),
        timeout=call_timeout_s)
    events = cluster3.consumers(relay).Subscribe(consumers_pb2.SubscribeRequest(
        stream="relayed", consumer="reader", stop_when_empty=True), timeout=call_timeout_s)
    seqs = [event.message.seq for event in events if event.HasField("message")]
    assert seqs == list(range(1, 65)), seqs


def _probe(channel: grpc.Channel) -> grpc.StatusCode:
    """A Subscribe that ends by itself when it gets a slot (its consumer is drained)."""
    stub = consumers_pb2_grpc.ConsumersStub(channel)  # type: ignore[no-untyped-call]
    try:
        events = list(stub.Subscribe(consumers_pb2.SubscribeRequest(
            stream="idle", consumer="probe", stop_when_empty=True), timeout=call_timeout_s))
    except grpc.RpcError as err:
        code: grpc.StatusCode = err.code()  # type: ignore[attr-defined]
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            parsed = rpc.from_rpc_error(err)
            assert parsed is not None and parsed.reason is Reason.TOO_MANY_SUBSCRIPTIONS, err
            assert parsed.metadata["limit"] == str(limits.subscriptions_max), err
        return code
    assert events[-1].stopped.reason == "drained", events
    return grpc.StatusCode.OK


def test_a_node_holds_at_most_subscriptions_max_and_a_slot_frees_when_a_call_ends(
        node_proc: NodeProcess) -> None:
    with node_proc.channel() as channel:
        consumers = consumers_pb2_grpc.ConsumersStub(channel)  # type: ignore[no-untyped-call]
        streams_stub(channel).CreateStream(streams_pb2.CreateStreamRequest(
            config=types_pb2.StreamConfig(name="idle", subjects=["idle.>"])),
            timeout=call_timeout_s)
        for name in ("hold", "probe"):
            consumers.CreateConsumer(consumers_pb2.CreateConsumerRequest(
                stream="idle", config=consumers_pb2.ConsumerConfig(name=name)),
                timeout=call_timeout_s)
        assert _probe(channel) == grpc.StatusCode.OK
        hold = consumers_pb2.SubscribeRequest(stream="idle", consumer="hold",
                                              heartbeat_ms=limits.fetch_wait_ms_max)
        with unread_calls(node_proc.address, [hold] * limits.subscriptions_max) as calls:
            wait_until(lambda: _probe(channel) == grpc.StatusCode.RESOURCE_EXHAUSTED,
                       settle_timeout_s, interval_s=0.2, what="the subscription limit trips")
            calls[0].cancel()
            wait_until(lambda: _probe(channel) == grpc.StatusCode.OK, settle_timeout_s,
                       interval_s=0.2, what="a slot frees up")
            assert _probe(channel) == grpc.StatusCode.OK  # the probe's own slot came back
        wait_until(lambda: _probe(channel) == grpc.StatusCode.OK, settle_timeout_s,
                   what="every slot back")
