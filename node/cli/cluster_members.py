"""`raftlog cluster status|join|leave`: the cluster's members as one node sees them (with
`status --data DIR`, also the local processes of that directory), and changing them one node at
a time. `join` and `leave` are admin calls: they need the cluster secret (--secret-file).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any

import grpc

from raftlog.node.cli import format as fmt
from raftlog.node.cli import localcluster
from raftlog.node.cli.base import (
    EXIT_ERROR,
    EXIT_OK,
    address,
    common_options,
    emit,
    leaf,
    tls_from,
    typed,
    warn,
)
from raftlog.node.cli.client import Client, default_server, describe_failure
from raftlog.node.cli.cluster_base import add_data, guarded, stub
from raftlog.node.config import default_peer_address
from raftlog.v1 import cluster_pb2


def add_member_commands(cluster: Any) -> None:
    status = cluster.add_parser(
        "status",
        help="members, the Raft leader, terms and health",
        description="Members, the Raft leader, terms and each node's health, as --server sees "
        "them. With --data, also the local processes; --server then defaults to a running "
        "node of that directory.",
        parents=[common_options(per_command=True)],
    )
    add_data(status, required=False)
    status.set_defaults(run=guarded(_cluster_status))
    join = leaf(cluster, "join", _cluster_join,
                "add a running node to the cluster (start it first, with --peers naming the "
                "members and the cluster secret)")
    join.add_argument("node_id", metavar="NODE_ID")
    join.add_argument("--raft", required=True, type=typed(address), metavar="HOST:PORT")
    join.add_argument("--grpc", required=True, type=typed(address), metavar="HOST:PORT")
    join.add_argument("--peer", type=typed(address), metavar="HOST:PORT",
                      help="its peer listener (default: the Raft host, Raft port + 1)")
    leave = leaf(cluster, "leave", _cluster_leave, "remove a node (then stop it)")
    leave.add_argument("node_id", metavar="NODE_ID")


def _cluster_status(args: argparse.Namespace) -> int:
    local = localcluster.status(args.data) if args.data is not None else None
    server = _status_server(args.server, local)
    try:
        answer = asyncio.run(_get_status(server, timeout_s=args.timeout or None,
                                         tls=tls_from(args)))
    except grpc.RpcError as exc:
        if local is not None:
            emit(args, {"local": _local_dicts(local)}, lambda: _local_table(local))
        warn(describe_failure(exc, address=server))
        return EXIT_ERROR
    document = fmt.proto_dict(answer)
    if local is not None:
        document["local"] = _local_dicts(local)
    emit(args, document, lambda: _status_text(answer, local))
    return EXIT_OK


def _status_server(server: str, local: Sequence[localcluster.NodeProcessStatus] | None) -> str:
    """--server, unless it was left at the default and --data names nodes elsewhere."""
    if local is None or server != default_server():
        return server
    running = [node.grpc_address for node in local if node.alive]
    return server if server in running or not running else running[0]


async def _get_status(server: str, *, timeout_s: float | None,
                      tls: grpc.ChannelCredentials | None = None) -> cluster_pb2.ClusterStatus:
    async with Client(server, timeout_s=timeout_s, tls=tls) as client:
        return await stub(client).GetClusterStatus(
            cluster_pb2.GetClusterStatusRequest(), timeout=client.deadline_s()
        )


def _local_dicts(local: Sequence[localcluster.NodeProcessStatus]) -> list[dict[str, object]]:
    return [
        {
            "node_id": node.node_id,
            "pid": node.pid,
            "state": node.state.value,
            "grpc_address": node.grpc_address,
            "raft_address": node.raft_address,
            "log": str(node.log_path),
        }
        for node in local
    ]


def _local_table(local: Sequence[localcluster.NodeProcessStatus]) -> str:
    if not local:
        return "no local nodes recorded"
    rows = [(n.node_id, n.pid, n.state.value, n.grpc_address, n.log_path) for n in local]
    return fmt.render_table(["ID", "PID", "PROCESS", "GRPC", "LOG"], rows, right_align=[1])


def health_name(value: cluster_pb2.NodeHealth.ValueType) -> str:
    return cluster_pb2.NodeHealth.Name(value).removeprefix("NODE_HEALTH_").lower()


def _status_text(
    status: cluster_pb2.ClusterStatus,
    local: Sequence[localcluster.NodeProcessStatus] | None = None,
) -> str:
    by_id = {node.node_id: node for node in local or ()}
    headers = ["ID", "HEALTH", "LEADER", "CONNECTED", "HEARD", "GRPC", "RAFT", "PRIMARIES",
               "REPLICAS"]
    if local is not None:
        headers += ["PID", "PROCESS"]
    rows = []
    for node in status.nodes:
        row: list[object] = [
            node.node_id,
            health_name(node.health),
            "*" if node.node_id == status.raft_leader else "",
            "yes" if node.connected else "no",
            "yes" if node.heard_from else "no",
            node.grpc_address,
            node.raft_address,
            node.primaries,
            node.replicas,
        ]
        if local is not None:
            mine = by_id.get(node.node_id)
            row += [mine.pid, mine.state.value] if mine else ["-", "-"]
        rows.append(row)
    head = (
        f"Raft leader {status.raft_leader or 'none'}, term {status.raft_term}, "
        f"commit {status.commit_index}, applied {status.applied_index} "
        f"(answered by {status.answered_by or '?'})"
    )
    lines = [head, "", fmt.render_table(headers, rows, right_align=[7, 8])]
    members = {node.node_id for node in status.nodes}
    strays = [node for node in local or () if node.node_id not in members]
    if strays:
        lines += ["", "local nodes that are not members:", _local_table(strays)]
    return "\n".join(lines)


async def _cluster_join(client: Client, args: argparse.Namespace) -> int:
    request = cluster_pb2.JoinNodeRequest(
        node_id=args.node_id, raft_address=args.raft, grpc_address=args.grpc,
        peer_address=args.peer or default_peer_address(args.raft),
    )
    status = await stub(client).JoinNode(request, timeout=client.deadline_s(),
                                         metadata=client.admin("JoinNode"))
    emit(args, fmt.proto_dict(status), lambda: _status_text(status))
    return EXIT_OK


async def _cluster_leave(client: Client, args: argparse.Namespace) -> int:
    request = cluster_pb2.LeaveNodeRequest(node_id=args.node_id)
    status = await stub(client).LeaveNode(request, timeout=client.deadline_s(),
                                          metadata=client.admin("LeaveNode"))
    emit(args, fmt.proto_dict(status), lambda: _status_text(status))
    warn(f"{args.node_id} left the cluster; stop its process now")
    return EXIT_OK
