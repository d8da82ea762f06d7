"""One simulated node: the real node components of node/server.py, wired in-process over the
simulated network, metadata group and disk, and the client-facing publish and read paths.

Real product code, as node/server.py builds it: `StreamEngine` (follow_raft) over a
`MemoryMessageStore` (as `SimStore`), `ClusterNode` (reconciling, registration, troubles),
`ReplicationManager` with its `PeerLink`s and `StreamReplicator`s (commit rule, lease, fencing),
`ReplicationService` (the replica side: checks, group commit, fence notices, Survey, Ping),
`LivenessMonitor`, `FailoverCoordinator`, `ConsumerManager` over `RaftConsumerStore`.

Adapted in the simulation (see the report's seams):
- `SimClusterNode.queue_all` queues streams in sorted order (the real one iterates a set of
  names, whose order depends on PYTHONHASHSEED);
- `SimLinkSet` gives every `PeerLink` an insertion-ordered `waiting` collection (the real one is
  a set of replicators, iterated in address order, which differs from run to run);
- `SimPeerClient` stands in for `PeerClient` (Ping and Survey through the simulated network);
- the client path (`serve_publish`, `serve_read`, `serve_fetch`, `serve_ack`) mirrors
  node/ops/streams.py and consumers.py (route to the primary with
  `ClusterNode.primary_address`, forward with a hop count, then the local engine or
  ConsumerManager; consumer NOT_FOUNDs confirmed by the real `ExistenceCheck`) without the
  gRPC servicers and the Forwarder.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.chaos.sim.clock import SimClock, SimLoopHeartbeat
from raftlog.chaos.sim.loop import VirtualTimeLoop, owner_context
from raftlog.chaos.sim.network import SimNetwork
from raftlog.chaos.sim.raft import SimMetaGroup, SimRaft, raft_address
from raftlog.chaos.sim.store import LyingCommitter, SimDisk, SimStore
from raftlog.internal import replication_pb2
from raftlog.node.cluster.coordinator import ClusterNode
from raftlog.node.cluster.existence import ExistenceCheck
from raftlog.node.cluster.failover import FailoverCoordinator
from raftlog.node.cluster.liveness import LivenessMonitor
from raftlog.node.consumers.manager import ConsumerManager
from raftlog.node.consumers.raft_store import RaftConsumerStore
from raftlog.node.engine.storage import GroupCommitter
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.replication.links import LinkTransport
from raftlog.node.replication.primary import LinkSet, PeerLink, ReplicationManager
from raftlog.node.replication.service import ReplicationService
from raftlog.node.transport.peer import PeerClient
from raftlog.v1 import streams_pb2

T = TypeVar("T")
peer_call_timeout_s = 1.0  # a forwarded client call waits this long for the primary


def grpc_address(node: str) -> str:
    return f"sim-{node}:7001"


def node_of_address(address: str) -> str:
    """The node id of a `grpc_address`."""
    return address.removeprefix("sim-").split(":", 1)[0]


@dataclass(frozen=True)
class SimIdentity:
    """What ClusterNode reads of a node's configuration (`NodeIdentity`)."""

    name: str

    @property
    def grpc_address(self) -> str:
        return grpc_address(self.name)

    @property
    def raft_address(self) -> str:
        return raft_address(self.name)

    @property
    def peer_address(self) -> str:
        return f"sim-{self.name}:7002"


@dataclass(frozen=True)
class Served:
    """A publish a primary acknowledged, or a message it read: where and at which epoch."""

    node: str
    epoch: int
    seq: int
    duplicate: bool = False
    msg_id: str = ""
    payload: bytes = b""


class InsertionOrdered(Generic[T]):
    """The set operations `PeerLink.waiting` uses, in insertion order (`pop` takes the
    oldest)."""

    def __init__(self) -> None:
        self._items: dict[T, None] = {}

    def add(self, item: T) -> None:
        self._items[item] = None

    def discard(self, item: T) -> None:
        self._items.pop(item, None)

    def pop(self) -> T:
        item = next(iter(self._items))
        del self._items[item]
        return item

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._items))

    def __contains__(self, item: object) -> bool:
        return item in self._items


