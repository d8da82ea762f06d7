"""`LocalCluster`: N real `raftlog node` processes in Raft cluster mode for multi-process runs,
built on raftlog.node.cli.localcluster (same layout, ports, pid files and pid-checked stopping).

Ports come from a probed free range below the kernel's ephemeral range, so they do not collide
with the port-0 binds other fixtures use. Nodes are numbered from 1 like their ids (`n1`...).
Cleanup (`stop_all`) stops by pid only the processes this cluster started, and is safe to call
any number of times.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from raftlog.chaos import workload as wl
from raftlog.chaos.nodeproc import wait_until as _wait_until
from raftlog.internal import replication_pb2_grpc
from raftlog.node.api.cluster import ADMIN_METHODS, admin_metadata
from raftlog.node.cli import certs, localcluster
from raftlog.node.cli.localcluster import LocalClusterError, LocalNode, NodeSpec, Refusal
from raftlog.node.transport.credentials import PEER_TOKEN_HEADER, Credential, read_secret_file
from raftlog.v1 import cluster_pb2, cluster_pb2_grpc, consumers_pb2_grpc, streams_pb2_grpc

ready_timeout_s = 60.0
serving_timeout_s = 30.0
stop_timeout_s = 15.0
status_call_timeout_s = 1.0
settle_poll_s = 0.2  # between two looks at every member's Raft indexes (wait_raft_settled)
# Base ports are drawn from [low, high): below Linux's default ephemeral range (32768-60999).
base_port_low = 10_000
base_port_high = 32_000
base_port_attempts_max = 50


def free_base_port(port_count: int, *, rng: random.Random | None = None) -> int:
    """An even base port with `port_count` consecutive free loopback ports."""
    rng = rng or random.Random()
    for _ in range(base_port_attempts_max):
        base = rng.randrange(base_port_low, base_port_high - port_count, 2)
        if not any(localcluster.port_in_use(base + k) for k in range(port_count)):
            return base
    raise RuntimeError(f"no {port_count} free consecutive ports in {base_port_attempts_max} tries")


class LocalCluster:
    """`with LocalCluster(tmp_path / "c", nodes=3).start_all() as cluster: ...`"""

    def __init__(self, root: Path, *, nodes: int = 3, secret_file: Path | None = None,
                 prepare: Callable[[list[NodeSpec]], None] | None = None,
                 node_args: Callable[[NodeSpec], Sequence[str]] | None = None,
                 spares: int = 0, host_of: Callable[[int], str] | None = None,
                 command_prefix: Callable[[NodeSpec], Sequence[str]] | None = None,
                 tls: bool = False) -> None:
        """`prepare(specs)` runs once the nodes' addresses are chosen, before any starts (the
        chaos harness makes its proxies there); `node_args(spec)` are extra `raftlog node`
        flags for that node, on every start. `spares` more nodes are planned (indexes after
        the members, peers the members) but not started: `start(i)` starts one, waiting to
        be joined (JoinNode). `host_of(i)` is node i's address (default loopback) and
        `command_prefix(spec)` goes before its command (the chaos harness's hosts mode:
        `ip netns exec NS`). `tls`: the nodes serve TLS with certificates from a CA under
        ROOT/tls, as `raftlog cluster up --tls` makes them, and `channel`/`replication`
        connect with TLS."""
        self.root = root
        self.tls = tls
        self.size = nodes
        self.spares = spares
        self.secret_file = secret_file
        self._prepare = prepare
        self._node_args = node_args
        self._host_of = host_of
        self._command_prefix = command_prefix
        self.specs: dict[int, NodeSpec] = {}  # the members the cluster started with
        self.spare_specs: dict[int, NodeSpec] = {}
        self.nodes: dict[int, LocalNode] = {}  # every node started, by index
        self.running: set[int] = set()
        self._channels: dict[int, grpc.Channel] = {}
        self._peer_channels: dict[int, grpc.Channel] = {}

    # -- lifecycle ------------------------------------------------------------------------

    def start_all(
        self, *, timeout_s: float = ready_timeout_s, wait_raft: bool = True
    ) -> LocalCluster:
        """Starts every node and waits until a Raft leader sees all of them (or, without
        `wait_raft`, until each serves gRPC). Stops them all if that fails."""
        self._up()
        try:
            nodes = [self.nodes[i] for i in sorted(self.nodes)]
            if wait_raft:
                localcluster.wait_ready(nodes, timeout_s)
            else:
                localcluster.wait_serving(nodes, timeout_s)
        except BaseException:
            for i in sorted(self.nodes):
                print(f"--- n{i} log tail ---\n{self.log_tail(i)}")
            self.stop_all()
            raise
        return self

    def _up(self) -> None:
        for _ in range(base_port_attempts_max):
            members, spares = self._plan(free_base_port(
                localcluster.ports_per_node * (self.size + self.spares)))
            if self._prepare is not None:
                self._prepare([*members, *spares])
            try:
                started = localcluster.start_specs(
                    members, secret_file=self.secret_file, extra_args=self._node_args,
                    prefix=self._command_prefix, tls=self.tls)
            except LocalClusterError as exc:
                if exc.reason is Refusal.PORT_IN_USE:  # taken since the probe: try another
                    continue
                raise
            self.spare_specs = {spec.index: spec for spec in spares}
            for node in started:
                self.specs[node.spec.index] = node.spec
                self.nodes[node.spec.index] = node
                self.running.add(node.spec.index)
            return
        raise RuntimeError(f"could not find free ports in {base_port_attempts_max} tries")

    def _plan(self, base_port: int) -> tuple[list[NodeSpec], list[NodeSpec]]:
        """The members (each one's peers the other members) and the spares (peers: the
        members)."""
        count = self.size + self.spares
        hosts = None if self._host_of is None else [self._host_of(i) for i in range(1, count + 1)]
        planned = localcluster.plan(nodes=count, base_port=base_port, data_dir=self.root,
                                    hosts=hosts)
        members, spares = planned[:self.size], planned[self.size:]
        raft = [spec.raft_address for spec in members]
        return ([dataclasses.replace(spec, peers=tuple(a for a in raft if a != spec.raft_address))
                 for spec in members],
                [dataclasses.replace(spec, peers=tuple(raft)) for spec in spares])

    def spec(self, i: int) -> NodeSpec:
        """A member's or a spare's."""
        return self.specs[i] if i in self.specs else self.spare_specs[i]

    def start(self, i: int, *, timeout_s: float = serving_timeout_s) -> LocalNode:
        """Starts node i again (same id, ports and data) and waits until it serves gRPC."""
        spec = self.spec(i)
        node = localcluster.start_node(
            spec, secret_file=self.secret_file, python=self._python(i),
            extra_args=self._node_args(spec) if self._node_args else (),
            prefix=self._prefix(spec), tls=self.tls,
        )
        self.nodes[i] = node
        self.running.add(i)
        localcluster.wait_serving([node], timeout_s)
        return node

    def stop(self, i: int, *, timeout_s: float = stop_timeout_s) -> localcluster.StopOutcome:
        """SIGTERM (the node drains), then SIGKILL after `timeout_s`."""
        return self._stop(i, timeout_s=timeout_s, force=False)

    def kill9(self, i: int) -> localcluster.StopOutcome:
        return self._stop(i, timeout_s=stop_timeout_s, force=True)

    def restart(self, i: int, *, timeout_s: float = serving_timeout_s) -> LocalNode:
        self.stop(i)
        return self.start(i, timeout_s=timeout_s)

    def _stop(self, i: int, *, timeout_s: float, force: bool) -> localcluster.StopOutcome:
        self._close_channel(i)
        self.running.discard(i)
        [result] = localcluster.stop([self.nodes[i].record()], timeout_s=timeout_s, force=force)
        if result.outcome is localcluster.StopOutcome.SURVIVED:
            raise RuntimeError(f"{self.nodes[i].node_id} (pid {result.pid}) survived SIGKILL")
        return result.outcome

    def stop_all(self) -> None:
        for i in list(self._channels):
            self._close_channel(i)
        # Every node ever started, not only `running`: stopping is pid-checked and a node that
        # is already gone costs one /proc read.
        records = [self.nodes[i].record() for i in sorted(self.nodes)]
        self.running.clear()
        if records:
            localcluster.stop(records, timeout_s=stop_timeout_s)

    def _prefix(self, spec: NodeSpec) -> list[str]:
        return list(self._command_prefix(spec)) if self._command_prefix else []

    def _python(self, i: int) -> str:
        """The python node i ran last (its command after the prefix)."""
        if i not in self.nodes:
            return sys.executable
        return self.nodes[i].command[len(self._prefix(self.nodes[i].spec))]

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()

    # -- addressing -----------------------------------------------------------------------

    def node(self, i: int) -> LocalNode:
        return self.nodes[i]

    def address(self, i: int) -> str:
        return self.spec(i).grpc_address

    def peer_address(self, i: int) -> str:
        return self.spec(i).peer_address

    @property
    def secret_path(self) -> Path:
        return self.secret_file or next(iter(self.specs.values())).secret_path

    def credential(self) -> Credential:
        return Credential(read_secret_file(self.secret_path))

    def peer_access(self) -> wl.PeerAccess:
        """What chaos/workload.py's collectors need to read every node's local copy."""
        return wl.PeerAccess(credential=self.credential(), peer_of={
            spec.grpc_address: spec.peer_address for spec in self.specs.values()})

    def admin(self, method: str) -> tuple[tuple[str, str], ...]:
        """Metadata for an admin call of the Cluster service (e.g. "JoinNode")."""
        return admin_metadata(self.credential(), method)

    def index_of(self, node_id: str) -> int:
        for i, spec in [*self.specs.items(), *self.spare_specs.items()]:
            if spec.node_id == node_id:
                return i
        raise KeyError(f"no node {node_id!r} in this cluster")

    def channel(self, i: int) -> grpc.Channel:
        """A sync channel to node i, kept until the node is stopped. Admin calls of the
        Cluster service on it carry the cluster credential (`raw_channel` for none)."""
        if i not in self._channels:
            raw = (localcluster.channel_to(self.nodes[i]) if i in self.nodes
                   else grpc.insecure_channel(self.address(i)))
            self._channels[i] = grpc.intercept_channel(raw, _AdminTokens(self.credential()))
        return self._channels[i]

    def _close_channel(self, i: int) -> None:
        for channels in (self._channels, self._peer_channels):
            channel = channels.pop(i, None)
            if channel is not None:
                channel.close()

    def replication(self, i: int) -> replication_pb2_grpc.ReplicationStub:
        """Node i's peer listener (ReadLocal, GetReplicaState...), every call signed."""
        if i not in self._peer_channels:
            raw = (grpc.secure_channel(self.peer_address(i), self.tls_credentials())
                   if self.tls else grpc.insecure_channel(self.peer_address(i)))
            self._peer_channels[i] = grpc.intercept_channel(raw, _PeerTokens(self.credential()))
        return replication_pb2_grpc.ReplicationStub(self._peer_channels[i])

    def tls_credentials(self, holder: str = certs.CLIENT_NAME) -> grpc.ChannelCredentials:
        """TLS credentials trusting the cluster's CA and presenting `holder`'s certificate
        (a node id, or the client's)."""
        paths = certs.paths_of(self.root.resolve(), holder)
        return grpc.ssl_channel_credentials(root_certificates=paths.ca.read_bytes(),
                                            private_key=paths.key.read_bytes(),
                                            certificate_chain=paths.cert.read_bytes())

    def streams(self, i: int) -> streams_pb2_grpc.StreamsStub:
        return streams_pb2_grpc.StreamsStub(self.channel(i))

    def consumers(self, i: int) -> consumers_pb2_grpc.ConsumersStub:
        return consumers_pb2_grpc.ConsumersStub(self.channel(i))

    def cluster(self, i: int) -> cluster_pb2_grpc.ClusterStub:
        return cluster_pb2_grpc.ClusterStub(self.channel(i))

    def log_tail(self, i: int) -> str:
        return self.nodes[i].log_tail()

    # -- Raft -----------------------------------------------------------------------------

    def status(
        self, i: int, *, timeout_s: float = status_call_timeout_s
    ) -> cluster_pb2.ClusterStatus:
        return self.cluster(i).GetClusterStatus(
            cluster_pb2.GetClusterStatusRequest(), timeout=timeout_s
        )

    def raft_terms(self, *, timeout_s: float = 5.0) -> list[int]:
        """The Raft term each running node that answers reports (its rise counts elections)."""
        terms = []
        for i in sorted(self.running):
            with contextlib.suppress(grpc.RpcError):
                terms.append(int(self.status(i, timeout_s=timeout_s).raft_term))
        return terms

    def raft_indexes(self) -> RaftIndexes:
        """One look at every running node: the members its metadata lists, and the (commit,
        applied) Raft index of each node that answers."""
        members: set[str] = set()
        indexes: dict[str, tuple[int, int]] = {}
        for i in sorted(self.running):
            with contextlib.suppress(grpc.RpcError):
                status = self.status(i)
                members |= {node.node_id for node in status.nodes}
                indexes[status.answered_by] = (int(status.commit_index),
                                               int(status.applied_index))
        return RaftIndexes(members=tuple(sorted(members)), indexes=indexes)

    def wait_raft_settled(self, timeout_s: float) -> RaftSettled:
        """Waits until the metadata is quiescent: every member answers, each has applied
        everything it knows committed, all at the same index, and two looks `settle_poll_s`
        apart see the same (no entry in flight). Returns what the last look saw; `settled` is
        False when `timeout_s` passed first (the caller decides what that means)."""
        started = time.monotonic()
        previous: RaftIndexes | None = None
        while True:
            seen = self.raft_indexes()
            if seen.agreed() and seen == previous:
                return RaftSettled(seen, settled=True, waited_s=time.monotonic() - started)
            if time.monotonic() - started >= timeout_s:
                return RaftSettled(seen, settled=False, waited_s=time.monotonic() - started)
            previous = seen
            time.sleep(settle_poll_s)

    def leader_id(self, *, among: Iterable[int] | None = None) -> str | None:
        """The Raft leader as the first running node that knows one sees it, or None."""
        for i in sorted(self.running if among is None else among):
            with contextlib.suppress(grpc.RpcError):
                leader = self.status(i).raft_leader
                if leader:
                    return leader
        return None

    def wait_for_leader(self, timeout_s: float, *, exclude: Iterable[str] = ()) -> str:
        """Waits until the running nodes report a leader that is not in `exclude` (node ids)
        and that the leader itself, if running, agrees; returns its id."""
        excluded = set(exclude)
        found: list[str] = []

        def agreed() -> bool:
            leader = self.leader_id()
            if leader is None or leader in excluded:
                return False
            i = self.index_of(leader)
            if i in self.running and self.leader_id(among=[i]) != leader:
                return False
            found[:] = [leader]
            return True

        self.wait_until(agreed, timeout_s, what=f"a Raft leader not in {sorted(excluded)}")
        return found[0]

    @staticmethod
    def wait_until(
        predicate: Callable[[], bool], timeout_s: float, *, what: str = "condition"
    ) -> None:
        _wait_until(predicate, timeout_s, what=what)


