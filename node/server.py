"""The node process: opens storage, builds the engines and serves gRPC until SIGTERM.

Threads: the main thread runs the asyncio loop (gRPC aio server, engines); one group-commit
thread fsyncs. SIGTERM/SIGINT stop accepting calls, let running calls finish for up to
limits.drain_grace_s, fsync, and close RocksDB.
"""

from __future__ import annotations

import asyncio
import gc
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
from raftlog.compat import (
    kafkapixy_pb2_grpc,
    rocketmq_v1_service_pb2_grpc,
    rocketmq_v2_service_pb2_grpc,
    waymaker_collections_pb2,
    waymaker_collections_pb2_grpc,
    waymaker_kv_pb2,
    waymaker_kv_pb2_grpc,
    waymaker_streams_pb2_grpc,
)
from raftlog.internal import raft_pb2, replication_pb2_grpc
from raftlog.node import log_limit
from raftlog.node.api.auth import AuthService
from raftlog.node.api.cluster import ClusterService
from raftlog.node.api.collections import CollectionsService
from raftlog.node.api.consumers import ConsumersService
from raftlog.node.api.kafkapixy import SERVICE_NAME as KAFKAPIXY_SERVICE_NAME
from raftlog.node.api.kafkapixy import KafkaPixyService
from raftlog.node.api.kv import KVService
from raftlog.node.api.objects import ObjectsService
from raftlog.node.api.rocketmq_v1 import SERVICE_NAME as ROCKETMQ_V1_SERVICE_NAME
from raftlog.node.api.rocketmq_v1 import RocketMQv1Service
from raftlog.node.api.rocketmq_v2 import SERVICE_NAME as ROCKETMQ_V2_SERVICE_NAME
from raftlog.node.api.rocketmq_v2 import RocketMQService
from raftlog.node.api.streams import StreamsService
from raftlog.node.api.topics import TopicsService
from raftlog.node.api.transactions import TransactionsService
from raftlog.node.api.waymaker import SERVICE_NAME as WAYMAKER_SERVICE_NAME
from raftlog.node.api.waymaker import WaymakerService
from raftlog.node.api.waymaker_collections import WaymakerCollections
from raftlog.node.api.waymaker_kv import WaymakerKv
from raftlog.node.api.waymaker_objects import WaymakerObjects
from raftlog.node.api.waymaker_sources import WaymakerSources
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
from raftlog.node.ops.audit_export import AuditExport, remove_leftovers
from raftlog.node.ops.collections import CollectionOps
from raftlog.node.ops.kv import KVOps
from raftlog.node.ops.objects import ObjectOps, ObjectSweeper
from raftlog.node.ops.objects_layout import STREAM_PREFIX as BUCKET_STREAM_PREFIX
from raftlog.node.ops.route import ClusterRoute, LocalRoute, Route
from raftlog.node.ops.schedule_runner import ScheduleRunner
from raftlog.node.ops.sources import SourceRunner
from raftlog.node.ops.transactions_janitor import TransactionJanitor
from raftlog.node.ops.users import UserOps
from raftlog.node.replication.links import GrpcLinkTransport
from raftlog.node.replication.primary import ReplicationManager
from raftlog.node.replication.replica import ROLE_PRIMARY
from raftlog.node.replication.service import ReplicationService
from raftlog.node.transport import auth, logctx
from raftlog.node.transport.channels import STREAM_RELAY_OPTIONS, ChannelPool
from raftlog.node.transport.connections import ConnectionCounts, ConnectionLimitInterceptor
from raftlog.node.transport.credentials import Credential
from raftlog.node.transport.forwarding import Forwarder
from raftlog.node.transport.malformed import MalformedRequestInterceptor
from raftlog.node.transport.metrics import MetricsInterceptor, NodeMetrics
from raftlog.node.transport.metrics_state import NodeState, StateCollector
from raftlog.node.transport.peer import PeerAuthInterceptor, PeerClient, peer_server_options
from raftlog.node.transport.servers import aio_server
from raftlog.node.transport.subscriptions import (
    LIMITED_METHODS,
    SubscriptionLimitInterceptor,
    SubscriptionSlots,
)
from raftlog.node.transport.tls import CertificateFiles, ClientAuth, TlsFiles, add_port
from raftlog.node.transport.user_limits import UserLimitInterceptor, UserSessions
from raftlog.raft.group import RaftGroup
from raftlog.v1 import (
    auth_pb2,
    auth_pb2_grpc,
    cluster_pb2,
    cluster_pb2_grpc,
    collections_pb2,
    collections_pb2_grpc,
    consumers_pb2,
    consumers_pb2_grpc,
    kv_pb2,
    kv_pb2_grpc,
    objects_pb2,
    objects_pb2_grpc,
    streams_pb2,
    streams_pb2_grpc,
    topics_pb2,
    topics_pb2_grpc,
    transactions_pb2,
    transactions_pb2_grpc,
)

