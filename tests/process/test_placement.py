"""Issue 4 item 6 end to end: migrate and rebalance through the admin API under a publisher,
a leaving member drained first, and a long-dead member's replicas re-created elsewhere."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.v1 import cluster_pb2, streams_pb2, types_pb2
from tests.process.cluster_helpers import local_copy, route

call_timeout_s = 15.0


class Publisher(threading.Thread):
    """Publishes through every node in turn until stopped; remembers what was acknowledged."""

    def __init__(self, cluster: LocalCluster, stream: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.stream = cluster, stream
        self.acked: dict[int, bytes] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        count, via = 0, 1
        while not self.stopping.is_set() and count < 100_000:
            payload = b"m%d" % count
            try:
                ack = self.cluster.streams(via).Publish(streams_pb2.PublishRequest(
                    stream=self.stream, subject="s", payload=payload, msg_id=payload.decode()),
                    timeout=2)
                self.acked[ack.seq] = payload
                count += 1
            except grpc.RpcError:
                via = via % len(self.cluster.specs) + 1
                self.stopping.wait(0.02)

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


def assert_acked_present(cluster: LocalCluster, stream: str, acked: dict[int, bytes]) -> None:
    primary = cluster.index_of(route(cluster, stream).primary)
    for seq, payload in acked.items():
        message = cluster.streams(primary).GetMessage(streams_pb2.GetMessageRequest(
            stream=stream, seq=seq), timeout=call_timeout_s)
        assert message.payload == payload, f"seq {seq}"


def test_migrate_and_rebalance_under_a_publisher(cluster3: LocalCluster) -> None:
    cluster3.streams(1).CreateStream(streams_pb2.CreateStreamRequest(
        config=types_pb2.StreamConfig(name="moving")), timeout=call_timeout_s)
    publisher = Publisher(cluster3, "moving")
    publisher.start()
    try:
        wait_until(lambda: len(publisher.acked) > 50, 20, what="publishes before the move")
        before = route(cluster3, "moving")
        target = next(n for n in before.replicas if n != before.primary)
        moved = cluster3.cluster(2).MigrateStream(cluster_pb2.MigrateStreamRequest(
            stream="moving", target=target), timeout=call_timeout_s)
        assert (moved.from_node, moved.to_node) == (before.primary, target)
        assert moved.fence_epoch == before.fence_epoch + 1
        wait_until(lambda: route(cluster3, "moving").primary == target, 5,
                   what="every node sees the new primary")
        assert route(cluster3, "moving").override_claimant == target
        count = len(publisher.acked)
        wait_until(lambda: len(publisher.acked) > count + 50, 20, what="publishes after")
        back = before.primary
        plan = cluster3.cluster(3).RebalanceStreams(cluster_pb2.RebalanceStreamsRequest(steps=[
            cluster_pb2.RebalanceStep(stream="moving", target=back),
            cluster_pb2.RebalanceStep(stream="missing", target=back),
        ]), timeout=call_timeout_s * 2)
        assert (plan.succeeded, plan.failed) == (1, 1)
        assert plan.outcomes[0].ok and plan.outcomes[0].result.to_node == back
        assert plan.outcomes[1].error.reason == "STREAM_NOT_FOUND"
        count = len(publisher.acked)
        wait_until(lambda: len(publisher.acked) > count + 50, 20, what="publishes after")
    finally:
        publisher.stop()
    wait_until(lambda: route(cluster3, "moving").primary == back, 5, what="moved back")
    # Back on its ring owner, the override redirects nothing: the janitor clears it.
    if route(cluster3, "moving").ring_owner == back:
        wait_until(lambda: not route(cluster3, "moving").override_claimant, 10,
                   what="the redundant override cleared")
    assert_acked_present(cluster3, "moving", publisher.acked)


def test_a_leaving_member_is_drained_first(cluster3: LocalCluster, tmp_path: Path) -> None:
    cluster3.streams(1).CreateStream(streams_pb2.CreateStreamRequest(
        config=types_pb2.StreamConfig(name="held", replicas=3)), timeout=call_timeout_s)
    cluster3.streams(2).PublishBatch(streams_pb2.PublishBatchRequest(stream="held", entries=[
        streams_pb2.PublishEntry(subject="s", payload=b"%d" % i) for i in range(100)]),
        timeout=call_timeout_s)
    leaving = route(cluster3, "held").primary
    asker = next(i for i in (1, 2, 3) if cluster3.node(i).spec.node_id != leaving)
    status = cluster3.cluster(asker).LeaveNode(cluster_pb2.LeaveNodeRequest(node_id=leaving),
                                               timeout=call_timeout_s * 2)
    assert leaving not in [n.node_id for n in status.nodes]
    wait_until(lambda: leaving not in route(cluster3, "held").replicas, 5, what="drained")
    after = route(cluster3, "held")
    assert leaving not in after.replicas and after.primary != leaving
    survivor = cluster3.index_of(after.primary)

    def state() -> tuple[int, int] | None:
        """None while the new primary answers UNAVAILABLE (promoted a moment ago, it serves
        once a majority of its replicas has answered it within its lease: retry)."""
        try:
            info = cluster3.streams(survivor).GetStreamInfo(streams_pb2.GetStreamInfoRequest(
                name="held"), timeout=call_timeout_s)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                raise
            return None
        return info.state.messages, info.state.last_seq

    # last_seq is the commit seq: a primary promoted a moment ago counts it from its first
    # replication round with a majority.
    wait_until(lambda: state() == (100, 100), 5, what="all 100 committed on the new primary")


@pytest.mark.slow
def test_a_dead_members_replicas_are_recreated_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAFTLOG_REPLACE_DEAD_AFTER", "2s")
    with LocalCluster(tmp_path / "c4", nodes=4).start_all() as cluster:
        cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(
            config=types_pb2.StreamConfig(name="r3", replicas=3)), timeout=call_timeout_s)
        cluster.streams(1).PublishBatch(streams_pb2.PublishBatchRequest(stream="r3", entries=[
            streams_pb2.PublishEntry(subject="s", payload=b"%d" % i) for i in range(50)]),
            timeout=call_timeout_s)
        before = route(cluster, "r3")
        spare = next(s.node_id for s in cluster.specs.values()
                     if s.node_id not in before.replicas)
        victim = next(n for n in before.replicas if n != before.primary)
        cluster.kill9(cluster.index_of(victim))
        wait_until(lambda: spare in route(cluster, "r3").replicas, 30,
                   what=f"{spare} replacing {victim}")
        assert victim not in route(cluster, "r3").replicas
        wait_until(lambda: len(local_copy(cluster, cluster.index_of(spare), "r3")) == 50, 20,
                   what="the new replica caught up")


def test_a_replica_behind_the_primarys_head_is_reseeded(cluster3: LocalCluster) -> None:
    cluster3.streams(1).CreateStream(streams_pb2.CreateStreamRequest(
        config=types_pb2.StreamConfig(name="trim", max_msgs=50)), timeout=call_timeout_s)
    placed = route(cluster3, "trim")
    lagging = next(n for n in placed.replicas if n != placed.primary)
    index = cluster3.index_of(lagging)
    cluster3.streams(1).PublishBatch(streams_pb2.PublishBatchRequest(stream="trim", entries=[
        streams_pb2.PublishEntry(subject="s", payload=b"a%d" % i) for i in range(20)]),
        timeout=call_timeout_s)
    wait_until(lambda: len(local_copy(cluster3, index, "trim")) == 20, 10,
               what="the replica holds the first 20")
    cluster3.kill9(index)
    primary = cluster3.index_of(placed.primary)
    for chunk in range(4):  # 200 more: the primary keeps seqs 171..220 only
        cluster3.streams(primary).PublishBatch(streams_pb2.PublishBatchRequest(
            stream="trim", entries=[streams_pb2.PublishEntry(subject="s", payload=b"b%d" % i)
                                    for i in range(chunk * 50, chunk * 50 + 50)]),
            timeout=call_timeout_s)
    cluster3.start(index)
    wanted = local_copy(cluster3, primary, "trim")
    assert sorted(wanted) == list(range(171, 221))
    wait_until(lambda: local_copy(cluster3, index, "trim") == wanted, 20,
               what="the returning replica re-seeded from the primary's head")
