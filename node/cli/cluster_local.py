"""`raftlog cluster up|secret|down`: a cluster of node processes on loopback, through
`localcluster`, without a node connection. `up` starts the nodes and waits for a Raft leader
with every member, `down` stops the nodes `up` recorded, `secret` prints a new cluster secret.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raftlog.node.cli import certs, localcluster
from raftlog.node.cli import format as fmt
from raftlog.node.cli.base import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    emit,
    positive,
    seconds,
    show,
    typed,
    warn,
)
from raftlog.node.cli.cluster_base import add_data, local_leaf
from raftlog.node.transport.credentials import generate_secret
from raftlog.v1 import cluster_pb2

base_port_default = 7400  # n1 then serves gRPC on the CLI's default server address
nodes_default = 3


def add_local_commands(cluster: Any) -> None:
    up = local_leaf(cluster, "up", _cluster_up, "start a cluster of node processes on loopback")
    up.add_argument("--nodes", type=positive, default=nodes_default, metavar="N", help="default 3")
    up.add_argument(
        "--base-port",
        type=positive,
        default=base_port_default,
        metavar="P",
        help="node i serves gRPC on P+3(i-1), Raft on the port after it and its peer "
        "listener on the next (default 7400)",
    )
    add_data(up, required=True)
    up.add_argument("--secret-file", type=Path, metavar="FILE",
                    help="the cluster secret (default: DIR/cluster.secret, made when missing)")
    up.add_argument(
        "--no-wait", action="store_true", help="return once started, without waiting for Raft"
    )
    up.add_argument("--tls", action="store_true",
                    help="serve TLS: a CA and node certificates under DIR/tls (docs/tls.md)")
    up.add_argument("--tls-client-auth", choices=["none", "require"], default="none",
                    help="with --tls: whether client ports require a client certificate "
                    "(default none)")
    up.add_argument("--log-format", choices=["text", "json"], default="text",
                    help="the nodes' log format, in DIR/n*.log (default text; docs/logging.md)")
    up.add_argument("--metrics-base-port", type=positive, default=None, metavar="P",
                    help="node i serves Prometheus metrics on its host at port P+i-1 "
                    "(default: none; docs/metrics.md)")
    up.add_argument(
        "--ready-timeout",
        type=typed(seconds),
        default=localcluster.ready_timeout_s_default,
        metavar="DURATION",
        help="how long to wait for a leader and all members (default 60s)",
    )
    local_leaf(cluster, "secret", _cluster_secret,
               "print a new cluster secret (64 random hex digits) for --secret-file")
    down = local_leaf(cluster, "down", _cluster_down, "stop the nodes that `up` recorded")
    add_data(down, required=True)
    down.add_argument(
        "--stop-timeout",
        type=typed(seconds),
        default=localcluster.stop_timeout_s_default,
        metavar="DURATION",
        help="SIGTERM, then SIGKILL after this long (default 15s)",
    )


def _cluster_up(args: argparse.Namespace) -> int:
    if args.tls_client_auth != "none" and not args.tls:
        warn("error: --tls-client-auth needs --tls")
        return EXIT_USAGE
    node_args = [*(["--log-format", "json"] if args.log_format == "json" else []),
                 *(["--tls-client-auth", args.tls_client_auth] if args.tls else [])]
    nodes = localcluster.up(
        nodes=args.nodes,
        base_port=args.base_port,
        data_dir=args.data,
        secret_file=args.secret_file,
        extra_args=lambda spec: [*node_args, *_metrics_args(spec, args.metrics_base_port)],
        tls=args.tls,
    )
    ready: cluster_pb2.ClusterStatus | None = None
    failure: localcluster.LocalClusterError | None = None
    if not args.no_wait:
        try:
            ready = localcluster.wait_ready(nodes, args.ready_timeout)
        except localcluster.LocalClusterError as exc:
            failure = exc
    document = {
        "nodes": [_local_node_dict(node) for node in nodes],
        "ready": ready is not None,
        "raft_leader": ready.raft_leader if ready is not None else "",
    }
    emit(args, document, lambda: _up_text(nodes, ready))
    root = nodes[0].spec.root
    if failure is not None:
        warn(fmt.error_text(failure.reason.name, failure.message, {}))
        warn(
            f"nodes that still run are left running: see {root}/n*.log, stop them with "
            f"`raftlog cluster down --data {root}`"
        )
        return EXIT_ERROR
    secret = args.secret_file or nodes[0].spec.secret_path
    warn(f"admin calls (join, leave, migrate, pin, rebalance) need the cluster secret: "
         f"export RAFTLOG_SECRET_FILE={secret}")
    if args.tls:
        client = certs.paths_of(root, certs.CLIENT_NAME)
        warn(f"TLS on: connect with --tls-ca {client.ca} (or export "
             f"RAFTLOG_TLS_CA={client.ca}); a client certificate: --tls-cert {client.cert} "
             f"--tls-key {client.key}")
    warn(f"stop with: raftlog cluster down --data {root}")
    return EXIT_OK


def _metrics_args(spec: localcluster.NodeSpec, base_port: int | None) -> list[str]:
    """Node i's --metrics flag: port base_port + i - 1 on its host (none without a base)."""
    if base_port is None:
        return []
    return ["--metrics", f"{spec.host}:{base_port + spec.index - 1}"]


def _cluster_secret(args: argparse.Namespace) -> int:
    show(generate_secret())
    return EXIT_OK


def _local_node_dict(node: localcluster.LocalNode) -> dict[str, object]:
    return {
        "node_id": node.node_id,
        "grpc_address": node.grpc_address,
        "raft_address": node.raft_address,
        "peer_address": node.spec.peer_address,
        "metrics_address": node.record().metrics_address,
        "pid": node.pid,
        "log": str(node.log_path),
        "data_dir": str(node.spec.data_dir),
    }


def _up_text(
    nodes: Sequence[localcluster.LocalNode], ready: cluster_pb2.ClusterStatus | None
) -> str:
    table = fmt.render_table(
        ["ID", "GRPC", "RAFT", "PEER", "PID", "LOG"],
        [(n.node_id, n.grpc_address, n.raft_address, n.spec.peer_address, n.pid, n.log_path)
         for n in nodes],
        right_align=[4],
    )
    if ready is None:
        return table
    return f"{table}\n\nready: Raft leader {ready.raft_leader}, term {ready.raft_term}"


def _cluster_down(args: argparse.Namespace) -> int:
    results = localcluster.down(args.data, args.stop_timeout)
    document = {
        "stopped": [
            {"node_id": r.node_id, "pid": r.pid, "outcome": r.outcome.value} for r in results
        ]
    }

    def text() -> str:
        if not results:
            return f"no nodes recorded under {args.data}"
        rows = [(r.node_id, r.pid or "-", r.outcome.value) for r in results]
        return fmt.render_table(["ID", "PID", "OUTCOME"], rows, right_align=[1])

    emit(args, document, text)
    survivors = [r for r in results if r.outcome is localcluster.StopOutcome.SURVIVED]
    for result in results:
        if result.outcome is localcluster.StopOutcome.REFUSED:
            warn(
                f"{result.node_id}: pid {result.pid} now belongs to another program; "
                "not signalled, stale pid file removed"
            )
        elif result.outcome is localcluster.StopOutcome.UNREADABLE:
            warn(f"{result.node_id}: cannot read {result.pid_path}; left in place")
    if survivors:
        names = ", ".join(f"{r.node_id} (pid {r.pid})" for r in survivors)
        warn(fmt.error_text("STOP_FAILED", f"still running after SIGKILL: {names}", {}))
        return EXIT_ERROR
    return EXIT_OK
