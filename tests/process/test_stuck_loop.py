"""Issue 10, item 5: a node that cannot serve is not alive. Liveness comes from the event loop
that serves requests, not from a thread that keeps ticking while the loop is stuck.

A node started with $RAFTLOG_DEBUG_FREEZE_S blocks its event loop for that long on SIGUSR1,
while pysyncobj's tick thread and gRPC's threads keep running. Frozen: the Raft leader, which
also leads a stream. Expected: another node leads Raft, and the stream moves to another node
and takes writes, all while the frozen node is still frozen; afterwards it rejoins as a
follower and nothing acknowledged is lost.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc
import pytest

from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.v1 import cluster_pb2, streams_pb2
from tests.process.cluster_helpers import create, seconds_until_writable

freeze_s = 8.0
moved_within_s = 4.0  # leadership and the stream elsewhere, while the node is still frozen
call_timeout_s = 10.0


def test_a_raft_leader_whose_loop_is_stuck_loses_raft_and_its_streams(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAFTLOG_DEBUG_FREEZE_S", str(freeze_s))
    with LocalCluster(tmp_path / "c", nodes=3).start_all() as cluster:
        leader = cluster.wait_for_leader(10)
        for k in range(12):
            route = create(cluster, f"frozen{k}")
            if route.primary == leader:
                break
        else:
            pytest.skip("no stream landed on the Raft leader in 12 tries")
        frozen = cluster.index_of(leader)
        others = [i for i in (1, 2, 3) if i != frozen]
        term = cluster.status(others[0]).raft_term
        os.kill(cluster.node(frozen).pid, signal.SIGUSR1)
        frozen_at = time.monotonic()
        new_leader = cluster.wait_for_leader(moved_within_s, exclude=[leader])
        took = seconds_until_writable(cluster, route.stream, since=frozen_at, via=others,
                                      bound_s=moved_within_s)
        elapsed = time.monotonic() - frozen_at
        print(f"new Raft leader {new_leader}; {route.stream} writable {took:.2f} s after the "
              f"freeze began")
        assert elapsed < freeze_s, "the stream only moved once the freeze was over"
        after = cluster.cluster(others[0]).ExplainRoute(
            cluster_pb2.ExplainRouteRequest(stream=route.stream), timeout=call_timeout_s)
        assert after.primary != leader and after.fence_epoch > route.fence_epoch
        assert cluster.status(others[0]).raft_term > term
        # Once it runs again it follows the new leader; nothing acknowledged was lost.
        time.sleep(max(0.0, freeze_s - (time.monotonic() - frozen_at)) + 0.5)

        def follows() -> bool:
            try:
                status = cluster.status(frozen)
            except grpc.RpcError:
                return False
            return status.raft_leader not in ("", leader)

        wait_until(follows, 10, what="the frozen node following the new leader")
        info = cluster.streams(others[0]).GetStreamInfo(
            streams_pb2.GetStreamInfoRequest(name=route.stream), timeout=call_timeout_s)
        assert info.state.messages >= 21
