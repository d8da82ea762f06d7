"""The cluster RPCs of the Waymaker API (MigrateStream, RebalanceStreams, the authority
overrides, pinning, cluster stats and WatchStreams), mixed into WaymakerService (waymaker.py).

They answer UNIMPLEMENTED on a node that runs alone. The calls that change placement need the
cluster credential, as on raftlog.v1: a token for this service's method path in the
`raftlog-admin-token` metadata, exchanged for a token of raftlog.v1's method when the call is
forwarded.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import grpc

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.compat import waymaker_streams_pb2 as wm
from raftlog.node.api import waymaker_convert as convert
from raftlog.node.api import waymaker_ids as ids
from raftlog.node.api.cluster import admin_metadata
from raftlog.node.api.waymaker_answer import answered
from raftlog.node.api.waymaker_codes import OK, Family, result_code
from raftlog.node.ops.operations import ClusterOperations
from raftlog.node.ops.streams import StreamOps
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.node.transport.credentials import ADMIN_TOKEN_HEADER, Credential
from raftlog.v1 import cluster_pb2, streams_pb2, types_pb2

Context = grpc.aio.ServicerContext[Any, Any]
log = logging.getLogger(__name__)
_SERVICE_PREFIX = f"/{wm.DESCRIPTOR.services_by_name['WaymakerStreamsService'].full_name}/"


class ClusterRpcs:
    """The cluster half of WaymakerService; the service sets these in its __init__."""

    _cluster: ClusterOperations | None
    _credential: Credential | None
    _moves: set[asyncio.Task[Any]]  # rebalance steps past their step timeout
    _streams: StreamOps

    async def _settled_info(self, name: str, via: Call) -> types_pb2.StreamInfo:
        """The stream's info once its (new) primary serves reads: it does after its first lease,
        a moment after a move; UNAVAILABLE until then, tried for up to
        limits.waymaker_settle_wait_ms."""
        deadline = time.monotonic() + limits.waymaker_settle_wait_ms / 1000
        while True:
            try:
                return await self._streams.info(streams_pb2.GetStreamInfoRequest(name=name), via)
            except RaftlogError as err:
                if err.status_name != "UNAVAILABLE" or time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(limits.waymaker_settle_poll_ms / 1000)

    async def _on_cluster(self, context: Context, method: str) -> ClusterOperations:
        if self._cluster is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                f"{method} needs a cluster; this node runs alone")
            raise AssertionError("unreachable: abort raises")
        return self._cluster

    def _admin_call(self, context: Context, method: str, *, canonical: str = "") -> Call:
        """The call, once its admin token for `method` checks out; its metadata then carries a
        token for raftlog.v1's `canonical` method instead, for the node it is forwarded to."""
        token = ""
        for key, value in context.invocation_metadata() or ():
            if key == ADMIN_TOKEN_HEADER:
                token = value if isinstance(value, str) else bytes(value).decode("replace")
        if self._credential is None:
            raise RaftlogError(Reason.UNAUTHENTICATED, f"{method} needs a cluster credential")
        try:
            self._credential.verify(token, method=f"{_SERVICE_PREFIX}{method}")
        except RaftlogError as err:
            raise RaftlogError(Reason.UNAUTHENTICATED, f"{method} needs the cluster credential: "
                               f"{err.message} (send a token for {_SERVICE_PREFIX}{method} in "
                               f"the {ADMIN_TOKEN_HEADER} metadata)", method=method) from None
        via = Call.from_grpc(context)
        if not canonical:
            return via
        kept = tuple(item for item in via.metadata if item[0] != ADMIN_TOKEN_HEADER)
        return replace(via, metadata=(*kept, *admin_metadata(self._credential, canonical)))

    def _node_id(self, cluster: ClusterOperations) -> str:
        return cluster.views.status().answered_by

    # ------------------------------------------------------------------ cluster

    @answered(wm.MigrateStreamResponse, Family.MIGRATE)
    async def MigrateStream(self, request: wm.MigrateStreamRequest,
                            context: Context) -> wm.MigrateStreamResponse:
        cluster = await self._on_cluster(context, "MigrateStream")
        via = self._admin_call(context, "MigrateStream", canonical="MigrateStream")
        if ids.from_wire(request.source_node_id, _members(cluster)) is None:
            raise RaftlogError(Reason.NODE_NOT_FOUND, f"source_node_id {request.source_node_id}"
                               " is not a member of the cluster",
                               node=request.source_node_id)
        here = self._node_id(cluster)
        moved = await cluster.membership.migrate(
            cluster_pb2.MigrateStreamRequest(stream=request.name, target=here), via)
        if moved.from_node == here:
            return wm.MigrateStreamResponse(
                success=False, result_code="already_exists",
                message=f"stream {request.name!r} is already led by this node ({here})")
        info = await self._settled_info(request.name, via)
        return wm.MigrateStreamResponse(total_bytes=info.state.bytes,
                                        stream_last_seq=info.state.last_seq,
                                        message=moved.outcome)

    @answered(wm.RebalanceStreamsResponse, Family.MIGRATE)
    async def RebalanceStreams(self, request: wm.RebalanceStreamsRequest,
                               context: Context) -> wm.RebalanceStreamsResponse:
        cluster = await self._on_cluster(context, "RebalanceStreams")
        via = self._admin_call(context, "RebalanceStreams", canonical="MigrateStream")
        if not request.plan:
            return wm.RebalanceStreamsResponse(success=False, result_code="no_plan",
                                               message="the plan has no steps")
        if len(request.plan) > limits.rebalance_steps_max:
            raise RaftlogError(Reason.INVALID_ARGUMENT, f"a plan has at most "
                               f"{limits.rebalance_steps_max} steps",
                               limit=limits.rebalance_steps_max)
        step_s = (request.per_step_timeout_ms
                  or limits.waymaker_rebalance_step_timeout_ms_default) / 1000
        steps = [await self._rebalance_step(cluster, entry, via, timeout_s=step_s)
                 for entry in request.plan]
        failed = sum(1 for step in steps if not step.success)
        reply = wm.RebalanceStreamsResponse(steps=steps)
        if failed:
            return wm.RebalanceStreamsResponse(
                success=False, result_code="partial", steps=steps,
                message=f"{failed} of {len(steps)} steps failed")
        return reply

    async def _rebalance_step(self, cluster: ClusterOperations, entry: wm.RebalancePlanEntry,
                              via: Call, *, timeout_s: float) -> wm.RebalanceStepOutcome:
        outcome = wm.RebalanceStepOutcome(name=entry.name, target_node_id=entry.target_node_id)
        target = ids.from_wire(entry.target_node_id, _members(cluster))
        try:
            if target is None:
                raise RaftlogError(Reason.NODE_NOT_FOUND, f"target_node_id "
                                   f"{entry.target_node_id} is not a member of the cluster")
            # The move runs in a task of its own that a step past its timeout stops waiting
            # for, never cancels: so "the move goes on" holds even for a timeout shorter than
            # the hop to the Raft leader, which then runs the move to its end (placement.py).
            move = asyncio.ensure_future(cluster.membership.migrate(
                cluster_pb2.MigrateStreamRequest(stream=entry.name, target=target), via))
            self._moves.add(move)
            move.add_done_callback(_forget_move(self._moves))
            moved = await asyncio.wait_for(asyncio.shield(move), timeout_s)
        except (RaftlogError, TimeoutError) as err:
            if isinstance(err, TimeoutError):
                err = RaftlogError(Reason.TIMEOUT, f"the step did not finish within "
                                   f"{timeout_s * 1000:.0f} ms; the move goes on")
            # Out of time or without a code of its own (retryable): "internal", with the text.
            outcome.result_code = result_code(Family.MIGRATE, err.reason) or "internal"
            outcome.message = err.message
            return outcome
        outcome.success = True
        outcome.result_code = "skipped_same_node" if moved.from_node == target else OK
        outcome.message = moved.outcome
        return outcome

    @answered(wm.ClearStreamAuthorityResponse, Family.CLUSTER)
    async def ClearStreamAuthority(self, request: wm.ClearStreamAuthorityRequest,
                                   context: Context) -> wm.ClearStreamAuthorityResponse:
        cluster = await self._on_cluster(context, "ClearStreamAuthority")
        via = self._admin_call(context, "ClearStreamAuthority")
        cleared = await cluster.views.clear_authority(
            cluster_pb2.ClearStreamAuthorityRequest(stream=request.stream), via)
        return wm.ClearStreamAuthorityResponse(
            message="" if cleared.cleared else "the stream had no override")

    @answered(wm.ListStreamAuthorityOverridesResponse, Family.CLUSTER)
    async def ListStreamAuthorityOverrides(
        self, request: wm.ListStreamAuthorityOverridesRequest, context: Context
    ) -> wm.ListStreamAuthorityOverridesResponse:
        cluster = await self._on_cluster(context, "ListStreamAuthorityOverrides")
        return wm.ListStreamAuthorityOverridesResponse(entries=[
            wm.AuthorityOverrideEntry(stream=entry.stream,
                                      claimant_node_id=ids.to_wire(entry.claimant),
                                      fence_epoch=entry.fence_epoch)
            for entry in cluster.views.overrides().overrides])

    @answered(wm.SetStreamPinnedResponse, Family.CLUSTER)
    async def SetStreamPinned(self, request: wm.SetStreamPinnedRequest,
                              context: Context) -> wm.SetStreamPinnedResponse:
        cluster = await self._on_cluster(context, "SetStreamPinned")
        via = self._admin_call(context, "SetStreamPinned")
        await cluster.views.set_pinned(cluster_pb2.SetStreamPinnedRequest(
            stream=request.stream, pinned=request.pinned), via)
        return wm.SetStreamPinnedResponse()

    @answered(wm.GetClusterStreamStatsResponse, Family.CLUSTER)
    async def GetClusterStreamStats(self, request: wm.GetClusterStreamStatsRequest,
                                    context: Context) -> wm.GetClusterStreamStatsResponse:
        cluster = await self._on_cluster(context, "GetClusterStreamStats")
        stats = await cluster.views.stream_stats(Call.from_grpc(context),
                                                 local_only=request.local_only)
        here = self._node_id(cluster) if request.local_only else ""
        return convert_stats(stats, include_per_stream=request.include_per_stream,
                             only_node=here)

    @rpc.server_stream
    async def WatchStreams(self, request: wm.WatchStreamsRequest,
                           context: Context) -> AsyncIterator[wm.WatchEvent]:
        cluster = await self._on_cluster(context, "WatchStreams")
        watch = LaggingWatch(cluster.views.watch(), node_id=self._node_id(cluster))
        async for event in watch.events():
            yield event


