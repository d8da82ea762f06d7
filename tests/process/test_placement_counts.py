"""Issue 10 item 9 end to end (real node processes): migrating a single-replica stream and
moving an R3 stream to a node without a copy, a migrate that cannot finish leaving the stream
served, replica counts following the config up and down (and back to it after a migrate),
UpdateStream reporting what it pruned through any node, and the Raft leader leaving the
cluster."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import grpc
import pytest

from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.internal import replication_pb2
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import cluster_pb2, streams_pb2, types_pb2
from tests.process.cluster_helpers import local_copy, route
from tests.process.cluster_helpers import placement_call_timeout_s as call_timeout_s

settle_s = 15.0  # replica set changes (janitor passes every second) and catch-up


def create(cluster: LocalCluster, name: str, *, replicas: int, **limits: int) -> None:
    """Creates the stream through node 1, retrying while the fresh cluster answers
    UNAVAILABLE (a node still catching up with the metadata)."""
    request = streams_pb2.CreateStreamRequest(
        config=types_pb2.StreamConfig(name=name, replicas=replicas, **limits))

    def created() -> bool:
        try:
            cluster.streams(1).CreateStream(request, timeout=call_timeout_s)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True

    wait_until(created, settle_s, interval_s=0.2, what=f"stream {name} created")


def publish(cluster: LocalCluster, name: str, count: int, *, via: int = 1,
            prefix: str = "m") -> list[int]:
    reply = cluster.streams(via).PublishBatch(streams_pb2.PublishBatchRequest(
        stream=name, entries=[streams_pb2.PublishEntry(subject="s", payload=b"%s%d" % (
            prefix.encode(), i)) for i in range(count)]), timeout=call_timeout_s)
    assert (reply.acked, reply.failed) == (count, 0), reply
    if reply.first_seq:
        return list(range(reply.first_seq, reply.first_seq + count))
    return [r.ack.seq for r in reply.results]


def writable(cluster: LocalCluster, name: str, *, via: int) -> bool:
    try:
        cluster.streams(via).Publish(streams_pb2.PublishRequest(
            stream=name, subject="s", payload=b"probe"), timeout=2)
    except grpc.RpcError:
        return False
    return True


def holders(cluster: LocalCluster, name: str) -> set[str]:
    """The running nodes that hold a local copy of the stream."""
    found = set()
    for i in sorted(cluster.running):
        state = cluster.replication(i).GetReplicaState(
            replication_pb2.GetReplicaStateRequest(stream=name), timeout=call_timeout_s)
        if state.exists:
            found.add(cluster.specs[i].node_id)
    return found


def replicas(cluster: LocalCluster, name: str) -> list[str]:
    return sorted(route(cluster, name).replicas)


def route_via(cluster: LocalCluster, name: str, via: int) -> cluster_pb2.RouteExplanation:
    answer: cluster_pb2.RouteExplanation = cluster.cluster(via).ExplainRoute(
        cluster_pb2.ExplainRouteRequest(stream=name), timeout=call_timeout_s)
    return answer


def other_node(cluster: LocalCluster, *not_these: str) -> str:
    return next(s.node_id for i, s in sorted(cluster.specs.items())
                if s.node_id not in not_these)


def test_a_single_replica_stream_migrates(cluster3: LocalCluster) -> None:
    create(cluster3, "solo", replicas=1)
    publish(cluster3, "solo", 100)
    before = route(cluster3, "solo")
    assert list(before.replicas) == [before.primary]
    target = other_node(cluster3, before.primary)
    moved = cluster3.cluster(1).MigrateStream(cluster_pb2.MigrateStreamRequest(
        stream="solo", target=target), timeout=call_timeout_s)
    assert (moved.from_node, moved.to_node) == (before.primary, target)
    assert moved.fence_epoch > before.fence_epoch
    wait_until(lambda: replicas(cluster3, "solo") == [target], settle_s,
               what="one replica again, on the target")
    assert publish(cluster3, "solo", 10, via=2, prefix="after") == list(range(101, 111))
    wait_until(lambda: holders(cluster3, "solo") == {target}, settle_s,
               what="the old primary deleted its copy")
    copy = local_copy(cluster3, cluster3.index_of(target), "solo")
    assert sorted(copy) == list(range(1, 111))
    assert copy[1] == b"m0" and copy[101] == b"after0"


def test_an_r3_stream_moves_to_a_node_without_a_copy(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c4", nodes=4).start_all() as cluster:
        create(cluster, "wide", replicas=3)
        publish(cluster, "wide", 100)
        before = route(cluster, "wide")
        spare = other_node(cluster, *before.replicas)
        moved = cluster.cluster(1).MigrateStream(cluster_pb2.MigrateStreamRequest(
            stream="wide", target=spare), timeout=call_timeout_s)
        assert moved.to_node == spare
        wait_until(lambda: route(cluster, "wide").primary == spare
                   and len(route(cluster, "wide").replicas) == 3, settle_s,
                   what="the spare leads three replicas")
        assert publish(cluster, "wide", 10, via=2, prefix="after") == list(range(101, 111))
        wait_until(lambda: holders(cluster, "wide") == set(route(cluster, "wide").replicas),
                   settle_s, what="only the replicas hold a copy")
        for node in route(cluster, "wide").replicas:
            wait_until(lambda n=node: sorted(local_copy(cluster, cluster.index_of(n), "wide"))
                       == list(range(1, 111)), settle_s, what=f"{node} holds seqs 1..110")


def test_a_migrate_that_cannot_finish_leaves_the_stream_served(cluster3: LocalCluster) -> None:
    """The target stops answering once it is added: the move fails and the old primary keeps
    serving, with its replica set as before."""
    create(cluster3, "stuck", replicas=1)
    publish(cluster3, "stuck", 50)
    primary = route(cluster3, "stuck").primary
    leader = cluster3.wait_for_leader(10)
    target = other_node(cluster3, primary, leader)  # not the Raft leader: Raft carries on
    victim = cluster3.node(cluster3.index_of(target))
    via = cluster3.index_of(primary)
    os.kill(victim.pid, signal.SIGSTOP)  # a child of this cluster, alive
    try:
        with pytest.raises(grpc.RpcError) as failed:
            cluster3.cluster(via).MigrateStream(cluster_pb2.MigrateStreamRequest(
                stream="stuck", target=target), timeout=call_timeout_s)
        assert failed.value.code() != grpc.StatusCode.DEADLINE_EXCEEDED, failed.value
        assert writable(cluster3, "stuck", via=via), "the stream must be served right away"
        after = route(cluster3, "stuck")
        assert (after.primary, list(after.replicas)) == (primary, [primary])
        assert publish(cluster3, "stuck", 5, via=via, prefix="after") == list(range(52, 57))
    finally:
        os.kill(victim.pid, signal.SIGCONT)
    copy = local_copy(cluster3, via, "stuck")
    assert sorted(copy) == list(range(1, 57))


def test_replica_counts_follow_the_config_up_and_down(cluster3: LocalCluster) -> None:
    create(cluster3, "grow", replicas=1)  # (retries while the fresh cluster catches up)
    # More copies than members is refused (never quietly lowered), on create and on update.
    for via in (1, 2, 3):
        with pytest.raises(grpc.RpcError) as refused:
            cluster3.streams(via).CreateStream(streams_pb2.CreateStreamRequest(
                config=types_pb2.StreamConfig(name=f"wide-{via}", replicas=4)),
                timeout=call_timeout_s)
        found = from_rpc_error(refused.value)
        assert found is not None and found.reason is Reason.INSUFFICIENT_REPLICAS, refused.value
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    listed = cluster3.streams(1).ListStreams(streams_pb2.ListStreamsRequest(),
                                             timeout=call_timeout_s)
    assert [info.config.name for info in listed.streams] == ["grow"]
    # A created stream serves at once: the create answers once its primary holds a lease, so a
    # first publish through another node needs no retry.
    for via in (1, 2, 3):
        cluster3.streams(via).CreateStream(streams_pb2.CreateStreamRequest(
            config=types_pb2.StreamConfig(name=f"ready-{via}", replicas=3)),
            timeout=call_timeout_s)
        reply = cluster3.streams(via % 3 + 1).PublishBatch(streams_pb2.PublishBatchRequest(
            stream=f"ready-{via}", entries=[streams_pb2.PublishEntry(subject="s", payload=b"x")]),
            timeout=call_timeout_s)
        assert reply.acked == 1
    with pytest.raises(grpc.RpcError) as refused:
        cluster3.streams(2).UpdateStream(streams_pb2.UpdateStreamRequest(
            name="grow", replicas=5), timeout=call_timeout_s)
    found = from_rpc_error(refused.value)
    assert found is not None and found.reason is Reason.INSUFFICIENT_REPLICAS, refused.value
    assert route(cluster3, "grow").replicas == [route(cluster3, "grow").primary]
    publish(cluster3, "grow", 100)
    primary = route(cluster3, "grow").primary
    everyone = {s.node_id for s in cluster3.specs.values()}
    cluster3.streams(2).UpdateStream(streams_pb2.UpdateStreamRequest(name="grow", replicas=3),
                                     timeout=call_timeout_s)
    wait_until(lambda: set(route(cluster3, "grow").replicas) == everyone, settle_s,
               what="grown to three replicas")
    for i in (1, 2, 3):
        wait_until(lambda i=i: len(local_copy(cluster3, i, "grow")) == 100, settle_s,
                   what=f"node {i} caught up")
    cluster3.streams(3).UpdateStream(streams_pb2.UpdateStreamRequest(name="grow", replicas=1),
                                     timeout=call_timeout_s)
    wait_until(lambda: replicas(cluster3, "grow") == [primary], settle_s,
               what="shrunk to the primary alone")
    wait_until(lambda: holders(cluster3, "grow") == {primary}, settle_s,
               what="the removed replicas deleted their copies")
    assert publish(cluster3, "grow", 10, via=2, prefix="after") == list(range(101, 111))
    # A migrate brings the set back to the config's count too (R2 here).
    cluster3.streams(1).UpdateStream(streams_pb2.UpdateStreamRequest(name="grow", replicas=2),
                                     timeout=call_timeout_s)
    wait_until(lambda: len(route(cluster3, "grow").replicas) == 2, settle_s, what="R2")
    before = route(cluster3, "grow")
    target = other_node(cluster3, *before.replicas)
    cluster3.cluster(1).MigrateStream(cluster_pb2.MigrateStreamRequest(
        stream="grow", target=target), timeout=call_timeout_s)
    wait_until(lambda: len(route(cluster3, "grow").replicas) == 2
               and route(cluster3, "grow").primary == target, settle_s,
               what="two replicas after the migrate")
    wait_until(lambda: holders(cluster3, "grow") == set(route(cluster3, "grow").replicas),
               settle_s, what="two copies after the migrate")
    copy = local_copy(cluster3, cluster3.index_of(target), "grow")
    assert sorted(copy) == list(range(1, 111))


def test_update_stream_reports_what_it_pruned_through_any_node(
    cluster3: LocalCluster,
) -> None:
    create(cluster3, "prune", replicas=3)
    publish(cluster3, "prune", 100)
    for via, max_msgs, pruned in ((1, 10, 90), (2, 5, 5), (3, 2, 3)):
        reply = cluster3.streams(via).UpdateStream(streams_pb2.UpdateStreamRequest(
            name="prune", max_msgs=max_msgs), timeout=call_timeout_s)
        assert (reply.pruned, reply.info.state.messages) == (pruned, max_msgs), via
    unchanged = cluster3.streams(1).UpdateStream(streams_pb2.UpdateStreamRequest(
        name="prune", max_msgs=2), timeout=call_timeout_s)
    assert unchanged.pruned == 0


def test_the_raft_leader_can_leave(cluster3: LocalCluster) -> None:
    """The leaving member is the Raft leader and the primary of a stream: it hands Raft
    leadership over, the stream is drained off it, and it leaves."""
    leader = cluster3.wait_for_leader(10)
    asker = cluster3.index_of(leader)
    create(cluster3, "held", replicas=3)
    publish(cluster3, "held", 100)
    if route_via(cluster3, "held", asker).primary != leader:
        cluster3.cluster(asker).MigrateStream(cluster_pb2.MigrateStreamRequest(
            stream="held", target=leader), timeout=call_timeout_s)
    assert route_via(cluster3, "held", asker).primary == leader
    status = cluster3.cluster(asker).LeaveNode(cluster_pb2.LeaveNodeRequest(node_id=leader),
                                               timeout=call_timeout_s * 2)
    assert leader not in [n.node_id for n in status.nodes]
    assert status.raft_leader and status.raft_leader != leader
    rest = [i for i in sorted(cluster3.specs) if cluster3.specs[i].node_id != leader]
    after = route_via(cluster3, "held", rest[0])
    assert leader not in after.replicas and after.primary != leader
    assert publish(cluster3, "held", 10, via=rest[0], prefix="after") == list(range(101, 111))
    wait_until(lambda: sorted(local_copy(cluster3, cluster3.index_of(after.primary), "held"))
               == list(range(1, 111)), settle_s, what="all messages on the new primary")
