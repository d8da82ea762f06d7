"""The admin `Cluster` service: status, membership changes, route explanations, authority
overrides, cluster-wide stream stats, the watch stream, the audit export and the audit's
consumer repair, each handed to the operations (node/ops). Calls that change membership,
placement or a consumer's committed state, and the audit export, need the cluster credential
first."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops.operations import ClusterOperations
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.node.transport.credentials import ADMIN_TOKEN_HEADER, Credential
from raftlog.v1 import cluster_pb2, cluster_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]
_SERVICE_PREFIX = "/" + cluster_pb2.DESCRIPTOR.services_by_name["Cluster"].full_name + "/"
# The calls that change membership, placement or a consumer's committed state, and the audit
# export (it hands out every stored record): they need the cluster credential.
ADMIN_METHODS = frozenset({"JoinNode", "LeaveNode", "MigrateStream", "RebalanceStreams",
                           "ClearStreamAuthority", "SetStreamPinned", "ExportAudit",
                           "SetConsumerState"})


def admin_metadata(credential: Credential, method: str) -> tuple[tuple[str, str], ...]:
    """Call metadata that authorizes one admin call of `method` (e.g. "JoinNode")."""
    path = f"{_SERVICE_PREFIX}{method}"
    return ((ADMIN_TOKEN_HEADER, credential.token(principal="admin", method=path)),)


class ClusterService(cluster_pb2_grpc.ClusterServicer):
    """Calls that change membership or placement need the cluster credential (an admin
    token in metadata, `admin_metadata`); the others are open to every client."""

    def __init__(self, ops: ClusterOperations, credential: Credential) -> None:
        self._membership = ops.membership
        self._views = ops.views
        self._audit = ops.audit
        self._consumer_state = ops.consumer_state
        self._credential = credential

    def _require_admin(self, context: Context, method: str) -> None:
        token = ""
        for key, value in context.invocation_metadata() or ():
            if key == ADMIN_TOKEN_HEADER:
                token = value if isinstance(value, str) else bytes(value).decode("replace")
        try:
            self._credential.verify(token, method=f"{_SERVICE_PREFIX}{method}")
        except RaftlogError as err:
            raise RaftlogError(Reason.UNAUTHENTICATED, f"{method} needs the cluster credential: "
                               f"{err.message} (give the CLI --secret-file FILE or set "
                               "RAFTLOG_SECRET_FILE)", method=method) from None

    @rpc.unary
    async def GetClusterStatus(self, request: cluster_pb2.GetClusterStatusRequest,
                               context: Context) -> cluster_pb2.ClusterStatus:
        return self._views.status()

    @rpc.unary
    async def JoinNode(self, request: cluster_pb2.JoinNodeRequest,
                       context: Context) -> cluster_pb2.ClusterStatus:
        self._require_admin(context, "JoinNode")
        return await self._membership.join(request, Call.from_grpc(context))

    @rpc.unary
    async def LeaveNode(self, request: cluster_pb2.LeaveNodeRequest,
                        context: Context) -> cluster_pb2.ClusterStatus:
        self._require_admin(context, "LeaveNode")
        return await self._membership.leave(request, Call.from_grpc(context))

    @rpc.unary
    async def ExplainRoute(self, request: cluster_pb2.ExplainRouteRequest,
                           context: Context) -> cluster_pb2.RouteExplanation:
        return await self._views.explain_route(request, Call.from_grpc(context))

    @rpc.unary
    async def ListAuthorityOverrides(
        self, request: cluster_pb2.ListAuthorityOverridesRequest, context: Context
    ) -> cluster_pb2.ListAuthorityOverridesResponse:
        return self._views.overrides()

    @rpc.unary
    async def ClearStreamAuthority(self, request: cluster_pb2.ClearStreamAuthorityRequest,
                                   context: Context) -> cluster_pb2.ClearStreamAuthorityResponse:
        self._require_admin(context, "ClearStreamAuthority")
        return await self._views.clear_authority(request, Call.from_grpc(context))

    @rpc.unary
    async def SetStreamPinned(self, request: cluster_pb2.SetStreamPinnedRequest,
                              context: Context) -> cluster_pb2.SetStreamPinnedResponse:
        self._require_admin(context, "SetStreamPinned")
        return await self._views.set_pinned(request, Call.from_grpc(context))

    @rpc.unary
    async def GetClusterStreamStats(self, request: cluster_pb2.GetClusterStreamStatsRequest,
                                    context: Context) -> cluster_pb2.ClusterStreamStats:
        return await self._views.stream_stats(Call.from_grpc(context))

    @rpc.unary
    async def MigrateStream(self, request: cluster_pb2.MigrateStreamRequest,
                            context: Context) -> cluster_pb2.MigrateStreamResponse:
        self._require_admin(context, "MigrateStream")
        return await self._membership.migrate(request, Call.from_grpc(context))

    @rpc.unary
    async def RebalanceStreams(self, request: cluster_pb2.RebalanceStreamsRequest,
                               context: Context) -> cluster_pb2.RebalanceStreamsResponse:
        self._require_admin(context, "RebalanceStreams")
        return await self._membership.rebalance(request, Call.from_grpc(context))

    @rpc.server_stream
    async def WatchStreams(self, request: cluster_pb2.WatchStreamsRequest,
                           context: Context) -> AsyncIterator[cluster_pb2.WatchEvent]:
        async for event in self._views.watch():
            yield event

    @rpc.unary
    async def SetConsumerState(self, request: cluster_pb2.SetConsumerStateRequest,
                               context: Context) -> cluster_pb2.SetConsumerStateResponse:
        self._require_admin(context, "SetConsumerState")
        return await self._consumer_state.set_state(request, Call.from_grpc(context))

    @rpc.server_stream
    async def ExportAudit(self, request: cluster_pb2.ExportAuditRequest,
                          context: Context) -> AsyncIterator[cluster_pb2.ExportAuditChunk]:
        self._require_admin(context, "ExportAudit")
        async for chunk in self._audit.export(request):
            yield chunk