class SimLinkSet(LinkSet):
    """`LinkSet` whose links wake their waiting streams in a reproducible order."""

    def link(self, node_id: str) -> PeerLink:
        fresh = node_id not in self._links
        link = super().link(node_id)
        if fresh:
            link.waiting = cast(set[Any], InsertionOrdered())
        return link


class SimReplicationManager(ReplicationManager):
    def __init__(self, *, node_id: str, transport: LinkTransport, clock: SimClock) -> None:
        super().__init__(node_id=node_id, transport=transport, clock=clock)
        self.links = SimLinkSet(node_id=node_id, transport=transport, clock=clock)


class SimClusterNode(ClusterNode):
    def queue_all(self) -> None:
        """As ClusterNode.queue_all, in sorted order."""
        with self.group.read_state() as state:
            names: Iterable[str] = list(state.streams)
        for name in sorted({*names, *self.engine.streams}):
            self.queue(name)


class SimContext:
    """The servicer context the Survey handler gets: its abort ends the call with an error."""

    async def abort_with_status(self, status: Any) -> None:
        raise RaftlogError(Reason.INTERNAL, f"the peer aborted the call: {status.details}")


class SimPeerClient:
    """The two `PeerClient` calls liveness and failover make (Ping, Survey), through the
    simulated network to the peer's ReplicationService."""

    def __init__(self, *, node: str, network: SimNetwork,
                 service_of: Callable[[str], ReplicationService | None]) -> None:
        self.node_id = node
        self._network = network
        self._service_of = service_of

    def _service(self, node_id: str) -> ReplicationService:
        service = self._service_of(node_id)
        if service is None:
            raise RaftlogError(Reason.FORWARD_FAILED, f"{node_id} is down")
        return service

    async def ping(self, node_id: str, *, timeout_s: float) -> replication_pb2.PingReply:
        async def serve() -> replication_pb2.PingReply:
            return await self._service(node_id).Ping(
                replication_pb2.PingRequest(from_node=self.node_id), cast(Any, SimContext()))

        return await self._network.unary(self.node_id, node_id, serve, timeout_s=timeout_s,
                                         what="Ping")

    async def survey(self, node_id: str, items: list[replication_pb2.SurveyItem], *,
                     timeout_s: float) -> replication_pb2.SurveyReply:
        async def serve() -> replication_pb2.SurveyReply:
            reply: replication_pb2.SurveyReply = await self._service(node_id).Survey(
                replication_pb2.SurveyRequest(streams=items), cast(Any, SimContext()))
            return reply

        return await self._network.unary(self.node_id, node_id, serve, timeout_s=timeout_s,
                                         what="Survey")


