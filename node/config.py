"""A node's configuration: what `raftlog node` takes on its command line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class NodeConfig:
    data_dir: Path
    # host:port the gRPC server listens on.
    grpc_address: str = "127.0.0.1:7400"
    # Stable node name; defaults to the gRPC address.
    node_id: str = ""
    # host:port of this node's Raft endpoint; empty = single-node mode without Raft.
    raft_address: str = ""
    # host:port of the peer listener (node-to-node services); cluster mode only.
    peer_address: str = ""
    # Raft addresses of the other members at bootstrap.
    peers: tuple[str, ...] = field(default_factory=tuple)
    # The cluster credential; required in cluster mode (node/transport/credentials.py).
    cluster_secret: str = ""
    log_level: str = "INFO"
    # host:port of the Prometheus endpoint (/metrics, docs/metrics.md); empty: none.
    metrics_address: str = ""
    # "text" (the default) or "json": one JSON object per log line (docs/logging.md).
    log_format: str = "text"
    # The window of the repeated-line limiter (node/log_limit.py); None:
    # limits.log_repeat_window_s.
    log_repeat_window_s: float | None = None
    # Clients with calls open at once on the client port, and Subscribe calls open at once
    # (docs/quotas.md); None: limits.client_connections_max_default, limits.subscriptions_max.
    connections_max: int | None = None
    subscriptions_max: int | None = None
    # A replica on a member silent for longer than this is re-created on another member
    # (None: limits.replace_dead_after_s_default).
    replace_dead_after_s: float | None = None
    # Where to connect instead, by the address a member is known by (its Raft, peer or
    # client address): the chaos harness puts a proxy on every link this way. Empty: dial the
    # addresses themselves.
    dial: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    # TLS (node/transport/tls.py, docs/tls.md): the node's certificate and key and the CA
    # every node's certificate chains to; all three or none (None: plaintext ports).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    # Whether the client port requires callers' certificates: "none" or "require".
    tls_client_auth: str = "none"

    def dial_address(self, address: str) -> str:
        """The address to connect to for a member known by `address`."""
        return dict(self.dial).get(address, address)

    @property
    def name(self) -> str:
        return self.node_id or self.grpc_address


def default_peer_address(raft_address: str) -> str:
    """The peer listener a node uses when none is given: the Raft host, the Raft port + 1."""
    host, _, port = raft_address.rpartition(":")
    return f"{host}:{int(port) + 1}"
