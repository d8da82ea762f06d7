"""The admin `Cluster` service: status, membership changes, route explanations, authority
overrides, cluster-wide stream stats and the watch stream."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections.abc import AsyncIterator
from typing import Any

import grpc

from raftlog.base import subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.node.api.clustered import list_node
from raftlog.node.cluster.coordinator import ClusterNode
from raftlog.node.cluster.placement import Placement
from raftlog.node.transport import rpc
from raftlog.node.transport.credentials import ADMIN_TOKEN_HEADER, Credential
from raftlog.node.transport.forwarding import (
    ChannelPool,
    outgoing_metadata,
    relay_error,
    remaining_s,
)
from raftlog.node.transport.peer import PeerClient
from raftlog.raft.addresses import split_address
from raftlog.v1 import cluster_pb2, cluster_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]
fanout_timeout_s = 5.0
membership_timeout_s = 10.0
join_probe_timeout_s = 2.0  # a joining node must answer its challenge within this
join_catch_up_s = 30.0  # ...and apply the metadata up to its own registration within this
join_poll_s = 0.1
_SERVICE_PREFIX = "/" + cluster_pb2.DESCRIPTOR.services_by_name["Cluster"].full_name + "/"
# The calls that change membership or placement: they need the cluster credential.
ADMIN_METHODS = frozenset({"JoinNode", "LeaveNode", "MigrateStream", "RebalanceStreams",
                           "ClearStreamAuthority", "SetStreamPinned"})
rebalance_steps_max = 1_000

_HEALTH = {
    raft_pb2.MEMBER_STATUS_ALIVE: cluster_pb2.NODE_HEALTH_ALIVE,
    raft_pb2.MEMBER_STATUS_SUSPECT: cluster_pb2.NODE_HEALTH_SUSPECT,
    raft_pb2.MEMBER_STATUS_DEAD: cluster_pb2.NODE_HEALTH_DEAD,
}


def skew(values: list[int]) -> float:
    """max / mean (1.0 = even; 0.0 when there is nothing)."""
    mean = statistics.fmean(values) if values else 0.0
    return max(values) / mean if mean else 0.0


def admin_metadata(credential: Credential, method: str) -> tuple[tuple[str, str], ...]:
    """Call metadata that authorizes one admin call of `method` (e.g. "JoinNode")."""
    path = f"{_SERVICE_PREFIX}{method}"
    return ((ADMIN_TOKEN_HEADER, credential.token(principal="admin", method=path)),)


class ClusterService(cluster_pb2_grpc.ClusterServicer):
    """Calls that change membership or placement need the cluster credential (an admin
    token in metadata, `admin_metadata`); the others are open to every client."""

    def __init__(self, cluster: ClusterNode, pool: ChannelPool, placement: Placement,
                 credential: Credential, peers: PeerClient) -> None:
        self._cluster = cluster
        self._pool = pool
        self._placement = placement
        self._credential = credential
        self._peers = peers

    def _require_admin(self, context: Context, method: str) -> None:
        token = ""
        for key, value in context.invocation_metadata() or ():
            if key == ADMIN_TOKEN_HEADER:
                token = value if isinstance(value, str) else bytes(value).decode("replace")
        try:
            self._credential.verify(token, method=f"{_SERVICE_PREFIX}{method}")
        except RaftlogError as err:
            raise RaftlogError(Reason.UNAUTHENTICATED, f"{method} changes the cluster: "
                               f"{err.message} (give the CLI --secret-file FILE or set "
                               "RAFTLOG_SECRET_FILE)", method=method) from None

    def _status(self) -> cluster_pb2.ClusterStatus:
        group = self._cluster.group.status()
        connected = {peer.address: peer.connected for peer in group.peers}
        leader = self._cluster.leader_node_id()
        nodes = []
        with self._cluster.group.read_state() as state:
            for member in sorted(state.members.values(), key=lambda m: m.node_id):
                held = [s for s in state.streams.values() if member.node_id in s.replicas]
                nodes.append(cluster_pb2.NodeStatus(
                    node_id=member.node_id, raft_address=member.raft_address,
                    grpc_address=member.grpc_address, peer_address=member.peer_address,
                    health=_HEALTH.get(member.status, cluster_pb2.NODE_HEALTH_UNKNOWN),
                    raft_leader=member.node_id == leader and bool(leader),
                    connected=(member.node_id == self._cluster.node_id
                               or connected.get(member.raft_address, False)),
                    joined_ms=member.joined_ms,
                    primaries=sum(1 for s in held if s.primary == member.node_id),
                    replicas=len(held)))
        return cluster_pb2.ClusterStatus(
            nodes=nodes, raft_leader=leader, raft_term=group.term,
            commit_index=group.commit_index, applied_index=group.applied_index,
            answered_by=self._cluster.node_id, caught_up=self._cluster.caught_up())

    @rpc.unary
    async def GetClusterStatus(self, request: cluster_pb2.GetClusterStatusRequest,
                               context: Context) -> cluster_pb2.ClusterStatus:
        return self._status()

    async def _on_leader(self, method: str, request: Any, context: Context) -> Any:
        """Sends a membership call to the Raft leader; None when this node leads."""
        if self._cluster.group.is_leader():
            return None
        leader = self._cluster.leader_node_id()
        if not leader:
            raise RaftlogError(Reason.NO_LEADER, "the cluster has no Raft leader",
                               retry_after_ms=250)
        stub = cluster_pb2_grpc.ClusterStub(  # type: ignore[no-untyped-call]
            self._pool.get(self._cluster.member_address(leader)))
        try:
            return await getattr(stub, method)(request, metadata=outgoing_metadata(context),
                                               timeout=remaining_s(context))
        except grpc.aio.AioRpcError as err:
            await relay_error(context, err, leader)
            raise

    @rpc.unary
    async def JoinNode(self, request: cluster_pb2.JoinNodeRequest,
                       context: Context) -> cluster_pb2.ClusterStatus:
        """A learner step before the node counts: it must answer on its peer listener as
        `node_id` with the cluster credential before it joins the Raft group, and the call
        returns once it applied the metadata up to its own registration (or takes it out
        again and fails when it does not catch up in time)."""
        self._require_admin(context, "JoinNode")
        subjects.validate_name(request.node_id, what="node")
        for what, value in (("raft_address", request.raft_address),
                            ("grpc_address", request.grpc_address),
                            ("peer_address", request.peer_address)):
            try:
                split_address(value)
            except RaftlogError:
                raise RaftlogError(Reason.INVALID_ARGUMENT, f"{what} must be host:port, not "
                                   f"{value!r}", field=what) from None
        forwarded = await self._on_leader("JoinNode", request, context)
        if forwarded is not None:
            return forwarded  # type: ignore[no-any-return]
        state = self._cluster.state
        if request.node_id in state.members:
            raise RaftlogError(Reason.NODE_EXISTS, f"node {request.node_id!r} is a member",
                               node=request.node_id)
        addresses = {request.raft_address, request.grpc_address, request.peer_address}
        if any(addresses & {m.raft_address, m.grpc_address, m.peer_address}
               for m in state.members.values()):
            raise RaftlogError(Reason.NODE_EXISTS, "a member already uses that address")
        await self._peers.challenge(request.peer_address, node_id=request.node_id,
                                    timeout_s=join_probe_timeout_s)
        await self._cluster.group.add_member(request.raft_address,
                                             timeout_s=membership_timeout_s)
        result = await self._cluster.propose(raft_pb2.RaftCommand(
            member_join=raft_pb2.MemberJoin(
                node_id=request.node_id, raft_address=request.raft_address,
                grpc_address=request.grpc_address, peer_address=request.peer_address)))
        await self._wait_joined(request, index=result.index)
        return self._status()

    async def _wait_joined(self, request: cluster_pb2.JoinNodeRequest, *, index: int) -> None:
        """Until the new member applied `index`; else removes it again and fails."""
        deadline = asyncio.get_running_loop().time() + join_catch_up_s
        while asyncio.get_running_loop().time() < deadline:
            with contextlib.suppress(RaftlogError):
                reply = await self._peers.challenge(request.peer_address,
                                                    node_id=request.node_id,
                                                    timeout_s=join_probe_timeout_s)
                if reply.raft_applied_index >= index:
                    return
            await asyncio.sleep(join_poll_s)
        with contextlib.suppress(RaftlogError):
            await self._cluster.propose(raft_pb2.RaftCommand(
                member_leave=raft_pb2.MemberLeave(node_id=request.node_id)))
        with contextlib.suppress(RaftlogError):
            await self._cluster.group.remove_member(request.raft_address,
                                                    timeout_s=membership_timeout_s)
        raise RaftlogError(Reason.NODE_UNREACHABLE, f"{request.node_id!r} did not catch up "
                           f"with the metadata within {join_catch_up_s} s; it was removed "
                           "again", node=request.node_id)

    @rpc.unary
    async def LeaveNode(self, request: cluster_pb2.LeaveNodeRequest,
                        context: Context) -> cluster_pb2.ClusterStatus:
        self._require_admin(context, "LeaveNode")
        subjects.validate_name(request.node_id, what="node")
        forwarded = await self._on_leader("LeaveNode", request, context)
        if forwarded is not None:
            return forwarded  # type: ignore[no-any-return]
        member = self._cluster.state.members.get(request.node_id)
        if member is None:
            raise RaftlogError(Reason.NODE_NOT_FOUND, f"no member {request.node_id!r}",
                               node=request.node_id)
        if request.node_id == self._cluster.node_id:
            # The leader cannot take itself out of the Raft group: it hands leadership over
            # and the new leader drains and removes it.
            await self._cluster.group.transfer_leadership(timeout_s=membership_timeout_s)
            forwarded = await self._on_leader("LeaveNode", request, context)
            if forwarded is None:
                raise RaftlogError(Reason.MEMBERSHIP_CHANGE_IN_PROGRESS, "Raft leadership "
                                   "came back to the leaving node; retry", node=request.node_id)
            return forwarded  # type: ignore[no-any-return]
        await self._placement.drain(request.node_id)
        await self._cluster.propose(raft_pb2.RaftCommand(
            member_leave=raft_pb2.MemberLeave(node_id=request.node_id)))
        await self._cluster.group.remove_member(member.raft_address,
                                                timeout_s=membership_timeout_s)
        return self._status()

    @rpc.unary
    async def ExplainRoute(self, request: cluster_pb2.ExplainRouteRequest,
                           context: Context) -> cluster_pb2.RouteExplanation:
        subjects.validate_name(request.stream, what="stream")
        ring = self._cluster.ring()
        assignment = self._cluster.state.streams.get(request.stream)
        if assignment is None:  # maybe created a moment ago, not applied here yet: make sure
            with contextlib.suppress(RaftlogError):
                await self._cluster.propose(raft_pb2.RaftCommand(barrier=raft_pb2.Barrier()),
                                            timeout_s=context.time_remaining())
            assignment = self._cluster.state.streams.get(request.stream)
        if assignment is None:
            placement = ring.place(request.stream, replicas=min(3, len(ring)))
            explanation = cluster_pb2.RouteExplanation(
                stream=request.stream, exists=False, ring_owner=placement.ring_owner,
                primary=placement.primary, replicas=placement.replicas,
                reason=f"the stream does not exist; it would be created on the ring owner: "
                       f"{placement.reason}")
        else:
            override = assignment.override
            owner = ring.owner(request.stream)
            if override is not None:
                why = (f"authority override to {override.claimant} at fence epoch "
                       f"{override.fence_epoch}" + (" (pinned)" if override.pinned else ""))
            elif assignment.primary == owner:
                why = f"{owner} owns the stream's position on the ring"
            else:
                why = (f"{assignment.primary} was made primary at fence epoch "
                       f"{assignment.fence_epoch} (failover or migration); the ring owner "
                       f"is {owner}")
            explanation = cluster_pb2.RouteExplanation(
                stream=request.stream, exists=True, ring_owner=owner,
                primary=assignment.primary, replicas=assignment.replicas,
                override_claimant=override.claimant if override else "",
                pinned=bool(override and override.pinned),
                fence_epoch=assignment.fence_epoch,
                epoch_start_seq=assignment.epoch_start_seq, reason=why)
        primary = self._cluster.state.members.get(explanation.primary)
        explanation.primary_grpc_address = primary.grpc_address if primary else ""
        return explanation

    @rpc.unary
    async def ListAuthorityOverrides(
        self, request: cluster_pb2.ListAuthorityOverridesRequest, context: Context
    ) -> cluster_pb2.ListAuthorityOverridesResponse:
        with self._cluster.group.read_state() as state:
            entries = [
                cluster_pb2.AuthorityOverrideEntry(
                    stream=name, claimant=s.override.claimant, fence_epoch=s.override.fence_epoch,
                    pinned=s.override.pinned, set_ms=s.override.set_ms)
                for name, s in sorted(state.streams.items()) if s.override is not None]
        return cluster_pb2.ListAuthorityOverridesResponse(overrides=entries)

    @rpc.unary
    async def ClearStreamAuthority(self, request: cluster_pb2.ClearStreamAuthorityRequest,
                                   context: Context) -> cluster_pb2.ClearStreamAuthorityResponse:
        self._require_admin(context, "ClearStreamAuthority")
        subjects.validate_name(request.stream, what="stream")
        result = await self._cluster.propose(raft_pb2.RaftCommand(
            authority_clear_override=raft_pb2.AuthorityClearOverride(stream=request.stream)),
            timeout_s=context.time_remaining())
        return cluster_pb2.ClearStreamAuthorityResponse(cleared=result.changed)

    @rpc.unary
    async def SetStreamPinned(self, request: cluster_pb2.SetStreamPinnedRequest,
                              context: Context) -> cluster_pb2.SetStreamPinnedResponse:
        self._require_admin(context, "SetStreamPinned")
        subjects.validate_name(request.stream, what="stream")
        await self._cluster.propose(raft_pb2.RaftCommand(
            authority_set_pinned=raft_pb2.AuthoritySetPinned(stream=request.stream,
                                                             pinned=request.pinned)),
            timeout_s=context.time_remaining())
        return cluster_pb2.SetStreamPinnedResponse()

    @rpc.unary
    async def GetClusterStreamStats(self, request: cluster_pb2.GetClusterStreamStatsRequest,
                                    context: Context) -> cluster_pb2.ClusterStreamStats:
        with self._cluster.group.read_state() as state:
            members = {m.node_id: m.grpc_address for m in state.members.values()}
            primaries = {name: s.primary for name, s in state.streams.items()}
        replies = await asyncio.gather(*(
            list_node(self._pool, address, timeout_s=min(remaining_s(context), fanout_timeout_s))
            for address in members.values()))
        stats = cluster_pb2.ClusterStreamStats()
        for node_id, infos in zip(members, replies, strict=True):
            mine = [i for i in infos or () if primaries.get(i.config.name) == node_id]
            stats.nodes.add(node_id=node_id, streams=len(mine), reachable=infos is not None,
                            messages=sum(i.state.messages for i in mine),
                            bytes=sum(i.state.bytes for i in mine))
            for info in mine:
                stats.streams.add(stream=info.config.name, primary=node_id,
                                  messages=info.state.messages, bytes=info.state.bytes,
                                  last_seq=info.state.last_seq, consumers=info.state.consumers)
        reachable = [n for n in stats.nodes if n.reachable]
        stats.stream_skew = skew([n.streams for n in reachable])
        stats.bytes_skew = skew([n.bytes for n in reachable])
        return stats

    @rpc.unary
    async def MigrateStream(self, request: cluster_pb2.MigrateStreamRequest,
                            context: Context) -> cluster_pb2.MigrateStreamResponse:
        self._require_admin(context, "MigrateStream")
        subjects.validate_name(request.stream, what="stream")
        subjects.validate_name(request.target, what="node")
        forwarded = await self._on_leader("MigrateStream", request, context)
        if forwarded is not None:
            return forwarded  # type: ignore[no-any-return]
        return await self._placement.migrate(request.stream, request.target, pin=request.pin)

    @rpc.unary
    async def RebalanceStreams(self, request: cluster_pb2.RebalanceStreamsRequest,
                               context: Context) -> cluster_pb2.RebalanceStreamsResponse:
        self._require_admin(context, "RebalanceStreams")
        if not request.steps:
            raise RaftlogError(Reason.INVALID_ARGUMENT, "a rebalance plan needs steps")
        if len(request.steps) > rebalance_steps_max:
            raise RaftlogError(Reason.BATCH_TOO_LARGE,
                               f"a plan has at most {rebalance_steps_max} steps",
                               limit=rebalance_steps_max)
        for step in request.steps:
            subjects.validate_name(step.stream, what="stream")
            subjects.validate_name(step.target, what="node")
        forwarded = await self._on_leader("RebalanceStreams", request, context)
        if forwarded is not None:
            return forwarded  # type: ignore[no-any-return]
        return await self._placement.rebalance(request)

    @rpc.server_stream
    async def WatchStreams(self, request: cluster_pb2.WatchStreamsRequest,
                           context: Context) -> AsyncIterator[cluster_pb2.WatchEvent]:
        queue: asyncio.Queue[cluster_pb2.WatchEvent | None] = asyncio.Queue()
        self._cluster.watchers.add(queue)
        try:
            while True:
                event = await queue.get()
                if event is None:
                    return
                yield event
        finally:
            self._cluster.watchers.discard(queue)
