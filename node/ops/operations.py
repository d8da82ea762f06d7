"""The operations a front-end gets, built for a node on its own or for a cluster member."""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.node.cluster.coordinator import ClusterNode
from raftlog.node.cluster.placement import Placement
from raftlog.node.consumers.manager import ConsumerManager
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.ops.consumers import ConsumerOps
from raftlog.node.ops.membership import Membership
from raftlog.node.ops.metadata import LocalConsumerMetadata, LocalStreamMetadata
from raftlog.node.ops.raft_first import RaftMetadata
from raftlog.node.ops.route import ClusterRoute, LocalRoute
from raftlog.node.ops.status import ClusterViews
from raftlog.node.ops.streams import StreamOps
from raftlog.node.transport.forwarding import Forwarder
from raftlog.node.transport.peer import PeerClient


@dataclass(frozen=True)
class Operations:
    streams: StreamOps
    consumers: ConsumerOps


@dataclass(frozen=True)
class ClusterOperations(Operations):
    membership: Membership
    views: ClusterViews


def standalone(engine: StreamEngine, manager: ConsumerManager) -> Operations:
    """A node on its own: every call is served here, metadata changes the engine directly."""
    return Operations(streams=StreamOps(engine, metadata=LocalStreamMetadata(engine),
                                        where=LocalRoute()),
                      consumers=local_consumers(manager))


def local_consumers(manager: ConsumerManager) -> ConsumerOps:
    """Consumer operations of a node on its own."""
    return ConsumerOps(manager, metadata=LocalConsumerMetadata(manager), where=LocalRoute())


def clustered(*, engine: StreamEngine, manager: ConsumerManager, cluster: ClusterNode,
              forwarder: Forwarder, placement: Placement, peers: PeerClient
              ) -> ClusterOperations:
    """A cluster member: calls go to the node that serves them, metadata through Raft first."""
    metadata = RaftMetadata(engine=engine, manager=manager, cluster=cluster, forwarder=forwarder)
    where = ClusterRoute(cluster, forwarder)
    return ClusterOperations(
        streams=StreamOps(engine, metadata=metadata, where=where),
        consumers=ConsumerOps(manager, metadata=metadata, where=where),
        membership=Membership(cluster=cluster, placement=placement, peers=peers, where=where),
        views=ClusterViews(cluster, metadata))