def _members(cluster: ClusterOperations) -> list[str]:
    return [node.node_id for node in cluster.views.status().nodes]


def convert_stats(stats: cluster_pb2.ClusterStreamStats, *, include_per_stream: bool,
                  only_node: str = "") -> wm.GetClusterStreamStatsResponse:
    """Per-node rows (status "ok" or "unreachable"), totals and the spread (max - min) over
    the nodes that answered; `only_node` keeps that node's figures alone."""
    nodes = [n for n in stats.nodes if not only_node or n.node_id == only_node]
    reply = wm.GetClusterStreamStatsResponse(nodes=[
        wm.PerNodeSummary(node_id=ids.to_wire(n.node_id), stream_count=n.streams,
                          total_msg_count=n.messages, total_bytes=n.bytes,
                          status="ok" if n.reachable else "unreachable") for n in nodes])
    if include_per_stream:
        reply.streams.extend(
            wm.PerStreamStats(name=s.stream, owner_node_id=ids.to_wire(s.primary),
                              msg_count=s.messages, bytes=s.bytes, last_seq=s.last_seq)
            for s in stats.streams if not only_node or s.primary == only_node)
    answering = [n for n in nodes if n.reachable]
    reply.total_stream_count = sum(n.streams for n in answering)
    reply.total_msg_count = sum(n.messages for n in answering)
    reply.total_bytes = sum(n.bytes for n in answering)
    if answering:
        reply.skew_count = max(n.streams for n in answering) - min(n.streams for n in answering)
        reply.skew_bytes = max(n.bytes for n in answering) - min(n.bytes for n in answering)
    return reply


