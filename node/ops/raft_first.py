"""The metadata rules of a clustered node: every change is committed through the Raft group
first and then applied here; list calls span the cluster; a NOT_FOUND is confirmed against the
metadata group before anyone sees it (cluster/existence.py).

Stream calls reach these only on the stream's primary (or, for a create, on its ring owner),
as the operations route them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.node.cluster.coordinator import ClusterNode
from raftlog.node.cluster.existence import ExistenceCheck
from raftlog.node.consumers.config import validate_config as validate_consumer_config
from raftlog.node.consumers.manager import ConsumerManager
from raftlog.node.engine.stream_config import apply_update, validate_config
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.ops import canonical
from raftlog.node.transport import auth
from raftlog.node.transport.calls import LOCAL_HEADER, Call
from raftlog.node.transport.forwarding import Forwarder
from raftlog.v1 import consumers_pb2, streams_pb2, types_pb2

log = logging.getLogger(__name__)


class RaftMetadata:
    def __init__(self, *, engine: StreamEngine, manager: ConsumerManager,
                 cluster: ClusterNode, forwarder: Forwarder) -> None:
        self._engine = engine
        self._manager = manager
        self._cluster = cluster
        self._forwarder = forwarder
        self.existence = ExistenceCheck(cluster)

    async def confirm(self, error: RaftlogError, *, stream: str, consumer: str, via: Call
                      ) -> RaftlogError:
        return await self.existence.confirm(error, stream=stream, consumer=consumer,
                                            timeout_s=via.remaining_s())

    async def create_stream(self, config: types_pb2.StreamConfig, via: Call
                            ) -> types_pb2.StreamInfo:
        config = validate_config(config)
        existing = self._cluster.state.streams.get(config.name)
        if existing is None and self._cluster.placement_short(config):
            # This node's view may lack members that joined a moment ago (or the stream):
            # read the metadata at the leader's commit before placing on fewer members.
            await self._cluster.propose(raft_pb2.RaftCommand(barrier=raft_pb2.Barrier()),
                                        timeout_s=via.remaining_s())
            existing = self._cluster.state.streams.get(config.name)
        if existing is None:
            primary, replicas = self._cluster.new_placement(config)
            if primary != self._cluster.node_id:  # the ring moved under the router
                raise RaftlogError(Reason.NOT_PRIMARY, f"stream {config.name!r} belongs on "
                                   f"{primary}", primary=primary)
            caller = auth.current()
            owner = caller.name if caller.rules is not None else ""  # SYSTEM owns nothing
            await self._cluster.propose(raft_pb2.RaftCommand(stream_create=raft_pb2.StreamCreate(
                config=config, replicas=replicas, primary=primary, owner=owner)),
                timeout_s=via.remaining_s())
        elif existing.config != config:
            raise RaftlogError(Reason.STREAM_EXISTS,
                               f"stream {config.name!r} exists with a different config",
                               stream=config.name)
        await self._cluster.reconcile(config.name)
        await self._until_readable(config.name, via)
        return self._engine.info(config.name)

    async def _until_readable(self, name: str, via: Call) -> None:
        """Waits (at most limits.stream_ready_wait_s_max, and within the call's deadline)
        until this node, the new stream's primary, serves it: it holds its first lease from a
        majority of the replicas. A client's first publish after the create then finds it
        ready rather than UNAVAILABLE. Past the wait the create still answers: the stream
        exists, and a call made before it is ready answers UNAVAILABLE (retry)."""
        loop = asyncio.get_running_loop()
        wait_s = limits.stream_ready_wait_s_max
        remaining = via.remaining_s()
        if remaining is not None:
            wait_s = min(wait_s, remaining - limits.stream_ready_reserve_ms / 1000)
        deadline = loop.time() + wait_s
        while True:
            stream = self._engine.streams.get(name)
            if stream is None:
                return  # deleted meanwhile: nothing to wait for
            try:
                stream.check_readable()
                return
            except RaftlogError as err:
                if err.status_name != "UNAVAILABLE" or loop.time() >= deadline:
                    return
            await asyncio.sleep(limits.stream_ready_poll_ms / 1000)

    async def update_stream(self, request: streams_pb2.UpdateStreamRequest, via: Call
                            ) -> streams_pb2.UpdateStreamResponse:
        assignment = self._cluster.state.streams.get(request.name)
        if assignment is None:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"no stream named {request.name!r}",
                               stream=request.name)
        config = apply_update(assignment.config, request)
        if config.replicas != assignment.config.replicas:
            self._cluster.check_replicas(config)
        self._engine.consumers.check_stream_subjects(request.name, list(config.subjects))
        # Reconcile may apply the committed config (and prune) before this call does.
        pruned_before = self._engine.pruned_by_config(request.name)
        await self._cluster.propose(raft_pb2.RaftCommand(stream_update=raft_pb2.StreamUpdate(
            name=request.name, config=config)), timeout_s=via.remaining_s())
        await self._engine.apply_config(request.name, config)
        pruned = self._engine.pruned_by_config(request.name) - pruned_before
        return streams_pb2.UpdateStreamResponse(info=self._engine.info(request.name),
                                                pruned=pruned)

    async def delete_stream(self, name: str, via: Call) -> None:
        if name not in self._cluster.state.streams:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"no stream named {name!r}",
                               stream=name)
        await self._cluster.propose(raft_pb2.RaftCommand(
            stream_delete=raft_pb2.StreamDelete(name=name)), timeout_s=via.remaining_s())
        await self._cluster.reconcile(name)

    async def list_streams(self, prefix: str, via: Call) -> list[types_pb2.StreamInfo]:
        """Every stream the metadata knows, each as its primary describes it (or only its
        config, when its primary does not answer); a fan-out call lists this node's own."""
        if via.local_only:
            return list(self._engine.infos(prefix))
        # Read the metadata at the leader's commit (a node restarted a moment ago may not have
        # applied every create yet); without a leader, this node's view is the best there is.
        with contextlib.suppress(RaftlogError):
            await self._cluster.propose(raft_pb2.RaftCommand(barrier=raft_pb2.Barrier()),
                                        timeout_s=min(via.timeout_s(),
                                                      limits.list_barrier_wait_s_max))
        with self._cluster.group.read_state() as state:
            assignments = {name: stream.config for name, stream in state.streams.items()
                           if name.startswith(prefix)}
            addresses = {m.node_id: m.grpc_address for m in state.members.values()}
        found: dict[str, types_pb2.StreamInfo] = {}
        for infos in await asyncio.gather(*(self.node_streams(node_id, address, via)
                                            for node_id, address in addresses.items())):
            for info in infos or ():
                if info.config.name in assignments:
                    found[info.config.name] = info
        return [found.get(name) or types_pb2.StreamInfo(config=config)
                for name, config in sorted(assignments.items())]

    async def node_streams(self, node_id: str, address: str, via: Call
                           ) -> list[types_pb2.StreamInfo] | None:
        """The streams one node serves as primary; None when it does not answer."""
        if node_id == self._cluster.node_id:
            return list(self._engine.infos())
        timeout_s = min(via.timeout_s(), limits.fanout_timeout_s)
        try:
            reply = await self._forwarder.unary(
                address, canonical.LIST_STREAMS, streams_pb2.ListStreamsRequest(),
                Call(hops=via.hops), timeout_s=timeout_s, headers=((LOCAL_HEADER, "1"),))
        except RaftlogError as err:
            log.info("listing streams on %s failed: %s", address, err.message)
            return None
        return list(reply.streams)

    async def create_consumer(self, stream: str, config: consumers_pb2.ConsumerConfig,
                              via: Call) -> consumers_pb2.ConsumerInfo:
        assignment = self._cluster.state.streams.get(stream)
        if assignment is None:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"no stream named {stream!r}",
                               stream=stream)
        config = validate_consumer_config(config,
                                          stream_subjects=list(assignment.config.subjects))
        committed = self._cluster.state.consumers.get(stream, {}).get(config.name)
        if committed is not None:
            return await self._manager.create(stream, config)  # same config: idempotent
        # Committed first: the consumer's acks are committed through the cluster and refer
        # to it; if the local create then fails, the cluster forgets the consumer again.
        await self._cluster.propose(raft_pb2.RaftCommand(consumer_create=raft_pb2.ConsumerCreate(
            stream=stream, config=config)), timeout_s=via.remaining_s())
        try:
            return await self._manager.create(stream, config)
        except RaftlogError:
            await self._cluster.propose(raft_pb2.RaftCommand(
                consumer_delete=raft_pb2.ConsumerDelete(stream=stream, consumer=config.name)))
            raise

    async def delete_consumer(self, stream: str, consumer: str, via: Call) -> None:
        subjects.validate_name(consumer, what="consumer")
        self._manager.info(stream, consumer)  # NOT_FOUND before proposing
        await self._cluster.propose(raft_pb2.RaftCommand(consumer_delete=raft_pb2.ConsumerDelete(
            stream=stream, consumer=consumer)), timeout_s=via.remaining_s())
        await self._manager.delete(stream, consumer)
