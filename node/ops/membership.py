"""Membership and placement changes: a node joins or leaves, a stream migrates, a rebalance plan
runs. Each is done by the Raft leader; a node that does not lead forwards the canonical request
there (route.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.node.cluster.coordinator import ClusterNode
from raftlog.node.cluster.placement import Placement
from raftlog.node.ops import canonical, route
from raftlog.node.ops.route import ClusterRoute
from raftlog.node.ops.status import cluster_status
from raftlog.node.transport.calls import Call
from raftlog.node.transport.forwarding import Forward
from raftlog.node.transport.peer import PeerClient
from raftlog.raft.addresses import split_address
from raftlog.v1 import cluster_pb2

Resp = TypeVar("Resp")


class Membership:
    def __init__(self, *, cluster: ClusterNode, placement: Placement, peers: PeerClient,
                 where: ClusterRoute) -> None:
        self._cluster = cluster
        self._placement = placement
        self._peers = peers
        self._where = where

    async def _on_leader(self, call: Forward[Resp], request: object, via: Call,
                         local: Callable[[], Awaitable[Resp]]) -> Resp:
        return await route.unary(self._where, self._where.leader(), call, request, via, local)

    async def join(self, request: cluster_pb2.JoinNodeRequest, via: Call
                   ) -> cluster_pb2.ClusterStatus:
        """A learner step before the node counts: it must answer on its peer listener as
        `node_id` with the cluster credential before it joins the Raft group, and the call
        returns once it applied the metadata up to its own registration (or takes it out
        again and fails when it does not catch up in time)."""
        subjects.validate_name(request.node_id, what="node")
        for what, value in (("raft_address", request.raft_address),
                            ("grpc_address", request.grpc_address),
                            ("peer_address", request.peer_address)):
            try:
                split_address(value)
            except RaftlogError:
                raise RaftlogError(Reason.INVALID_ARGUMENT, f"{what} must be host:port, not "
                                   f"{value!r}", field=what) from None
        return await self._on_leader(canonical.JOIN_NODE, request, via,
                                     lambda: self._join_here(request))

    async def _join_here(self, request: cluster_pb2.JoinNodeRequest
                         ) -> cluster_pb2.ClusterStatus:
        state = self._cluster.state
        if request.node_id in state.members:
            raise RaftlogError(Reason.NODE_EXISTS, f"node {request.node_id!r} is a member",
                               node=request.node_id)
        addresses = {request.raft_address, request.grpc_address, request.peer_address}
        if any(addresses & {m.raft_address, m.grpc_address, m.peer_address}
               for m in state.members.values()):
            raise RaftlogError(Reason.NODE_EXISTS, "a member already uses that address")
        await self._peers.challenge(request.peer_address, node_id=request.node_id,
                                    timeout_s=limits.join_probe_timeout_s)
        await self._cluster.group.add_member(request.raft_address,
                                             timeout_s=limits.membership_change_timeout_s)
        result = await self._cluster.propose(raft_pb2.RaftCommand(
            member_join=raft_pb2.MemberJoin(
                node_id=request.node_id, raft_address=request.raft_address,
                grpc_address=request.grpc_address, peer_address=request.peer_address)))
        await self._wait_joined(request, index=result.index)
        return cluster_status(self._cluster)

    async def _wait_joined(self, request: cluster_pb2.JoinNodeRequest, *, index: int) -> None:
        """Until the new member applied `index`; else removes it again and fails."""
        deadline = asyncio.get_running_loop().time() + limits.join_catch_up_s
        while asyncio.get_running_loop().time() < deadline:
            with contextlib.suppress(RaftlogError):
                reply = await self._peers.challenge(request.peer_address,
                                                    node_id=request.node_id,
                                                    timeout_s=limits.join_probe_timeout_s)
                if reply.raft_applied_index >= index:
                    return
            await asyncio.sleep(limits.join_poll_s)
        with contextlib.suppress(RaftlogError):
            await self._cluster.propose(raft_pb2.RaftCommand(
                member_leave=raft_pb2.MemberLeave(node_id=request.node_id)))
        with contextlib.suppress(RaftlogError):
            await self._cluster.group.remove_member(request.raft_address,
                                                    timeout_s=limits.membership_change_timeout_s)
        raise RaftlogError(Reason.NODE_UNREACHABLE, f"{request.node_id!r} did not catch up "
                           f"with the metadata within {limits.join_catch_up_s} s; it was removed "
                           "again", node=request.node_id)

    async def leave(self, request: cluster_pb2.LeaveNodeRequest, via: Call
                    ) -> cluster_pb2.ClusterStatus:
        subjects.validate_name(request.node_id, what="node")
        return await self._on_leader(canonical.LEAVE_NODE, request, via,
                                     lambda: self._leave_here(request, via))

    async def _leave_here(self, request: cluster_pb2.LeaveNodeRequest, via: Call
                          ) -> cluster_pb2.ClusterStatus:
        member = self._cluster.state.members.get(request.node_id)
        if member is None:
            raise RaftlogError(Reason.NODE_NOT_FOUND, f"no member {request.node_id!r}",
                               node=request.node_id)
        if request.node_id == self._cluster.node_id:
            # The leader cannot take itself out of the Raft group: it hands leadership over
            # and the new leader drains and removes it.
            await self._cluster.group.transfer_leadership(
                timeout_s=limits.membership_change_timeout_s)
            leader = self._where.leader()
            if leader is None or self._where.forwarder is None:
                raise RaftlogError(Reason.MEMBERSHIP_CHANGE_IN_PROGRESS, "Raft leadership "
                                   "came back to the leaving node; retry", node=request.node_id)
            return await self._where.forwarder.unary(leader, canonical.LEAVE_NODE, request, via)
        await self._placement.drain(request.node_id)
        await self._cluster.propose(raft_pb2.RaftCommand(
            member_leave=raft_pb2.MemberLeave(node_id=request.node_id)))
        await self._cluster.group.remove_member(member.raft_address,
                                                timeout_s=limits.membership_change_timeout_s)
        return cluster_status(self._cluster)

    async def migrate(self, request: cluster_pb2.MigrateStreamRequest, via: Call
                      ) -> cluster_pb2.MigrateStreamResponse:
        subjects.validate_name(request.stream, what="stream")
        subjects.validate_name(request.target, what="node")
        return await self._on_leader(
            canonical.MIGRATE_STREAM, request, via,
            lambda: self._placement.migrate(request.stream, request.target, pin=request.pin))

    async def rebalance(self, request: cluster_pb2.RebalanceStreamsRequest, via: Call
                        ) -> cluster_pb2.RebalanceStreamsResponse:
        if not request.steps:
            raise RaftlogError(Reason.INVALID_ARGUMENT, "a rebalance plan needs steps")
        if len(request.steps) > limits.rebalance_steps_max:
            raise RaftlogError(Reason.BATCH_TOO_LARGE,
                               f"a plan has at most {limits.rebalance_steps_max} steps",
                               limit=limits.rebalance_steps_max)
        for step in request.steps:
            subjects.validate_name(step.stream, what="stream")
            subjects.validate_name(step.target, what="node")
        return await self._on_leader(canonical.REBALANCE_STREAMS, request, via,
                                     lambda: self._placement.rebalance(request))
