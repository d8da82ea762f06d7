"""Waiting for a local cluster's nodes: until each serves gRPC health (`wait_serving`), then
until one of them shows a Raft leader with every node a member, all have caught up with the
metadata and each has heard from every other (`wait_ready`). A node whose process exits
meanwhile fails the wait at once, with the end of its log.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raftlog.node.cli.localcluster_layout import LocalClusterError, Refusal
from raftlog.node.cli.localcluster_procs import (
    LocalNode,
    ProcessState,
    _option,
    deadline_iter,
    process_state,
)
from raftlog.v1 import cluster_pb2, cluster_pb2_grpc

ready_timeout_s_default = 60.0
probe_timeout_s = 1.0  # one health or status call while waiting


def _check_running(node: LocalNode) -> None:
    exited = (
        node.process.poll() is not None
        if node.process is not None
        else process_state(node.record()) is not ProcessState.RUNNING
    )
    if exited:
        raise LocalClusterError(
            Refusal.START_FAILED,
            f"{node.node_id} (pid {node.pid}) exited; end of {node.log_path}:\n{node.log_tail()}",
        )


def is_serving(channel: grpc.Channel, *, timeout_s: float = probe_timeout_s) -> bool:
    # types-grpcio-health-checking declares HealthStub without its methods.
    stub: Any = health_pb2_grpc.HealthStub(channel)
    try:
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
    except grpc.RpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def wait_serving(nodes: Sequence[LocalNode], timeout_s: float) -> None:
    """Until every node's gRPC health check says SERVING; raises START_FAILED as soon as a node
    exits, NOT_READY at the deadline."""
    with _channels(nodes) as channels:
        waiting = set(range(len(nodes)))
        for remaining_s in deadline_iter(timeout_s):
            for i in sorted(waiting):
                _check_running(nodes[i])
                if is_serving(channels[i], timeout_s=min(probe_timeout_s, remaining_s)):
                    waiting.discard(i)
            if not waiting:
                return
    names = ", ".join(nodes[i].node_id for i in sorted(waiting))
    raise LocalClusterError(Refusal.NOT_READY, f"not serving within {timeout_s:g} s: {names}")


def wait_ready(nodes: Sequence[LocalNode], timeout_s: float) -> cluster_pb2.ClusterStatus:
    """Until every node serves gRPC health, has caught up with the metadata and has heard from
    every other one of `nodes` (liveness gives a node it has not heard from since it started its
    longest allowance before a failover, so a node stopped before that would fail over slowly),
    and one node's GetClusterStatus shows a Raft leader and all of `nodes` as members; returns
    that status."""
    deadline = time.monotonic() + timeout_s
    wait_serving(nodes, timeout_s)
    expected = {node.node_id for node in nodes}
    seen: dict[str, str] = {}  # each node's last answer, for the error
    caught_up: set[str] = set()
    meshed: set[str] = set()  # nodes that have heard from every other one of `nodes`
    with _channels(nodes) as channels:
        for remaining_s in deadline_iter(deadline - time.monotonic()):
            ready: cluster_pb2.ClusterStatus | None = None
            for node, channel in zip(nodes, channels, strict=True):
                _check_running(node)
                answer = _cluster_status(channel, timeout_s=min(probe_timeout_s, remaining_s))
                if isinstance(answer, str):
                    seen[node.node_id] = answer
                    continue
                if answer.caught_up:
                    caught_up.add(node.node_id)
                members = {member.node_id for member in answer.nodes}
                unheard = expected - {m.node_id for m in answer.nodes if m.heard_from}
                if not unheard:
                    meshed.add(node.node_id)
                seen[node.node_id] = (f"leader {answer.raft_leader or 'none'}, members "
                                      f"{sorted(members)}, caught up {answer.caught_up}, not "
                                      f"heard from {sorted(unheard) or 'none'}")
                if answer.raft_leader and expected <= members:
                    ready = answer
            if ready is not None and caught_up >= expected and meshed >= expected:
                return ready
    last_seen = "; ".join(f"{node_id}: {view}" for node_id, view in sorted(seen.items()))
    raise LocalClusterError(
        Refusal.NOT_READY,
        f"no Raft leader with all {len(nodes)} members caught up and hearing from each other "
        f"within {timeout_s:g} s "
        f"({last_seen or 'no answer yet'})",
    )


def _cluster_status(channel: grpc.Channel, *, timeout_s: float) -> cluster_pb2.ClusterStatus | str:
    """The node's status, or why there is none (a line of text). A node that does not serve
    the Cluster service never will: that raises NOT_READY at once."""
    try:
        return cluster_pb2_grpc.ClusterStub(channel).GetClusterStatus(
            cluster_pb2.GetClusterStatusRequest(), timeout=timeout_s
        )
    except grpc.RpcError as exc:
        if not isinstance(exc, grpc.Call):
            return str(exc)
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            raise LocalClusterError(
                Refusal.NOT_READY, f"the node does not serve the Cluster service: {exc.details()}"
            ) from None
        return f"{exc.code().name}: {exc.details()}"


def channel_to(node: LocalNode) -> grpc.Channel:
    """A channel to the node's client port; to a node started with TLS, a TLS channel that
    trusts its CA and presents the node's own certificate (accepted whatever
    --tls-client-auth says)."""
    ca, cert, key = (_option(node.command, flag)
                     for flag in ("--tls-ca", "--tls-cert", "--tls-key"))
    if not ca:
        return grpc.insecure_channel(node.grpc_address)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=Path(ca).read_bytes(), private_key=Path(key).read_bytes(),
        certificate_chain=Path(cert).read_bytes())
    return grpc.secure_channel(node.grpc_address, credentials)


@contextlib.contextmanager
def _channels(nodes: Sequence[LocalNode]) -> Iterator[list[grpc.Channel]]:
    channels = [channel_to(node) for node in nodes]
    try:
        yield channels
    finally:
        for channel in channels:
            channel.close()