class LaggingWatch:
    """Relays raftlog's watch events as Waymaker ones. Events wait in a buffer of
    limits.waymaker_watch_buffer_max while the watcher reads slower than they come; past that
    the oldest are dropped and the next event sent carries how many (`lagged_count`)."""

    def __init__(self, source: AsyncIterator[cluster_pb2.WatchEvent], *, node_id: str) -> None:
        self._source = source
        self._node_id = node_id
        self._buffer: collections.deque[wm.WatchEvent] = collections.deque()
        self._lagged = 0
        self._wake = asyncio.Event()

    async def _pump(self) -> None:
        try:
            async for event in self._source:
                converted = convert.watch_event_out(event, node_id=self._node_id)
                if converted is None:
                    continue
                if len(self._buffer) >= limits.waymaker_watch_buffer_max:
                    self._buffer.popleft()
                    self._lagged += 1
                self._buffer.append(converted)
                self._wake.set()
        finally:
            self._wake.set()

    async def events(self) -> AsyncIterator[wm.WatchEvent]:
        pump = asyncio.get_running_loop().create_task(self._pump(), name="waymaker-watch")
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._buffer:
                    event = self._buffer.popleft()
                    if self._lagged:
                        event.lagged_count, self._lagged = self._lagged, 0
                    yield event
                if pump.done():
                    pump.result()  # its failure, if any
                    return
        finally:
            pump.cancel()


def _forget_move(moves: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    """Drops a finished move and retrieves its outcome (a move nobody waits for any more may
    still fail; that is logged, not left as an unretrieved task exception)."""
    def done(move: asyncio.Task[Any]) -> None:
        moves.discard(move)
        if not move.cancelled() and move.exception() is not None:
            log.info("a rebalance move past its step timeout ended with: %s", move.exception())
    return done