class SimNode:
    """A node across its incarnations: its clock and disk persist, the rest is rebuilt by
    `boot` after every crash."""

    def __init__(self, *, node_id: str, loop: VirtualTimeLoop, network: SimNetwork,
                 raft: SimRaft, clock: SimClock, fsync_s: Callable[[], float],
                 lying_replica: bool = False) -> None:
        self.node_id = node_id
        self._loop = loop
        self._network = network
        self._raft = raft
        self.clock = clock
        self.disk = SimDisk()
        self._fsync_s = fsync_s
        self._lying_replica = lying_replica
        self.incarnation = 0
        self.up = False
        self.peers_of: Callable[[str], SimNode | None] = lambda node_id: None
        self._built: _Incarnation | None = None

    @property
    def owner(self) -> str:
        return f"{self.node_id}#{self.incarnation}"

    @property
    def parts(self) -> _Incarnation:
        if self._built is None or not self.up:
            raise RaftlogError(Reason.FORWARD_FAILED, f"{self.node_id} is down")
        return self._built

    def service(self) -> ReplicationService | None:
        return self._built.service if self._built is not None and self.up else None

    async def boot(self) -> None:
        """Starts a new incarnation from what the disk and the Raft journal hold; it answers
        peers once started, as node/server.py opens the peer listener last."""
        self.incarnation += 1
        context = owner_context(self.owner)
        built = _Incarnation.build(self)
        self._built = built
        await self._loop.create_task(built.start(), context=context)
        self.up = True
        self._network.attach(self.node_id, context=context, endpoint=built.service)

    async def crash(self, rng: random.Random, *, power_loss: bool = False) -> tuple[int, int]:
        """Kills the incarnation (and with `power_loss` its machine): (batches the disk lost,
        tasks that would not stop)."""
        built = self._built
        if built is None or not self.up:
            return 0, 0
        self.up = False
        self._network.detach(self.node_id)
        self._raft.crashed(self.node_id)
        lost = built.store.crash(rng, power_loss=power_loss)
        left = await self._loop.owners.cancel_owned(self.owner)
        return lost, left

    # ----------------------------------------------------------------- client calls

    async def serve_publish(self, request: streams_pb2.PublishRequest, *, hops: int) -> Served:
        """A Publish call that reached this node (node/ops/streams.py `publish`)."""
        async def local(parts: _Incarnation) -> Served:
            stream = parts.engine.get(request.stream)
            epoch = stream.record.epoch
            (outcome,) = await parts.engine.publish(request.stream, [request])
            if isinstance(outcome, RaftlogError):
                raise outcome
            return Served(node=self.node_id, epoch=epoch, seq=outcome.seq,
                          duplicate=outcome.duplicate)

        return await self._on_primary(
            request.stream, hops, "Publish", local,
            lambda node: node.serve_publish(request, hops=hops + 1))

    async def serve_read(self, stream_name: str, seq: int, *, hops: int) -> Served:
        """A GetMessage call that reached this node."""
        async def local(parts: _Incarnation) -> Served:
            stream = parts.engine.get(stream_name)
            message = stream.get_message(seq)
            return Served(node=self.node_id, epoch=stream.record.epoch, seq=seq,
                          msg_id=message.msg_id, payload=message.payload)

        return await self._on_primary(stream_name, hops, "GetMessage", local,
                                      lambda node: node.serve_read(stream_name, seq,
                                                                   hops=hops + 1))

    async def serve_fetch(self, stream: str, consumer: str, *, batch: int, wait_ms: int,
                          hops: int) -> list[Served]:
        """A consumer's Fetch call (node/ops/consumers.py `fetch`): the messages delivered."""
        async def local(parts: _Incarnation) -> list[Served]:
            epoch = parts.engine.get(stream).record.epoch
            messages = await self._confirmed(parts, stream, consumer, lambda: parts.consumers
                                             .fetch(stream, consumer, batch=batch,
                                                    max_wait_ms=wait_ms))
            return [Served(node=self.node_id, epoch=epoch, seq=m.seq, msg_id=m.msg_id,
                           payload=m.payload) for m in messages]

        return await self._on_primary(
            stream, hops, "Fetch", local,
            lambda node: node.serve_fetch(stream, consumer, batch=batch, wait_ms=wait_ms,
                                          hops=hops + 1))

    async def serve_ack(self, stream: str, consumer: str, seqs: list[int], *,
                        hops: int) -> list[int]:
        """A consumer's Ack call: the seqs acknowledged (durable on return)."""
        async def local(parts: _Incarnation) -> list[int]:
            settled = await self._confirmed(parts, stream, consumer,
                                            lambda: parts.consumers.ack(stream, consumer, seqs))
            return [seq for seq in seqs if seq not in settled.refused]

        return await self._on_primary(
            stream, hops, "Ack", local,
            lambda node: node.serve_ack(stream, consumer, seqs, hops=hops + 1))

    @staticmethod
    async def _confirmed(parts: _Incarnation, stream: str, consumer: str,
                         call: Callable[[], Awaitable[T]]) -> T:
        """`call()`; a NOT_FOUND it raises is confirmed with the metadata first (the real
        ExistenceCheck, which adopts a consumer created after the stream was attached)."""
        try:
            return await call()
        except RaftlogError as err:
            raise await ExistenceCheck(parts.cluster).confirm(
                err, stream=stream, consumer=consumer, timeout_s=peer_call_timeout_s) from None

    async def _on_primary(self, stream: str, hops: int, what: str,
                          local: Callable[[_Incarnation], Awaitable[T]],
                          remote: Callable[[SimNode], Awaitable[T]]) -> T:
        """`local` here when this node is the stream's primary, else `remote` on the primary
        (forwarded through the network, one hop more)."""
        parts = self.parts
        address = parts.cluster.primary_address(stream)
        if address is None:
            return await local(parts)
        if hops >= limits.forward_hops_max:
            raise RaftlogError(Reason.HOP_LIMIT, f"forwarded {hops} times", stream=stream)
        target = node_of_address(address)

        async def serve() -> T:
            node = self.peers_of(target)
            if node is None:
                raise RaftlogError(Reason.FORWARD_FAILED, f"no node {target}")
            return await remote(node)

        return await self._network.unary(self.node_id, target, serve,
                                         timeout_s=peer_call_timeout_s, what=what)