log = logging.getLogger(__name__)

FREEZE_ENV = "RAFTLOG_DEBUG_FREEZE_S"
SERVICE_NAMES = (
    streams_pb2.DESCRIPTOR.services_by_name["Streams"].full_name,
    consumers_pb2.DESCRIPTOR.services_by_name["Consumers"].full_name,
    collections_pb2.DESCRIPTOR.services_by_name["Collections"].full_name,
    kv_pb2.DESCRIPTOR.services_by_name["KV"].full_name,
    objects_pb2.DESCRIPTOR.services_by_name["Objects"].full_name,
    topics_pb2.DESCRIPTOR.services_by_name["Topics"].full_name,
    transactions_pb2.DESCRIPTOR.services_by_name["Transactions"].full_name,
    KAFKAPIXY_SERVICE_NAME,  # Kafka-Pixy, no proto package: /KafkaPixy/Produce ...
    ROCKETMQ_V1_SERVICE_NAME,  # apache.rocketmq.v1.MessagingService (docs/rocketmq-v1.md)
    ROCKETMQ_V2_SERVICE_NAME,  # apache.rocketmq.v2.MessagingService (docs/rocketmq.md)
    WAYMAKER_SERVICE_NAME,
    waymaker_kv_pb2.DESCRIPTOR.services_by_name["WaymakerKvService"].full_name,
    waymaker_collections_pb2.DESCRIPTOR.services_by_name["WaymakerCollectionsService"].full_name,
)
WAYMAKER_SUBSCRIBE = f"/{WAYMAKER_SERVICE_NAME}/Subscribe"
CLUSTER_SERVICE_NAME = cluster_pb2.DESCRIPTOR.services_by_name["Cluster"].full_name
AUTH_SERVICE_NAME = auth_pb2.DESCRIPTOR.services_by_name["Auth"].full_name


