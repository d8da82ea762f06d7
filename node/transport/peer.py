"""Node-to-node calls: the peer listener's gate and the client every node uses to reach the
others' peer listeners.

- `PeerAuthInterceptor` (server side): every call on the peer listener must carry a token signed
  with the cluster credential (`credentials.PEER_TOKEN_HEADER`, bound to the method); anything
  else ends UNAUTHENTICATED, before the handler runs, so it changes nothing.
- `PeerClient` (client side): channels to the members' peer addresses (gRPC keepalive on, so a
  silently dropped connection is noticed within `limits.peer_keepalive_*`), a fresh token per
  call, and one method per internal call the node makes.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import replication_pb2, replication_pb2_grpc
from raftlog.node.transport import rpc
from raftlog.node.transport.channels import ChannelPool
from raftlog.node.transport.credentials import PEER_TOKEN_HEADER, Credential
from raftlog.node.transport.feeding import feed

Context = grpc.aio.ServicerContext[Any, Any]


def peer_server_options() -> list[tuple[str, Any]]:
    """The peer listener's options: accept the keepalive pings of `peer_channel_options`
    (gRPC refuses pings more frequent than its default of 5 min without data otherwise, and
    closes the connection)."""
    return [
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms",
         limits.peer_keepalive_time_ms // 2),
        ("grpc.http2.max_ping_strikes", 0),
    ]


def peer_channel_options() -> list[tuple[str, Any]]:
    """A peer channel's options: keepalive pings on an idle connection, and a short
    reconnect backoff (a peer that refused may only be starting)."""
    return [
        ("grpc.max_reconnect_backoff_ms", limits.peer_reconnect_backoff_ms_max),
        ("grpc.keepalive_time_ms", limits.peer_keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", limits.peer_keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


_PREFIX = "/" + replication_pb2.DESCRIPTOR.services_by_name["Replication"].full_name + "/"
METHOD_PING = _PREFIX + "Ping"
METHOD_REPLICATE = _PREFIX + "Replicate"
METHOD_REPLICA_STATE = _PREFIX + "GetReplicaState"
METHOD_READ_LOCAL = _PREFIX + "ReadLocal"
METHOD_SURVEY = _PREFIX + "Survey"


def _token(metadata: Any) -> str:
    for key, value in metadata or ():
        if key == PEER_TOKEN_HEADER:
            return value if isinstance(value, str) else bytes(value).decode(errors="replace")
    return ""


class PeerAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses every call without a valid peer token (UNAUTHENTICATED, with ErrorInfo)."""

    def __init__(self, credential: Credential) -> None:
        self._credential = credential
        self.refused = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        method: str = details.method  # type: ignore[attr-defined]
        try:
            self._credential.verify(_token(details.invocation_metadata),  # type: ignore[attr-defined]
                                    method=method)
        except RaftlogError as err:
            self.refused += 1
            handler: Any = await continuation(details)
            return None if handler is None else _refusing(handler, err)
        return await continuation(details)


def _refusing(handler: Any, err: RaftlogError) -> Any:
    """A handler of the same shape as `handler` that only ends the call with `err`."""

    async def refuse(request: Any, context: Context) -> Any:
        await rpc.abort(context, err)

    async def refuse_stream(request: Any, context: Context) -> AsyncIterator[Any]:
        await rpc.abort(context, err)
        yield  # pragma: no cover - makes this an async generator

    shapes = (
        (handler.unary_unary, grpc.unary_unary_rpc_method_handler, refuse),
        (handler.unary_stream, grpc.unary_stream_rpc_method_handler, refuse_stream),
        (handler.stream_unary, grpc.stream_unary_rpc_method_handler, refuse),
        (handler.stream_stream, grpc.stream_stream_rpc_method_handler, refuse_stream),
    )
    for present, make, behaviour in shapes:
        if present is not None:
            return make(behaviour, request_deserializer=None, response_serializer=None)
    raise RaftlogError(Reason.INTERNAL, "a handler of no known shape")


