"""Read-only views of the cluster: its status, why a stream is routed where it is, the
authority overrides, cluster-wide stream stats and the watch of metadata events; and the two
authority changes an operator makes by hand (clear an override, pin a stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections.abc import AsyncIterator

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError
from raftlog.internal import raft_pb2
from raftlog.node.cluster.coordinator import ClusterNode
from raftlog.node.ops.raft_first import RaftMetadata
from raftlog.node.transport.calls import Call
from raftlog.v1 import cluster_pb2

_HEALTH = {
    raft_pb2.MEMBER_STATUS_ALIVE: cluster_pb2.NODE_HEALTH_ALIVE,
    raft_pb2.MEMBER_STATUS_SUSPECT: cluster_pb2.NODE_HEALTH_SUSPECT,
    raft_pb2.MEMBER_STATUS_DEAD: cluster_pb2.NODE_HEALTH_DEAD,
}


def skew(values: list[int]) -> float:
    """max / mean (1.0 = even; 0.0 when there is nothing)."""
    mean = statistics.fmean(values) if values else 0.0
    return max(values) / mean if mean else 0.0


def cluster_status(cluster: ClusterNode) -> cluster_pb2.ClusterStatus:
    group = cluster.group.status()
    connected = {peer.address: peer.connected for peer in group.peers}
    leader = cluster.leader_node_id()
    nodes = []
    with cluster.group.read_state() as state:
        for member in sorted(state.members.values(), key=lambda m: m.node_id):
            held = [s for s in state.streams.values() if member.node_id in s.replicas]
            nodes.append(cluster_pb2.NodeStatus(
                node_id=member.node_id, raft_address=member.raft_address,
                grpc_address=member.grpc_address, peer_address=member.peer_address,
                health=_HEALTH.get(member.status, cluster_pb2.NODE_HEALTH_UNKNOWN),
                raft_leader=member.node_id == leader and bool(leader),
                connected=(member.node_id == cluster.node_id
                           or connected.get(member.raft_address, False)),
                joined_ms=member.joined_ms,
                heard_from=cluster.liveness is None or cluster.liveness.heard_from(member.node_id),
                primaries=sum(1 for s in held if s.primary == member.node_id),
                replicas=len(held)))
    return cluster_pb2.ClusterStatus(
        nodes=nodes, raft_leader=leader, raft_term=group.term,
        commit_index=group.commit_index, applied_index=group.applied_index,
        answered_by=cluster.node_id, caught_up=cluster.caught_up())


class ClusterViews:
    def __init__(self, cluster: ClusterNode, metadata: RaftMetadata) -> None:
        self._cluster = cluster
        self._metadata = metadata

    def status(self) -> cluster_pb2.ClusterStatus:
        return cluster_status(self._cluster)

    async def explain_route(self, request: cluster_pb2.ExplainRouteRequest, via: Call
                            ) -> cluster_pb2.RouteExplanation:
        subjects.validate_name(request.stream, what="stream")
        cluster = self._cluster
        ring = cluster.ring()
        assignment = cluster.state.streams.get(request.stream)
        if assignment is None:  # maybe created a moment ago, not applied here yet: make sure
            with contextlib.suppress(RaftlogError):
                await cluster.propose(raft_pb2.RaftCommand(barrier=raft_pb2.Barrier()),
                                      timeout_s=via.remaining_s())
            assignment = cluster.state.streams.get(request.stream)
        if assignment is None:
            # The replicas it would get if created with `replicas` left at 0.
            placement = ring.place(request.stream,
                                   replicas=min(limits.replicas_default, len(ring)))
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
        primary = cluster.state.members.get(explanation.primary)
        explanation.primary_grpc_address = primary.grpc_address if primary else ""
        return explanation

    def overrides(self) -> cluster_pb2.ListAuthorityOverridesResponse:
        with self._cluster.group.read_state() as state:
            entries = [
                cluster_pb2.AuthorityOverrideEntry(
                    stream=name, claimant=s.override.claimant, fence_epoch=s.override.fence_epoch,
                    pinned=s.override.pinned, set_ms=s.override.set_ms)
                for name, s in sorted(state.streams.items()) if s.override is not None]
        return cluster_pb2.ListAuthorityOverridesResponse(overrides=entries)

    async def clear_authority(self, request: cluster_pb2.ClearStreamAuthorityRequest, via: Call
                              ) -> cluster_pb2.ClearStreamAuthorityResponse:
        subjects.validate_name(request.stream, what="stream")
        result = await self._cluster.propose(raft_pb2.RaftCommand(
            authority_clear_override=raft_pb2.AuthorityClearOverride(stream=request.stream)),
            timeout_s=via.remaining_s())
        return cluster_pb2.ClearStreamAuthorityResponse(cleared=result.changed)

    async def set_pinned(self, request: cluster_pb2.SetStreamPinnedRequest, via: Call
                         ) -> cluster_pb2.SetStreamPinnedResponse:
        subjects.validate_name(request.stream, what="stream")
        await self._cluster.propose(raft_pb2.RaftCommand(
            authority_set_pinned=raft_pb2.AuthoritySetPinned(stream=request.stream,
                                                             pinned=request.pinned)),
            timeout_s=via.remaining_s())
        return cluster_pb2.SetStreamPinnedResponse()

    async def stream_stats(self, via: Call, *, local_only: bool = False
                           ) -> cluster_pb2.ClusterStreamStats:
        """Every member's streams (each member asked at once; one that does not answer is a
        row with reachable=false); with `local_only`, this node's alone, asking no one."""
        with self._cluster.group.read_state() as state:
            members = {m.node_id: m.grpc_address for m in state.members.values()
                       if not local_only or m.node_id == self._cluster.node_id}
            primaries = {name: s.primary for name, s in state.streams.items()}
        replies = await asyncio.gather(*(self._metadata.node_streams(node_id, address, via)
                                         for node_id, address in members.items()))
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

    async def watch(self) -> AsyncIterator[cluster_pb2.WatchEvent]:
        """Metadata events as they are applied here, until the node stops."""
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
