"""The plan of a local cluster: node names, ports, paths and command lines, worked out without
starting anything; and the errors every local-cluster action raises.

The layout of the cluster directory (node i, 1-based):

    DIR/n{i}/      the node's data          DIR/n{i}.log   its stdout and stderr (appended)
    DIR/n{i}.pid   line 1: the pid; line 2: the exact command line, as a JSON list
    DIR/cluster.secret   the cluster secret (mode 0600), made by `up` unless one is given
    DIR/tls/             with TLS: the CA, each node's certificate and a client's (certs.py)

and the ports: node i serves gRPC on `base_port + 3*(i-1)`, Raft on the port after it and its
peer listener on the one after that, all on 127.0.0.1 (or on the node's own `host`, when the
chaos harness puts each node in its own network namespace); `--peers` names the other nodes'
Raft addresses.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from raftlog.node.cli.certs import paths_of
from raftlog.node.transport.credentials import (
    SECRET_FILE_NAME,
    WeakSecret,
    ensure_secret_file,
    read_secret_file,
)

LOOPBACK_HOST = "127.0.0.1"
host = LOOPBACK_HOST  # where a node listens unless its NodeSpec names another host
nodes_max = 32
ports_per_node = 3  # gRPC, Raft, peer listener


class Refusal(enum.Enum):
    """Why a local-cluster action did not happen; the name is printed as the error reason."""

    INVALID_ARGUMENT = "the request itself is wrong"
    PORT_IN_USE = "a port the cluster needs is taken"
    ALREADY_RUNNING = "a pid file names a node that is running"
    START_FAILED = "a node process exited while starting"
    NOT_READY = "the cluster did not become ready in time"
    STOP_FAILED = "a node survived SIGKILL"


class LocalClusterError(Exception):
    def __init__(self, reason: Refusal, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


# ---------------------------------------------------------------------------------------------
# Plan: names, ports and paths, without touching anything.


@dataclass(frozen=True)
class NodeSpec:
    index: int  # 1-based
    root: Path  # the cluster directory, absolute
    base_port: int
    peers: tuple[str, ...]  # Raft addresses of the other nodes
    host: str = LOOPBACK_HOST  # the address it binds (the chaos harness's hosts mode: its own)

    @property
    def node_id(self) -> str:
        return f"n{self.index}"

    @property
    def grpc_port(self) -> int:
        return self.base_port + ports_per_node * (self.index - 1)

    @property
    def raft_port(self) -> int:
        return self.grpc_port + 1

    @property
    def peer_port(self) -> int:
        return self.grpc_port + 2

    @property
    def peer_address(self) -> str:
        return f"{self.host}:{self.peer_port}"

    @property
    def secret_path(self) -> Path:
        return self.root / SECRET_FILE_NAME

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def raft_address(self) -> str:
        return f"{self.host}:{self.raft_port}"

    @property
    def data_dir(self) -> Path:
        return self.root / self.node_id

    @property
    def log_path(self) -> Path:
        return self.root / f"{self.node_id}.log"

    @property
    def pid_path(self) -> Path:
        return self.root / f"{self.node_id}.pid"


def plan(*, nodes: int, base_port: int, data_dir: Path,
         hosts: Sequence[str] | None = None) -> list[NodeSpec]:
    """`hosts`: node i's address is hosts[i - 1] (default: every node on loopback)."""
    if not 1 <= nodes <= nodes_max:
        raise LocalClusterError(
            Refusal.INVALID_ARGUMENT, f"--nodes must be 1..{nodes_max}, not {nodes}"
        )
    top_port = base_port + ports_per_node * nodes - 1
    if base_port < 1024 or top_port > 65535:
        raise LocalClusterError(
            Refusal.INVALID_ARGUMENT,
            f"ports {base_port}..{top_port} are outside 1024..65535 "
            f"({nodes} nodes take {ports_per_node * nodes} ports from --base-port)",
        )
    hosts = list(hosts) if hosts is not None else [host] * nodes
    if len(hosts) != nodes:
        raise LocalClusterError(
            Refusal.INVALID_ARGUMENT, f"{len(hosts)} hosts for {nodes} nodes")
    root = data_dir.resolve()
    raft = [f"{hosts[i]}:{base_port + ports_per_node * i + 1}" for i in range(nodes)]
    return [
        NodeSpec(index=i, root=root, base_port=base_port, peers=(*raft[: i - 1], *raft[i:]),
                 host=hosts[i - 1])
        for i in range(1, nodes + 1)
    ]


def node_command(spec: NodeSpec, *, secret_file: Path | None, python: str,
                 prefix: Sequence[str] = (), tls: bool = False) -> list[str]:
    """`secret_file` None: the cluster directory's own (see `ensure_secret`). `prefix` goes
    before the python (e.g. `ip netns exec NS`, which execs it: the pid stays the node's).
    `tls`: the node serves TLS with its certificate under DIR/tls (node/cli/certs.py)."""
    command = [*prefix, python, "-m", "raftlog.node.cli", "node", "--data", str(spec.data_dir)]
    command += ["--grpc", spec.grpc_address, "--raft", spec.raft_address]
    command += ["--peer", spec.peer_address, "--node-id", spec.node_id]
    if spec.peers:
        command += ["--peers", ",".join(spec.peers)]
    command += ["--secret-file", str((secret_file or spec.secret_path).resolve())]
    if tls:
        paths = paths_of(spec.root, spec.node_id)
        command += ["--tls-cert", str(paths.cert), "--tls-key", str(paths.key),
                    "--tls-ca", str(paths.ca)]
    return command


def ensure_secret(root: Path, secret_file: Path | None) -> Path:
    """The secret file the cluster's nodes use: `secret_file` when given (checked), else
    DIR/cluster.secret, created with a new secret (mode 0600) the first time."""
    path = secret_file or root / SECRET_FILE_NAME
    try:
        if secret_file is not None:
            read_secret_file(path)
        else:
            ensure_secret_file(path)
    except (OSError, WeakSecret) as exc:
        raise LocalClusterError(Refusal.INVALID_ARGUMENT, f"cluster secret {path}: {exc}"
                                ) from None
    return path