@dataclasses.dataclass(frozen=True)
class RaftIndexes:
    """What `LocalCluster.raft_indexes` saw: `members` (node ids the answering nodes' metadata
    lists) and `indexes` (node id -> (commit index, applied index), answering nodes only)."""

    members: tuple[str, ...]
    indexes: dict[str, tuple[int, int]]

    def agreed(self) -> bool:
        """Every member answered, and every one has applied exactly what all have committed."""
        if not self.members or set(self.indexes) != set(self.members):
            return False
        return len({index for pair in self.indexes.values() for index in pair}) == 1

    def applied(self) -> dict[str, int]:
        return {node: applied for node, (_commit, applied) in sorted(self.indexes.items())}


@dataclasses.dataclass(frozen=True)
class RaftSettled:
    """The outcome of `LocalCluster.wait_raft_settled`."""

    seen: RaftIndexes
    settled: bool
    waited_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"settled": self.settled, "waited_s": round(self.waited_s, 3),
                "members": list(self.seen.members), "applied_index": self.seen.applied(),
                "commit_index": {node: commit for node, (commit, _applied)
                                 in sorted(self.seen.indexes.items())}}


class _AdminTokens(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Signs the Cluster service's admin calls (the ones that change the cluster)."""

    def __init__(self, credential: Credential) -> None:
        self._credential = credential

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        method = str(details.method)
        if method.startswith(_CLUSTER_PREFIX) and method[len(_CLUSTER_PREFIX):] in ADMIN_METHODS:
            metadata = [*(details.metadata or ()),
                        *admin_metadata(self._credential, method[len(_CLUSTER_PREFIX):])]
            details = _CallDetails(details.method, details.timeout, metadata,
                                   details.credentials, details.wait_for_ready,
                                   details.compression)
        return continuation(details, request)


class _PeerTokens(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Signs every call with a peer token, as a member would."""

    def __init__(self, credential: Credential) -> None:
        self._credential = credential

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        token = self._credential.token(principal="test", method=str(details.method))
        metadata = [*(details.metadata or ()), (PEER_TOKEN_HEADER, token)]
        return continuation(_CallDetails(details.method, details.timeout, metadata,
                                         details.credentials, details.wait_for_ready,
                                         details.compression), request)


class _CallDetails(collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready",
                         "compression")), grpc.ClientCallDetails):
    pass


_CLUSTER_PREFIX = "/raftlog.v1.Cluster/"


@contextlib.contextmanager
def local_cluster(root: Path, *, nodes: int = 3) -> Iterator[LocalCluster]:
    """A started cluster, stopped on the way out whatever happened."""
    cluster = LocalCluster(root, nodes=nodes)
    try:
        yield cluster.start_all()
    finally:
        cluster.stop_all()
