"""A node that restarts is reachable through the others at once (node/transport/forwarding.py):
while it was down, another node's channel to it failed and went into its reconnect backoff; a
call forwarded to it right after it serves again (it sent nothing yet) goes once more on a fresh
channel instead of failing with FORWARD_FAILED until the backoff ends. While the node is down,
calls forwarded to it still fail at once: a caller looking for a new Raft leader must not wait
out a backoff on the old one."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.v1 import cluster_pb2, streams_pb2, types_pb2
from tests.process.cluster_helpers import error_reason

call_timeout_s = 10.0
ready_timeout_s = 30.0
OWNER = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root: Path = tmp_path_factory.mktemp("forward-restart") / "cluster"
    made = LocalCluster(root, nodes=3)
    try:
        yield made.start_all()
    finally:
        made.stop_all()


def owned_by(cluster: LocalCluster, index: int) -> str:
    for k in range(1000):
        name = f"r1-{k}"
        route = cluster.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(stream=name),
                                                timeout=call_timeout_s)
        if cluster.index_of(route.primary) == index:
            return name
    raise AssertionError(f"no stream name placed on n{index}")


def reason_of_info(cluster: LocalCluster, via: int, name: str) -> Reason | None:
    return error_reason(lambda: cluster.streams(via).GetStreamInfo(
        streams_pb2.GetStreamInfoRequest(name=name), timeout=call_timeout_s))


def test_a_call_forwarded_to_a_node_that_just_restarted_reaches_it(
        cluster: LocalCluster) -> None:
    name = owned_by(cluster, OWNER)  # one copy, on n2: no failover moves it elsewhere
    cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(
        config=types_pb2.StreamConfig(name=name, subjects=[f"{name}.>"], replicas=1)),
        timeout=call_timeout_s)
    assert reason_of_info(cluster, 1, name) is None
    cluster.kill9(OWNER)
    # While n2 is down, calls through node 1 keep failing: each connection attempt of node
    # 1's channel to n2 fails and puts it into its reconnect backoff (growing to a second).
    stop = threading.Event()
    while_down: list[tuple[float, Reason | None]] = []

    def keep_calling() -> None:
        while not stop.is_set():
            began = time.monotonic()
            reason = reason_of_info(cluster, 1, name)
            while_down.append((time.monotonic() - began, reason))
            time.sleep(0.05)

    caller = threading.Thread(target=keep_calling, daemon=True)
    caller.start()
    try:
        time.sleep(2.5)
        cluster.start(OWNER)  # returns once n2 serves gRPC
    finally:
        stop.set()
        caller.join(timeout=call_timeout_s)
    failed_s = [took for took, reason in while_down if reason is not None]
    assert len(failed_s) >= 3, while_down
    # Each failed at once, the first ones (before n2 was found silent) too: a forwarder that
    # waited for its channel took 1.5 s each.
    assert max(failed_s) < 1.2, while_down
    seen: list[Reason | None] = []

    def served() -> bool:
        seen.append(reason_of_info(cluster, 1, name))
        return seen[-1] is None

    wait_until(served, ready_timeout_s, interval_s=0.1, what=f"{name} served through n1")
    # Every answer after the restart came from n2 itself (e.g. its copy not ready yet), none
    # from node 1 failing to reach it.
    assert Reason.FORWARD_FAILED not in seen, seen