class PeerClient:
    """Calls to other members' peer listeners, signed as this node."""

    def __init__(self, *, node_id: str, credential: Credential,
                 address_of: Callable[[str], str],
                 dial: Callable[[str], str] | None = None,
                 tls: Callable[[], grpc.ChannelCredentials] | None = None) -> None:
        """`address_of(node_id)` is a member's peer address (raises RaftlogError when the
        member is unknown); `dial` and `tls` (the channels' TLS credentials, None for
        plaintext) as ChannelPool's `dial` and `credentials`."""
        self.node_id = node_id
        self._credential = credential
        self._address_of = address_of
        self.pool = ChannelPool(options=peer_channel_options(), dial=dial, credentials=tls)

    def metadata(self, method: str) -> tuple[tuple[str, str], ...]:
        return ((PEER_TOKEN_HEADER, self._credential.token(principal=self.node_id,
                                                            method=method)),)

    def stub(self, node_id: str) -> Any:
        # Generated *_pb2_grpc stubs are untyped to mypy; requests and responses are typed.
        return replication_pb2_grpc.ReplicationStub(  # type: ignore[no-untyped-call]
            self.pool.get(self._address_of(node_id)))

    async def ping(self, node_id: str, *, timeout_s: float) -> replication_pb2.PingReply:
        reply: replication_pb2.PingReply = await self.stub(node_id).Ping(
            replication_pb2.PingRequest(from_node=self.node_id), timeout=timeout_s,
            metadata=self.metadata(METHOD_PING))
        return reply

    async def challenge(self, address: str, *, node_id: str, timeout_s: float
                        ) -> replication_pb2.PingReply:
        """Pings a node that is not a member yet (at its peer address); raises
        NODE_UNREACHABLE unless it answers as `node_id` and proves it holds the secret."""
        nonce = secrets.token_hex(16)
        stub: Any = replication_pb2_grpc.ReplicationStub(  # type: ignore[no-untyped-call]
            self.pool.get(address))
        try:
            reply: replication_pb2.PingReply = await stub.Ping(
                replication_pb2.PingRequest(from_node=self.node_id, nonce=nonce),
                timeout=timeout_s, metadata=self.metadata(METHOD_PING))
        except grpc.aio.AioRpcError as err:
            raise RaftlogError(Reason.NODE_UNREACHABLE, f"{node_id!r} does not answer on its "
                               f"peer listener {address}: {err.code().name} {err.details()}; "
                               "start it first, with the cluster secret", node=node_id,
                               address=address) from None
        if reply.node_id != node_id:
            raise RaftlogError(Reason.NODE_UNREACHABLE, f"the node at {address} is "
                               f"{reply.node_id!r}, not {node_id!r}", node=node_id,
                               address=address)
        if not self._credential.check_proof(reply.proof, nonce=nonce, principal=node_id):
            raise RaftlogError(Reason.NODE_UNREACHABLE, f"{node_id!r} at {address} does not "
                               "hold this cluster's secret", node=node_id, address=address)
        return reply

    async def replica_state(self, node_id: str, stream: str, *, fence_epoch: int = 0,
                            timeout_s: float) -> replication_pb2.ReplicaState:
        state: replication_pb2.ReplicaState = await self.stub(node_id).GetReplicaState(
            replication_pb2.GetReplicaStateRequest(stream=stream, fence_epoch=fence_epoch),
            timeout=timeout_s, metadata=self.metadata(METHOD_REPLICA_STATE))
        return state

    async def survey(self, node_id: str, items: list[replication_pb2.SurveyItem], *,
                     timeout_s: float) -> replication_pb2.SurveyReply:
        reply: replication_pb2.SurveyReply = await self.stub(node_id).Survey(
            replication_pb2.SurveyRequest(streams=items), timeout=timeout_s,
            metadata=self.metadata(METHOD_SURVEY))
        return reply

    def replicate(self, node_id: str,
                  requests: AsyncIterator[replication_pb2.ReplicateRequest]) -> Any:
        """The long-lived Replicate call (iterate it for acks; cancel() ends it). `requests`
        is drained by feeding.feed: closed as soon as the call ends, however it ends."""
        call = self.stub(node_id).Replicate(metadata=self.metadata(METHOD_REPLICATE))
        feed(call, requests, name=f"replicate-to-{node_id}")
        return call

    async def close(self) -> None:
        await self.pool.close()
