"""The operations a front-end gets, built for a node on its own or for a cluster member."""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.base.clock import Clock
from raftlog.node.cluster.coordinator import ClusterNode
from raftlog.node.cluster.placement import Placement
from raftlog.node.consumers.manager import ConsumerManager
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.ops.audit_export import AuditExport
from raftlog.node.ops.consumer_state import ConsumerStateOps
from raftlog.node.ops.consumers import ConsumerOps
from raftlog.node.ops.membership import Membership
from raftlog.node.ops.metadata import LocalConsumerMetadata, LocalStreamMetadata
from raftlog.node.ops.partitions import TopicOps
from raftlog.node.ops.raft_first import RaftMetadata
from raftlog.node.ops.route import ClusterRoute, LocalRoute
from raftlog.node.ops.schedule import ScheduleOps
from raftlog.node.ops.status import ClusterViews
from raftlog.node.ops.streams import StreamOps
from raftlog.node.ops.transactions import TransactionOps
from raftlog.node.transport.forwarding import Forwarder
from raftlog.node.transport.peer import PeerClient
from raftlog.node.transport.subscriptions import StreamSubscriptions


@dataclass(frozen=True)
class Operations:
    streams: StreamOps
    consumers: ConsumerOps
    topics: TopicOps  # N partition streams under one name (docs/partitions.md)
    transactions: TransactionOps  # two-phase publishes (docs/transactions.md)


@dataclass(frozen=True)
class ClusterOperations(Operations):
    membership: Membership
    views: ClusterViews
    audit: AuditExport
    consumer_state: ConsumerStateOps


def standalone(engine: StreamEngine, manager: ConsumerManager, *, clock: Clock) -> Operations:
    """A node on its own: every call is served here, metadata changes the engine directly."""
    streams = StreamOps(engine, metadata=LocalStreamMetadata(engine), where=LocalRoute())
    streams.schedule = ScheduleOps(streams, engine=engine, where=LocalRoute(), clock=clock)
    consumers = local_consumers(manager, engine=engine)
    topics = TopicOps(streams, consumers, where=LocalRoute(), consumer_state=None, clock=clock)
    return Operations(streams=streams, consumers=consumers, topics=topics,
                      transactions=TransactionOps(streams, topics, engine=engine, clock=clock))


def local_consumers(manager: ConsumerManager, *, engine: StreamEngine | None = None
                    ) -> ConsumerOps:
    """Consumer operations of a node on its own (with `engine`, streams' max_subscriptions
    are enforced)."""
    return ConsumerOps(manager, metadata=LocalConsumerMetadata(manager), where=LocalRoute(),
                       subscriptions=None if engine is None else stream_subscriptions(engine))


def stream_subscriptions(engine: StreamEngine) -> StreamSubscriptions:
    """Open subscriptions per stream against the max_subscriptions in the stream's config, as
    this node holds it (on the primary, the one it serves)."""
    def limit_of(name: str) -> int:
        stream = engine.streams.get(name)
        return int(stream.config.max_subscriptions) if stream is not None else 0
    return StreamSubscriptions(limit_of)


def clustered(*, engine: StreamEngine, manager: ConsumerManager, cluster: ClusterNode,
              forwarder: Forwarder, placement: Placement, peers: PeerClient,
              audit: AuditExport, clock: Clock) -> ClusterOperations:
    """A cluster member: calls go to the node that serves them, metadata through Raft first."""
    metadata = RaftMetadata(engine=engine, manager=manager, cluster=cluster, forwarder=forwarder)
    where = ClusterRoute(cluster, forwarder)
    streams = StreamOps(engine, metadata=metadata, where=where)
    streams.schedule = ScheduleOps(streams, engine=engine, where=where, clock=clock)
    consumers = ConsumerOps(manager, metadata=metadata, where=where,
                            subscriptions=stream_subscriptions(engine))
    consumer_state = ConsumerStateOps(engine=engine, manager=manager, cluster=cluster,
                                      metadata=metadata, where=where)
    topics = TopicOps(streams, consumers, where=where, consumer_state=consumer_state,
                      clock=clock)
    return ClusterOperations(
        streams=streams, consumers=consumers, topics=topics,
        transactions=TransactionOps(streams, topics, engine=engine, clock=clock),
        membership=Membership(cluster=cluster, placement=placement, peers=peers, where=where),
        views=ClusterViews(cluster, metadata), audit=audit,
        consumer_state=consumer_state)
