"""The node process: opens storage, builds the engines and serves gRPC until SIGTERM.

Threads: the main thread runs the asyncio loop (gRPC aio server, engines); one group-commit
thread fsyncs. SIGTERM/SIGINT stop accepting calls, let running calls finish for up to
limits.drain_grace_s, fsync, and close RocksDB.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from raftlog.base import limits
from raftlog.base.clock import Clock, SystemClock
from raftlog.base.errors import InvariantViolation, RaftlogError, Reason
from raftlog.internal import replication_pb2_grpc
from raftlog.node import log_limit
from raftlog.node.api.cluster import ClusterService
from raftlog.node.api.consumers import ConsumersService
from raftlog.node.api.streams import StreamsService
from raftlog.node.cluster.coordinator import ClusterNode
from raftlog.node.cluster.failover import FailoverCoordinator
from raftlog.node.cluster.liveness import LivenessMonitor
from raftlog.node.cluster.placement import Placement
from raftlog.node.config import NodeConfig
from raftlog.node.consumers.manager import ConsumerManager
from raftlog.node.consumers.raft_store import RaftConsumerStore
from raftlog.node.consumers.rocks_store import RocksConsumerStore
from raftlog.node.consumers.store import ConsumerStore
from raftlog.node.engine.rocks_store import RocksMessageStore
from raftlog.node.engine.storage import CF_RAFT_LOG, CF_RAFT_META, GroupCommitter, Storage
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.ops import operations
from raftlog.node.replication.links import GrpcLinkTransport
from raftlog.node.replication.primary import ReplicationManager
from raftlog.node.replication.replica import ROLE_PRIMARY
from raftlog.node.replication.service import ReplicationService
from raftlog.node.transport.channels import STREAM_RELAY_OPTIONS, ChannelPool
from raftlog.node.transport.credentials import Credential
from raftlog.node.transport.forwarding import Forwarder
from raftlog.node.transport.malformed import MalformedRequestInterceptor
from raftlog.node.transport.peer import PeerAuthInterceptor, PeerClient, peer_server_options
from raftlog.node.transport.subscriptions import SubscriptionLimitInterceptor
from raftlog.raft.group import RaftGroup
from raftlog.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    consumers_pb2,
    consumers_pb2_grpc,
    streams_pb2,
    streams_pb2_grpc,
)

log = logging.getLogger(__name__)

FREEZE_ENV = "RAFTLOG_DEBUG_FREEZE_S"
SERVICE_NAMES = (
    streams_pb2.DESCRIPTOR.services_by_name["Streams"].full_name,
    consumers_pb2.DESCRIPTOR.services_by_name["Consumers"].full_name,
)
CLUSTER_SERVICE_NAME = cluster_pb2.DESCRIPTOR.services_by_name["Cluster"].full_name


class Node:
    """Everything one node owns; `start` and `stop` run on the event loop."""

    def __init__(self, config: NodeConfig, *, clock: Clock | None = None) -> None:
        """Opens the storage and, in cluster mode, joins the metadata group: call on the main
        thread (pysyncobj's tick thread lives as long as the thread that constructs it)."""
        self.config = config
        self.clock = clock or SystemClock()
        self.storage = Storage(config.data_dir)
        self.committer = GroupCommitter(self.storage)
        self.health = health.aio.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.peer_server: grpc.aio.Server | None = None
        self.port = 0
        self.peer_port = 0
        self.pool = ChannelPool(dial=config.dial_address)
        self.stream_relay_pool = ChannelPool(options=STREAM_RELAY_OPTIONS,
                                             dial=config.dial_address)
        self.peers: PeerClient | None = None
        self.credential: Credential | None = None
        self.group: RaftGroup | None = None
        self.cluster: ClusterNode | None = None
        self.raft_consumers: RaftConsumerStore | None = None
        store: ConsumerStore
        if config.raft_address:
            self.group = self._join_raft()
            self.raft_consumers = RaftConsumerStore(group=self.group, clock=self.clock,
                                                    epoch_of=self._leading_epoch)
            store = self.raft_consumers
        else:
            store = RocksConsumerStore(storage=self.storage, committer=self.committer,
                                       stream_id=lambda name: self.engine.get(name).stream_id)
        self.consumers = ConsumerManager(store=store, clock=self.clock)
        self.engine = StreamEngine(store=RocksMessageStore(self.storage, self.committer),
                                   clock=self.clock, consumers=self.consumers,
                                   follow_raft=bool(config.raft_address))
        if self.group is not None:
            self.cluster = self._cluster(self.group)

    def _leading_epoch(self, name: str) -> int | None:
        """The fence epoch this node leads a stream at (consumer acks carry it); None when it
        is not the stream's primary, or was deposed (its record may already hold the next
        primary's epoch, learned from a replica or a batch)."""
        stream = self.engine.streams.get(name)
        if stream is None or stream.role != ROLE_PRIMARY or stream.deposed is not None:
            return None
        return stream.record.epoch

    def _join_raft(self) -> RaftGroup:
        return RaftGroup(
            self_address=self.config.raft_address,
            peers=list(self.config.peers),
            journal_db=self.storage.db,
            journal_cfs=(CF_RAFT_LOG, CF_RAFT_META),
            snapshot_path=self.config.data_dir / "raft" / "snapshot.pb",
            secret=self.config.cluster_secret,
            on_applied=lambda event: self._cluster_node().on_applied(event),
            on_leader_change=lambda event: self._cluster_node().on_leader_change(event),
            clock=self.clock,
            stuck=self._loop_stuck,
            dial=self.config.dial_address,
        )

    def _loop_stuck(self) -> bool:
        """Any thread: the serving loop is stuck past the failover threshold (or the node
        does not serve yet): it must not lead Raft."""
        liveness = getattr(self, "liveness", None)
        return liveness is None or liveness.loop_stuck()

    def _cluster_node(self) -> ClusterNode:
        if self.cluster is None:
            raise InvariantViolation("a metadata event arrived before the cluster was built")
        return self.cluster

    def _cluster(self, group: RaftGroup) -> ClusterNode:
        cluster = ClusterNode(config=self.config, group=group, engine=self.engine,
                              consumers=self.consumers, clock=self.clock,
                              consumer_store=self.raft_consumers)
        self.credential = Credential(self.config.cluster_secret, clock=self.clock)
        self.peers = PeerClient(node_id=cluster.node_id, credential=self.credential,
                                address_of=cluster.member_peer_address,
                                dial=self.config.dial_address)
        cluster.replication = ReplicationManager(node_id=cluster.node_id,
                                                 transport=GrpcLinkTransport(self.peers),
                                                 clock=self.clock)
        self.liveness = LivenessMonitor(node_id=cluster.node_id, members=cluster.member_ids,
                                        peers=self.peers, clock=self.clock)
        cluster.liveness = self.liveness
        self.placement = Placement(node_id=cluster.node_id, group=group, peers=self.peers,
                                   liveness=self.liveness, clock=self.clock,
                                   replace_dead_after_s=self.config.replace_dead_after_s)
        self.failover = FailoverCoordinator(
            node_id=cluster.node_id, group=group, liveness=self.liveness, peers=self.peers,
            clock=self.clock, own_troubles=lambda: cluster.troubles.values(),
            busy=self.placement.is_moving)
        return cluster

    def _peer_access(self) -> tuple[Credential, PeerClient]:
        if self.credential is None or self.peers is None:
            raise InvariantViolation("node-to-node access is used outside cluster mode")
        return self.credential, self.peers

    def _services(self, server: grpc.aio.Server) -> tuple[str, ...]:
        """Every front-end on the client port, each over the same operations."""
        ops: operations.Operations
        if self.cluster is None:
            ops = operations.standalone(self.engine, self.consumers)
        else:
            credential, peers = self._peer_access()
            forwarder = Forwarder(self.pool, self.cluster, stream_pool=self.stream_relay_pool)
            cluster_ops = operations.clustered(
                engine=self.engine, manager=self.consumers, cluster=self.cluster,
                forwarder=forwarder, placement=self.placement, peers=peers)
            cluster_pb2_grpc.add_ClusterServicer_to_server(
                ClusterService(cluster_ops, credential), server)
            ops = cluster_ops
        streams_pb2_grpc.add_StreamsServicer_to_server(StreamsService(ops.streams), server)
        consumers_pb2_grpc.add_ConsumersServicer_to_server(ConsumersService(ops.consumers),
                                                           server)
        return SERVICE_NAMES if self.cluster is None else (*SERVICE_NAMES, CLUSTER_SERVICE_NAME)

    async def start(self) -> None:
        self.committer.start(asyncio.get_running_loop())
        self.engine.load()
        self.engine.start()
        # The malformed-request guard first (outermost), then the subscription slots (a
        # relayed Subscribe holds a slot here too).
        interceptors: list[grpc.aio.ServerInterceptor] = [
            MalformedRequestInterceptor(), SubscriptionLimitInterceptor()]
        if self.cluster is not None:
            await self.cluster.start()
            if self.cluster.replication is None:
                raise InvariantViolation("a clustered node without its replication manager")
            self.cluster.replication.start()
            self.liveness.start()
            self.failover.start()
            self.placement.start()
        server = grpc.aio.server(interceptors=interceptors, options=[
            ("grpc.max_receive_message_length", limits.request_bytes_max),
            ("grpc.max_send_message_length", limits.request_bytes_max),
            ("grpc.so_reuseport", 0),
        ])
        names = self._services(server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        self.port = server.add_insecure_port(self.config.grpc_address)
        if self.port == 0:
            raise RaftlogError(Reason.INVALID_CONFIG,
                               f"cannot listen on {self.config.grpc_address} (--grpc)")
        if self.cluster is not None:
            self.peer_server = self._peer_server(self.cluster)
            await self.peer_server.start()
        await server.start()
        self.server = server
        for name in ("", *names):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("node %s serving gRPC on %s, peers on %s", self.config.name,
                 self.config.grpc_address, self.config.peer_address or "-")

    def _peer_server(self, cluster: ClusterNode) -> grpc.aio.Server:
        """The peer listener: node-to-node services, for holders of the cluster credential."""
        credential, _ = self._peer_access()
        interceptors = [MalformedRequestInterceptor(), PeerAuthInterceptor(credential)]
        server = grpc.aio.server(interceptors=interceptors, options=[
            ("grpc.max_receive_message_length", limits.request_bytes_max),
            ("grpc.max_send_message_length", limits.request_bytes_max),
            ("grpc.so_reuseport", 0),
            *peer_server_options(),
        ])
        replication_pb2_grpc.add_ReplicationServicer_to_server(ReplicationService(
            node_id=cluster.node_id, engine=self.engine, committer=self.committer,
            ensure_replica=cluster.ensure_replica, health=cluster.health_report,
            credential=credential), server)
        self.peer_port = server.add_insecure_port(self.config.peer_address)
        if self.peer_port == 0:
            raise RaftlogError(Reason.INVALID_CONFIG,
                               f"cannot listen on {self.config.peer_address} (--peer)")
        return server

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        if self.server is not None:
            await self.server.stop(limits.drain_grace_s)
        if self.peer_server is not None:
            await self.peer_server.stop(limits.drain_grace_s)
        if self.cluster is not None:
            await self.placement.stop()
            await self.failover.stop()
            await self.liveness.stop()
            if self.cluster.replication is not None:
                await self.cluster.replication.stop()
            await self.cluster.stop()
        if self.raft_consumers is not None:
            await self.raft_consumers.close()
        if self.group is not None:
            self.group.close()
        await self.pool.close()
        await self.stream_relay_pool.close()
        if self.peers is not None:
            await self.peers.close()
        await self.engine.stop()
        await self.committer.durable()
        self.committer.stop()
        self.storage.close()
        log.info("node %s stopped", self.config.name)


async def serve(config: NodeConfig) -> None:
    node = Node(config)
    try:
        await node.start()
    except BaseException:
        await node.stop()
        raise
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    freeze_s = float(os.environ.get(FREEZE_ENV, "0") or 0)
    if freeze_s > 0:
        loop.add_signal_handler(signal.SIGUSR1, _freeze, freeze_s)
    await stopping.wait()
    log.info("signal received; draining")
    await node.stop()


def _freeze(seconds: float) -> None:
    """A fault for tests and chaos runs (only with $RAFTLOG_DEBUG_FREEZE_S set): SIGUSR1 blocks
    the event loop that serves requests for that long, while the other threads (Raft's tick
    thread, gRPC's) keep running, as a loop stuck in a long computation would."""
    log.warning("SIGUSR1: blocking the event loop for %.1f s (%s)", seconds, FREEZE_ENV)
    time.sleep(seconds)


def run(config: NodeConfig) -> int:
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    log_limit.install()  # repeated lines (same logger and template) are rate limited
    sys.setswitchinterval(limits.gil_switch_interval_s)  # DESIGN §3
    try:
        asyncio.run(serve(config))
    except RaftlogError as err:  # a configuration the node cannot start with
        print(f"error: {err.reason.name}: {err.message}", file=sys.stderr)
        return 1
    return 0
