"""Issue 3 end to end: a real 3-process cluster where any node serves any request, a killed
Raft leader is replaced, nodes join and leave, and everything survives a full restart."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import NodeProcess, free_port, wait_until
from raftlog.internal import replication_pb2
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import cluster_pb2, consumers_pb2, streams_pb2, types_pb2

call_timeout_s = 10.0
# A bound that catches a stuck or slow election, not the figure itself: it is 0.3-0.5 s on a
# quiet machine (docs/benchmarks.md, "Metadata"), but a CI run once measured 2.00 s with the
# suite's other processes on the same 2 cores. The benchmark measures the figure.
metadata_recovery_bound_s = 3.0


def reason_of(call: object, request: object, **kwargs: object) -> Reason:
    with pytest.raises(grpc.RpcError) as info:
        call(request, **kwargs)  # type: ignore[operator]
    err = from_rpc_error(info.value)
    assert err is not None, info.value.details()
    return err.reason


def create(cluster: LocalCluster, i: int, name: str, **fields: object) -> types_pb2.StreamInfo:
    info: types_pb2.StreamInfo = cluster.streams(i).CreateStream(
        streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(name=name, **fields)),  # type: ignore[arg-type]
        timeout=call_timeout_s)
    return info


def test_any_node_serves_any_request(cluster3: LocalCluster) -> None:
    create(cluster3, 1, "orders", subjects=["orders.>"])
    primary = cluster3.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(
        stream="orders"), timeout=call_timeout_s).primary
    for index in range(10):
        ack = cluster3.streams(1 + index % 3).Publish(streams_pb2.PublishRequest(
            stream="orders", subject=f"orders.{index % 2}", payload=b"%d" % index),
            timeout=call_timeout_s)
        # whichever node was called, the primary acknowledged, in the stream's first epoch
        assert (ack.seq, ack.epoch, ack.primary) == (index + 1, 1, primary)
    batch = cluster3.streams(3).PublishBatch(streams_pb2.PublishBatchRequest(
        stream="orders", entries=[streams_pb2.PublishEntry(subject="orders.b", payload=b"b")] * 90),
        timeout=call_timeout_s)
    assert batch.acked == 90
    assert (batch.first_seq, batch.epoch, batch.primary) == (11, 1, primary)
    cluster3.consumers(2).CreateConsumer(consumers_pb2.CreateConsumerRequest(
        stream="orders", config=consumers_pb2.ConsumerConfig(name="c")), timeout=call_timeout_s)
    fetched = cluster3.consumers(2).Fetch(consumers_pb2.FetchRequest(
        stream="orders", consumer="c", batch=1000, max_wait_ms=500), timeout=call_timeout_s)
    assert [m.seq for m in fetched.messages] == list(range(1, 101))
    assert fetched.messages[0].payload == b"0"
    acked = cluster3.consumers(1).Ack(consumers_pb2.AckRequest(
        stream="orders", consumer="c", seqs=[m.seq for m in fetched.messages]),
        timeout=call_timeout_s)
    assert acked.applied == 100
    for i in (1, 2, 3):
        info = cluster3.streams(i).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="orders"),
                                                 timeout=call_timeout_s)
        assert (info.state.messages, info.state.last_seq) == (100, 100)
        consumer = cluster3.consumers(i).GetConsumerInfo(consumers_pb2.GetConsumerInfoRequest(
            stream="orders", consumer="c"), timeout=call_timeout_s)
        assert consumer.state.ack_floor == 100
    listed = cluster3.streams(2).ListStreams(streams_pb2.ListStreamsRequest(),
                                             timeout=call_timeout_s)
    assert [(s.config.name, s.state.messages) for s in listed.streams] == [("orders", 100)]
    route = cluster3.cluster(3).ExplainRoute(cluster_pb2.ExplainRouteRequest(stream="orders"),
                                             timeout=call_timeout_s)
    assert route.exists and route.primary == route.ring_owner and len(route.replicas) == 3
    assert route.fence_epoch == 1 and route.reason


def test_watch_stats_and_overrides(cluster3: LocalCluster) -> None:
    import threading

    events: list[cluster_pb2.WatchEvent] = []
    watch = cluster3.cluster(2).WatchStreams(cluster_pb2.WatchStreamsRequest(), timeout=30)

    def collect() -> None:
        try:
            for event in watch:
                events.append(event)
        except grpc.RpcError:
            pass

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    try:
        time.sleep(0.3)
        for name in ("w1", "w2", "w3", "w4"):
            create(cluster3, 1, name)
        cluster3.consumers(3).CreateConsumer(consumers_pb2.CreateConsumerRequest(
            stream="w1", config=consumers_pb2.ConsumerConfig(name="c")), timeout=call_timeout_s)
        cluster3.streams(1).PublishBatch(streams_pb2.PublishBatchRequest(stream="w2", entries=[
            streams_pb2.PublishEntry(subject="s", payload=b"x" * 10)] * 7), timeout=call_timeout_s)
        w3 = cluster3.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(stream="w3"),
                                              timeout=call_timeout_s)
        target = next(n for n in w3.replicas if n != w3.primary)
        cluster3.cluster(1).MigrateStream(cluster_pb2.MigrateStreamRequest(
            stream="w3", target=target, pin=True), timeout=call_timeout_s)
        cluster3.streams(2).DeleteStream(streams_pb2.DeleteStreamRequest(name="w4"),
                                         timeout=call_timeout_s)
        wanted = {(cluster_pb2.WATCH_EVENT_TYPE_STREAM_CREATED, "w1"),
                  (cluster_pb2.WATCH_EVENT_TYPE_CONSUMER_CREATED, "w1"),
                  (cluster_pb2.WATCH_EVENT_TYPE_STREAM_DELETED, "w4")}
        wait_until(lambda: wanted <= {(e.type, e.stream) for e in events}, 10,
                   what="watch events")
    finally:
        watch.cancel()
    stats = cluster3.cluster(3).GetClusterStreamStats(cluster_pb2.GetClusterStreamStatsRequest(),
                                                      timeout=call_timeout_s)
    assert sorted(s.stream for s in stats.streams) == ["w1", "w2", "w3"]
    assert sum(n.streams for n in stats.nodes) == 3 and all(n.reachable for n in stats.nodes)
    assert next(s for s in stats.streams if s.stream == "w2").messages == 7
    assert stats.stream_skew >= 1.0
    overrides = cluster3.cluster(2).ListAuthorityOverrides(
        cluster_pb2.ListAuthorityOverridesRequest(), timeout=call_timeout_s)
    assert [(o.stream, o.claimant, o.pinned) for o in overrides.overrides] == [
        ("w3", target, True)]
    assert reason_of(cluster3.cluster(2).ClearStreamAuthority,
                     cluster_pb2.ClearStreamAuthorityRequest(stream="w3"),
                     timeout=call_timeout_s) is Reason.STREAM_PINNED
    cluster3.cluster(3).SetStreamPinned(cluster_pb2.SetStreamPinnedRequest(
        stream="w3", pinned=False), timeout=call_timeout_s)
    cleared = cluster3.cluster(2).ClearStreamAuthority(cluster_pb2.ClearStreamAuthorityRequest(
        stream="w3"), timeout=call_timeout_s)
    assert cleared.cleared
    assert not cluster3.cluster(2).ClearStreamAuthority(cluster_pb2.ClearStreamAuthorityRequest(
        stream="w1"), timeout=call_timeout_s).cleared


def test_a_killed_raft_leader_is_replaced_and_metadata_works_again_within_seconds(
    cluster3: LocalCluster,
) -> None:
    leader = cluster3.wait_for_leader(10)
    cluster3.kill9(cluster3.index_of(leader))
    survivor = next(i for i in (1, 2, 3) if cluster3.node(i).spec.node_id != leader)
    killed_at = time.monotonic()
    attempt = 0
    while True:
        try:
            create(cluster3, survivor, f"after-{attempt}")
            break
        except grpc.RpcError as err:
            assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            attempt += 1
            assert time.monotonic() - killed_at < 10, "no leader after 10 s"
            time.sleep(0.02)
    took_s = time.monotonic() - killed_at
    print(f"metadata commit works again {took_s:.2f} s after kill -9 of the Raft leader")
    assert took_s < metadata_recovery_bound_s
    assert cluster3.wait_for_leader(10, exclude=[leader]) != leader


def test_a_node_joins_and_leaves(cluster3: LocalCluster, tmp_path: Path) -> None:
    grpc_port, raft_port, peer_port = free_port(), free_port(), free_port()
    n4 = NodeProcess(tmp_path / "n4", port=grpc_port, extra_args=(
        "--raft", f"127.0.0.1:{raft_port}", "--peer", f"127.0.0.1:{peer_port}",
        "--node-id", "n4", "--secret-file", str(cluster3.secret_path),
        "--peers", ",".join(cluster3.node(i).spec.raft_address for i in (1, 2, 3))))
    join = cluster_pb2.JoinNodeRequest(node_id="n4", raft_address=f"127.0.0.1:{raft_port}",
                                       grpc_address=f"127.0.0.1:{grpc_port}",
                                       peer_address=f"127.0.0.1:{peer_port}")
    try:
        n4.start()  # a node is started first, then joined (a learner step checks it)
        status = cluster3.cluster(2).JoinNode(join, timeout=call_timeout_s)
        assert "n4" in [n.node_id for n in status.nodes]
        assert reason_of(cluster3.cluster(1).JoinNode, join, timeout=call_timeout_s) \
            is Reason.NODE_EXISTS
        cluster_stub = cluster3.cluster(1)

        def n4_connected() -> bool:
            nodes = cluster_stub.GetClusterStatus(cluster_pb2.GetClusterStatusRequest(),
                                                  timeout=call_timeout_s).nodes
            return any(n.node_id == "n4" and n.connected for n in nodes)

        wait_until(n4_connected, 20, what="n4 connected")
        create(cluster3, 1, "after-join", replicas=4)
        cluster3.streams(3).PublishBatch(streams_pb2.PublishBatchRequest(
            stream="after-join", entries=[streams_pb2.PublishEntry(subject="s", payload=b"j")
                                          for _ in range(20)]), timeout=call_timeout_s)
        held = cluster3.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(
            stream="after-join"), timeout=call_timeout_s)
        assert "n4" in held.replicas
        # Leaving moves n4's copies (and primaries) elsewhere first.
        status = cluster3.cluster(3).LeaveNode(cluster_pb2.LeaveNodeRequest(node_id="n4"),
                                               timeout=call_timeout_s)
        assert "n4" not in [n.node_id for n in status.nodes]
        moved = cluster3.cluster(2).ExplainRoute(cluster_pb2.ExplainRouteRequest(
            stream="after-join"), timeout=call_timeout_s)
        assert "n4" not in moved.replicas and moved.primary != "n4"
        info = cluster3.streams(1).GetStreamInfo(streams_pb2.GetStreamInfoRequest(
            name="after-join"), timeout=call_timeout_s)
        assert info.state.messages == 20
        assert reason_of(cluster3.cluster(1).LeaveNode, cluster_pb2.LeaveNodeRequest(
            node_id="n4"), timeout=call_timeout_s) is Reason.NODE_NOT_FOUND
        create(cluster3, 2, "after-leave")
    finally:
        n4.cleanup()


def test_all_state_survives_a_full_cluster_restart(cluster3: LocalCluster) -> None:
    create(cluster3, 1, "keep", max_msgs=1000)
    create(cluster3, 2, "other")
    cluster3.streams(3).PublishBatch(streams_pb2.PublishBatchRequest(
        stream="keep", entries=[streams_pb2.PublishEntry(subject="k", payload=b"%d" % i)
                                for i in range(50)]), timeout=call_timeout_s)
    cluster3.consumers(1).CreateConsumer(consumers_pb2.CreateConsumerRequest(
        stream="keep", config=consumers_pb2.ConsumerConfig(name="c")), timeout=call_timeout_s)
    fetched = cluster3.consumers(1).Fetch(consumers_pb2.FetchRequest(
        stream="keep", consumer="c", batch=20), timeout=call_timeout_s)
    cluster3.consumers(1).Ack(consumers_pb2.AckRequest(
        stream="keep", consumer="c", seqs=[m.seq for m in fetched.messages]),
        timeout=call_timeout_s)
    for i in (1, 2, 3):
        cluster3.kill9(i)
    for i in (1, 2, 3):
        cluster3.start(i)
    cluster3.wait_for_leader(30)

    def restored() -> bool:
        try:
            info = cluster3.streams(2).GetStreamInfo(streams_pb2.GetStreamInfoRequest(
                name="keep"), timeout=2)
        except grpc.RpcError:
            return False
        return info.state.last_seq == 50 and info.state.messages == 50

    wait_until(restored, 30, what="stream readable after restart")
    # Node 3 lists from its own metadata view, which may still be replaying its journal right
    # after the restart (ListStreams does not wait for the leader's commit index; until its users
    # are applied again it answers UNAVAILABLE): both streams must be there once it caught up.
    def listed_by_node3() -> bool:
        try:
            listed = cluster3.streams(3).ListStreams(streams_pb2.ListStreamsRequest(),
                                                      timeout=call_timeout_s)
        except grpc.RpcError as err:
            if err.code() is not grpc.StatusCode.UNAVAILABLE:
                raise
            return False  # still replaying: it says so and asks for a retry
        return [s.config.name for s in listed.streams] == ["keep", "other"]

    wait_until(listed_by_node3, 15, what="both streams listed by node 3")
    info = cluster3.streams(1).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="keep"),
                                             timeout=call_timeout_s)
    assert info.config.max_msgs == 1000
    consumer = cluster3.consumers(3).GetConsumerInfo(consumers_pb2.GetConsumerInfoRequest(
        stream="keep", consumer="c"), timeout=call_timeout_s)
    assert consumer.state.ack_floor == 20
    more = cluster3.consumers(2).Fetch(consumers_pb2.FetchRequest(
        stream="keep", consumer="c", batch=100), timeout=call_timeout_s)
    assert [m.seq for m in more.messages] == list(range(21, 51))
    # No node took a stream it holds for deleted because its metadata had not caught up yet
    # (pysyncobj's "ready" can come before the journal replay): every copy kept its messages.
    for i in (1, 2, 3):
        assert "removing the local copy" not in cluster3.nodes[i].log_path.read_text()
        copy = cluster3.replication(i).ReadLocal(
            replication_pb2.ReadLocalRequest(stream="keep"), timeout=call_timeout_s)
        assert (copy.state.first_seq, copy.state.last_seq, len(copy.messages)) == (1, 50, 50)


def test_forwarding_loops_and_missing_leaders_fail_fast(cluster3: LocalCluster) -> None:
    create(cluster3, 1, "loop")
    route = cluster3.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(stream="loop"),
                                             timeout=call_timeout_s)
    other = next(i for i in (1, 2, 3) if cluster3.node(i).spec.node_id != route.primary)
    looped = reason_of(cluster3.streams(other).GetStreamInfo,
                       streams_pb2.GetStreamInfoRequest(name="loop"),
                       metadata=(("raftlog-hops", "3"),), timeout=call_timeout_s)
    assert looped is Reason.HOP_LIMIT
    cluster3.kill9(2)
    cluster3.kill9(3)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        create(cluster3, 1, "no-quorum")
    assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert time.monotonic() - started < call_timeout_s + 1


def test_a_deleted_stream_leaves_nothing_behind_on_any_replica(cluster3: LocalCluster) -> None:
    create(cluster3, 1, "gone")
    cluster3.streams(2).PublishBatch(streams_pb2.PublishBatchRequest(stream="gone", entries=[
        streams_pb2.PublishEntry(subject="s", payload=b"old")] * 30), timeout=call_timeout_s)
    cluster3.consumers(3).CreateConsumer(consumers_pb2.CreateConsumerRequest(
        stream="gone", config=consumers_pb2.ConsumerConfig(name="c")), timeout=call_timeout_s)
    cluster3.streams(3).DeleteStream(streams_pb2.DeleteStreamRequest(name="gone"),
                                     timeout=call_timeout_s)

    def copies() -> list[bool]:
        return [cluster3.replication(i).ReadLocal(
            replication_pb2.ReadLocalRequest(stream="gone"), timeout=call_timeout_s).state.exists
            for i in (1, 2, 3)]

    wait_until(lambda: not any(copies()), 10, what="every local copy removed")
    create(cluster3, 2, "gone")
    info = cluster3.streams(1).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="gone"),
                                             timeout=call_timeout_s)
    assert (info.state.messages, info.state.last_seq, info.state.consumers) == (0, 0, 0)
    assert reason_of(cluster3.consumers(1).GetConsumerInfo, consumers_pb2.GetConsumerInfoRequest(
        stream="gone", consumer="c"), timeout=call_timeout_s) is Reason.CONSUMER_NOT_FOUND