@dataclass
class _Incarnation:
    """The components of one incarnation, built as node/server.py builds them."""

    store: SimStore
    group: SimMetaGroup
    engine: StreamEngine
    consumers: ConsumerManager
    cluster: SimClusterNode
    replication: SimReplicationManager
    liveness: LivenessMonitor
    failover: FailoverCoordinator
    service: ReplicationService

    @classmethod
    def build(cls, node: SimNode) -> _Incarnation:
        clock = node.clock
        node_id = node.node_id
        store = SimStore(node.disk, fsync_s=node._fsync_s)
        group = node._raft.view(node_id, clock=clock)
        engine_ref: list[StreamEngine] = []

        def leading_epoch(name: str) -> int:
            stream = engine_ref[0].streams.get(name) if engine_ref else None
            return stream.record.epoch if stream is not None else 0

        consumer_store = RaftConsumerStore(group=group, clock=clock, epoch_of=leading_epoch)
        consumers = ConsumerManager(store=consumer_store, clock=clock)
        engine = StreamEngine(store=store, clock=clock, consumers=consumers, follow_raft=True)
        engine_ref.append(engine)
        cluster = SimClusterNode(config=SimIdentity(node_id), group=group, engine=engine,
                                 consumers=consumers, clock=clock, consumer_store=consumer_store)
        group.bind(on_applied=cluster.on_applied, on_leader_change=cluster.on_leader_change)
        peers = cast(PeerClient, SimPeerClient(
            node=node_id, network=node._network,
            service_of=lambda peer: _service_of(node.peers_of(peer))))
        replication = SimReplicationManager(node_id=node_id,
                                            transport=node._network.transport(node_id),
                                            clock=clock)
        cluster.replication = replication
        liveness = LivenessMonitor(node_id=node_id, members=cluster.member_ids, peers=peers,
                                   clock=clock, heartbeat=SimLoopHeartbeat())
        cluster.liveness = liveness
        failover = FailoverCoordinator(node_id=node_id, group=group, liveness=liveness,
                                       peers=peers, clock=clock,
                                       own_troubles=lambda: cluster.troubles.values())
        committer: Any = LyingCommitter(store) if node._lying_replica else store
        service = ReplicationService(node_id=node_id, engine=engine,
                                     committer=cast(GroupCommitter, committer),
                                     ensure_replica=cluster.ensure_replica,
                                     health=cluster.health_report)
        return cls(store=store, group=group, engine=engine, consumers=consumers, cluster=cluster,
                   replication=replication, liveness=liveness, failover=failover,
                   service=service)

    async def start(self) -> None:
        """node/server.py `start`, without the gRPC servers."""
        self.engine.load()
        self.engine.start()
        await self.cluster.start()
        self.replication.start()
        self.liveness.start()
        self.failover.start()


def _service_of(node: SimNode | None) -> ReplicationService | None:
    return None if node is None else node.service()