class Node:
    """Everything one node owns; `start` and `stop` run on the event loop."""

    def __init__(self, config: NodeConfig, *, clock: Clock | None = None) -> None:
        """Opens the storage and, in cluster mode, joins the metadata group: call on the main
        thread (pysyncobj's tick thread lives as long as the thread that constructs it)."""
        self.config = config
        self.clock = clock or SystemClock()
        self.tls = _tls_files(config)  # before anything opens: bad files end the start here
        self.storage = Storage(config.data_dir)
        remove_leftovers(config.data_dir)  # of audit exports a crash interrupted
        self.committer = GroupCommitter(self.storage)
        self.metrics = NodeMetrics() if config.metrics_address else None  # --metrics
        self.health = health.aio.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.peer_server: grpc.aio.Server | None = None
        self.port = 0
        self.peer_port = 0
        tls = self.tls.channel_credentials if self.tls is not None else None
        self.pool = ChannelPool(dial=config.dial_address, credentials=tls)
        self.stream_relay_pool = ChannelPool(options=STREAM_RELAY_OPTIONS,
                                             dial=config.dial_address, credentials=tls)
        self.peers: PeerClient | None = None
        self.credential: Credential | None = None
        self.group: RaftGroup | None = None
        self.cluster: ClusterNode | None = None
        self.raft_consumers: RaftConsumerStore | None = None
        self.sources: SourceRunner | None = None  # the stream sources' tails (_services)
        self.txn_janitor: TransactionJanitor | None = None  # open transactions' ends (_services)
        self.schedulers: ScheduleRunner | None = None  # scheduled messages' delivery (_services)
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
        self.engine.owner_of = cluster.stream_owner
        self.credential = Credential(self.config.cluster_secret, clock=self.clock)
        self.peers = PeerClient(node_id=cluster.node_id, credential=self.credential,
                                address_of=cluster.member_peer_address,
                                dial=self.config.dial_address,
                                tls=self.tls.channel_credentials if self.tls else None)
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
        where: Route = LocalRoute()
        if self.cluster is None:
            ops = operations.standalone(self.engine, self.consumers, clock=self.clock)
        else:
            credential, peers = self._peer_access()
            forwarder = Forwarder(self.pool, self.cluster, stream_pool=self.stream_relay_pool,
                                  on_forward=self.metrics.count_forward if self.metrics else None,
                                  identity=auth.identity_headers(credential))
            where = ClusterRoute(self.cluster, forwarder)
            group = self.cluster.group
            audit = AuditExport(node_id=self.cluster.node_id, storage=self.storage,
                                engine=self.engine, data_dir=self.config.data_dir,
                                applied_index=lambda: group.status().applied_index)
            cluster_ops = operations.clustered(
                engine=self.engine, manager=self.consumers, cluster=self.cluster,
                forwarder=forwarder, placement=self.placement, peers=peers, audit=audit,
                clock=self.clock)
            cluster_pb2_grpc.add_ClusterServicer_to_server(
                ClusterService(cluster_ops, credential), server)
            auth_pb2_grpc.add_AuthServicer_to_server(AuthService(
                UserOps(self.cluster, clock=self.clock), credential), server)
            ops = cluster_ops
        streams_pb2_grpc.add_StreamsServicer_to_server(StreamsService(ops.streams), server)
        self.sources = SourceRunner(streams=ops.streams, engine=self.engine, clock=self.clock,
                                    node_id=self.cluster.node_id if self.cluster else "")
        self.schedulers = ScheduleRunner(streams=ops.streams, engine=self.engine,
                                         clock=self.clock,
                                         in_flight=ops.streams.scheduled().in_flight)
        consumers_pb2_grpc.add_ConsumersServicer_to_server(ConsumersService(ops.consumers),
                                                           server)
        collection_ops = CollectionOps(ops.streams, ops.consumers)
        collections_pb2_grpc.add_CollectionsServicer_to_server(
            CollectionsService(collection_ops), server)
        waymaker_collections_pb2_grpc.add_WaymakerCollectionsServiceServicer_to_server(
            WaymakerCollections(collection_ops), server)
        kv_ops = KVOps(ops.streams, clock=self.clock)  # one count of watches for both APIs
        kv_pb2_grpc.add_KVServicer_to_server(KVService(kv_ops), server)
        waymaker_kv_pb2_grpc.add_WaymakerKvServiceServicer_to_server(WaymakerKv(kv_ops), server)
        topics_pb2_grpc.add_TopicsServicer_to_server(TopicsService(ops.topics), server)
        transactions_pb2_grpc.add_TransactionsServicer_to_server(
            TransactionsService(ops.transactions), server)
        self.txn_janitor = TransactionJanitor(ops.transactions, clock=self.clock)
        kafkapixy_pb2_grpc.add_KafkaPixyServicer_to_server(
            KafkaPixyService(ops, clock=self.clock), server)
        def own_address() -> str:  # the RocketMQ front-ends' store host
            return where.members().get(where.node_id) or (
                f"{self.config.grpc_address.rpartition(':')[0]}:{self.port}")

        rocketmq_v2_service_pb2_grpc.add_MessagingServiceServicer_to_server(RocketMQService(
            ops, where=where, own_address=own_address, clock=self.clock), server)
        rocketmq_v1_service_pb2_grpc.add_MessagingServiceServicer_to_server(RocketMQv1Service(
            ops, clock=self.clock, own_address=own_address), server)
        objects = ObjectOps(ops.streams, clock=self.clock)
        self.object_sweeper = ObjectSweeper(objects, buckets_here=self._buckets_here)
        objects_pb2_grpc.add_ObjectsServicer_to_server(ObjectsService(objects), server)
        waymaker_streams_pb2_grpc.add_WaymakerStreamsServiceServicer_to_server(
            WaymakerService(ops, credential=self.credential,
                            extra={**WaymakerObjects(objects).handlers(),
                                   **WaymakerSources(ops.streams).handlers()}), server)
        return SERVICE_NAMES if self.cluster is None else (*SERVICE_NAMES, CLUSTER_SERVICE_NAME,
                                                           AUTH_SERVICE_NAME)

    def _buckets_here(self) -> list[str]:
        """The object buckets whose stream this node leads (their sweep runs here)."""
        cluster = self.cluster
        return [name[len(BUCKET_STREAM_PREFIX):] for name in list(self.engine.streams)
                if name.startswith(BUCKET_STREAM_PREFIX)
                and (cluster is None or cluster.primary_of(name) == cluster.node_id)]

    async def start(self) -> None:
        self.committer.start(asyncio.get_running_loop())
        self.engine.load()
        self.engine.start()
        # The malformed-request guard first (outermost), then the subscription slots (a
        # relayed Subscribe holds a slot here too).
        interceptors: list[grpc.aio.ServerInterceptor] = [
            MalformedRequestInterceptor(),
            SubscriptionLimitInterceptor(SubscriptionSlots(self.config.subscriptions_max),
                                         methods=LIMITED_METHODS | {WAYMAKER_SUBSCRIBE})]
        connections_max = self.config.connections_max or limits.client_connections_max_default
        if connections_max:  # inside the guard: docs/quotas.md
            interceptors.insert(1, ConnectionLimitInterceptor(ConnectionCounts(connections_max)))
        if self.metrics is not None:  # outermost: it counts the calls the others refuse too
            interceptors.insert(0, MetricsInterceptor(self.metrics))
        if self.cluster is not None:  # users live in the metadata: a cluster's only
            interceptors.append(auth.AuthInterceptor(self._authenticator(self.cluster)))
            # Inside the identity's wrapper: it counts per user (docs/quotas.md).
            interceptors.append(UserLimitInterceptor(
                UserSessions(), subscription_methods=LIMITED_METHODS | {WAYMAKER_SUBSCRIBE}))
        if self.cluster is not None:
            await self.cluster.start()
            if self.cluster.replication is None:
                raise InvariantViolation("a clustered node without its replication manager")
            self.cluster.replication.start()
            self.liveness.start()
            self.failover.start()
            self.placement.start()
        server = aio_server(interceptors=interceptors, options=[
            ("grpc.max_receive_message_length", limits.request_bytes_max),
            ("grpc.max_send_message_length", limits.request_bytes_max),
            ("grpc.so_reuseport", 0),
        ])
        names = self._services(server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        self.port = add_port(server, self.config.grpc_address, self.tls, what="client port",
                             require_client_cert=self.config.tls_client_auth
                             == ClientAuth.REQUIRE.value)
        if self.port == 0:
            raise RaftlogError(Reason.INVALID_CONFIG,
                               f"cannot listen on {self.config.grpc_address} (--grpc)")
        if self.cluster is not None:
            self.peer_server = self._peer_server(self.cluster)
            await self.peer_server.start()
        await server.start()
        self.server = server
        if self.sources is not None:
            self.sources.start()
        if self.txn_janitor is not None:
            self.txn_janitor.start()
        if self.schedulers is not None:
            self.schedulers.start()
        self.object_sweeper.start()
        if self.metrics is not None:
            self._serve_metrics(self.metrics)
        for name in ("", *names):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("node %s serving gRPC on %s, peers on %s%s", self.config.name,
                 self.config.grpc_address, self.config.peer_address or "-",
                 f" (TLS, certificate serial {self.tls.current.serial:x})" if self.tls else "")

    def _serve_metrics(self, metrics: NodeMetrics) -> None:
        """Hooks the hot-path instruments in and serves /metrics (--metrics, docs/metrics.md)."""
        self.committer.on_batch = metrics.observe_batch
        failover = self.failover if self.cluster is not None else None
        if self.group is not None:
            self.group.on_proposal = metrics.observe_proposal
        metrics.registry.register(StateCollector(NodeState(
            streams=self.engine.streams, consumers=self.consumers,
            fsyncs=lambda: self.committer.fsyncs, raft=self.group,
            failovers=(lambda: len(failover.failovers)) if failover is not None else None),
            loop=asyncio.get_running_loop()))
        port = metrics.serve(self.config.metrics_address)
        log.info("node %s serving metrics on port %d", self.config.name, port)

    def _authenticator(self, cluster: ClusterNode) -> auth.Authenticator:
        """Identities against the users in the metadata (docs/auth.md)."""
        credential, _ = self._peer_access()

        def subjects_of(stream: str, consumer: str) -> list[str]:
            """What a read of the stream (through the consumer) may return: the consumer's
            filter, else the stream's subject patterns."""
            state = cluster.state
            assigned = state.consumers.get(stream, {}).get(consumer)
            if assigned is not None and assigned.config.filter_subject:
                return [assigned.config.filter_subject]
            found = state.streams.get(stream)
            return list(found.config.subjects) if found is not None and found.config.subjects \
                else [">"]

        group = cluster.group
        # What this node had committed when it stopped: pysyncobj applies it again after the
        # start, on its own thread, and the users are in it (docs/auth.md).
        replay_to = self.group.journal.getRaftCommitIndex() if self.group is not None else 0
        loaded = False

        def users_loaded() -> bool:
            nonlocal loaded
            loaded = loaded or group.state.applied_index >= replay_to or cluster.caught_up()
            return loaded

        def users() -> dict[str, raft_pb2.UserRecord]:
            """The users now (records are replaced, never changed: state_users.py)."""
            if not group.state.users:
                return {}
            with group.read_state() as state:
                return dict(state.users)

        return auth.Authenticator(users=users, credential=credential,
                                  subjects_of=subjects_of, clock=self.clock,
                                  users_loaded=users_loaded)

    def _peer_server(self, cluster: ClusterNode) -> grpc.aio.Server:
        """The peer listener: node-to-node services, for holders of the cluster credential."""
        credential, _ = self._peer_access()
        interceptors: list[grpc.aio.ServerInterceptor] = [
            MalformedRequestInterceptor(), PeerAuthInterceptor(credential)]
        if self.metrics is not None:  # outermost, as on the client port (peer families)
            interceptors.insert(0, MetricsInterceptor(self.metrics, peer=True))
        server = aio_server(interceptors=interceptors, options=[
            ("grpc.max_receive_message_length", limits.request_bytes_max),
            ("grpc.max_send_message_length", limits.request_bytes_max),
            ("grpc.so_reuseport", 0),
            *peer_server_options(),
        ])
        # The node's own consumer store: unused by a member (consumers live in the metadata),
        # only for the audit's repair to remove what an export found there.
        own_consumers = RocksConsumerStore(storage=self.storage, committer=self.committer,
                                           stream_id=lambda name: self.engine.get(name).stream_id)
        replication = ReplicationService(
            node_id=cluster.node_id, engine=self.engine, committer=self.committer,
            ensure_replica=cluster.ensure_replica, health=cluster.health_report,
            credential=credential, consumer_copies=own_consumers)
        if self.metrics is not None:
            replication.on_applied = self.metrics.observe_replicated
            replication.on_refused = self.metrics.count_refusal
        replication_pb2_grpc.add_ReplicationServicer_to_server(replication, server)
        self.peer_port = add_port(server, self.config.peer_address, self.tls,
                                  what="peer listener", require_client_cert=True)
        if self.peer_port == 0:
            raise RaftlogError(Reason.INVALID_CONFIG,
                               f"cannot listen on {self.config.peer_address} (--peer)")
        return server

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        if self.metrics is not None:
            self.metrics.close()
        if self.sources is not None:
            await self.sources.stop()
        if self.txn_janitor is not None:
            await self.txn_janitor.stop()
        if self.schedulers is not None:
            await self.schedulers.stop()
        if self.server is not None:
            await self.server.stop(limits.drain_grace_s)
            await self.object_sweeper.stop()
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


def _tls_files(config: NodeConfig) -> CertificateFiles | None:
    """The node's TLS files, read and checked; None without --tls-cert (plaintext)."""
    if config.tls_cert is None or config.tls_key is None or config.tls_ca is None:
        return None
    return CertificateFiles(TlsFiles(cert=config.tls_cert, key=config.tls_key,
                                     ca=config.tls_ca))


async def serve(config: NodeConfig) -> None:
    node = Node(config)
    try:
        await node.start()
    except BaseException:
        await node.stop()
        raise
    gc.freeze()  # what the start built lives as long as the node: out of every collection
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
    logctx.configure(log_format=config.log_format, level=config.log_level, node=config.name)
    # Repeated lines (same logger and template) are rate limited.
    log_limit.install(window_s=config.log_repeat_window_s)
    sys.setswitchinterval(limits.gil_switch_interval_s)  # DESIGN §3
    gc.set_threshold(limits.gc_young_objects, limits.gc_middle_collections,
                     limits.gc_old_collections)
    try:
        asyncio.run(serve(config))
    except RaftlogError as err:  # a configuration the node cannot start with
        if config.log_format == "json":  # every line of a JSON log is JSON
            log.error("cannot start: %s: %s", err.reason.name, err.message)
        else:
            print(f"error: {err.reason.name}: {err.message}", file=sys.stderr)
        return 1
    return 0
