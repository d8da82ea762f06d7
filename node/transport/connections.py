"""How many clients a node serves at once on its client port.

gRPC's `grpc.max_concurrent_streams` bounds the calls of one connection, not the connections.
`ConnectionLimitInterceptor` counts the connections with at least one call open, by the peer
address gRPC reports for a call (`context.peer()`, one per TCP connection): a call from a
connection already counted always goes on; a call from a new one, when `connections_max`
connections have calls open, is refused with RESOURCE_EXHAUSTED / TOO_MANY_CONNECTIONS and a
retry hint before its handler runs. A connection stops counting when its last call ends,
however it ends. An idle connection costs a node little and is not counted.

Installed inside the malformed-request guard, which hands it only async behaviours.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.transport import rpc

Context = grpc.aio.ServicerContext[Any, Any]


class ConnectionCounts:
    """Open calls per peer, with a ceiling on the peers; single-threaded (the event loop)."""

    def __init__(self, connections_max: int) -> None:
        """`connections_max` > 0 (0 would refuse everything: callers install no limit)."""
        if connections_max <= 0:
            raise ValueError("connections_max must be positive")
        self.connections_max = connections_max
        self.calls_by_peer: dict[str, int] = {}

    def enter(self, peer: str) -> None:
        """Counts one more call of `peer`, or raises TOO_MANY_CONNECTIONS."""
        open_calls = self.calls_by_peer.get(peer, 0)
        if not open_calls and len(self.calls_by_peer) >= self.connections_max:
            raise RaftlogError(
                Reason.TOO_MANY_CONNECTIONS,
                f"this node serves {len(self.calls_by_peer)} connections, its limit; retry "
                "later or through another node", limit=self.connections_max,
                retry_after_ms=limits.connections_retry_after_ms)
        self.calls_by_peer[peer] = open_calls + 1

    def leave(self, peer: str) -> None:
        left = self.calls_by_peer.get(peer, 0) - 1
        if left > 0:
            self.calls_by_peer[peer] = left
        else:
            self.calls_by_peer.pop(peer, None)


class ConnectionLimitInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, counts: ConnectionCounts) -> None:
        self.counts = counts

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler: Any = await continuation(details)
        if handler is None:
            return None
        shapes = ((handler.unary_unary, grpc.unary_unary_rpc_method_handler),
                  (handler.unary_stream, grpc.unary_stream_rpc_method_handler),
                  (handler.stream_unary, grpc.stream_unary_rpc_method_handler),
                  (handler.stream_stream, grpc.stream_stream_rpc_method_handler))
        for behaviour, make in shapes:
            if behaviour is None:
                continue
            counted: Callable[..., Any]
            if inspect.isasyncgenfunction(behaviour):
                counted = self._streaming(behaviour)
            elif inspect.iscoroutinefunction(behaviour):
                counted = self._unary(behaviour)
            else:
                return handler
            return make(counted, request_deserializer=handler.request_deserializer,
                        response_serializer=handler.response_serializer)
        return handler

    def _unary(self, behaviour: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counted(request: Any, context: Context) -> Any:
            peer = context.peer()
            try:
                self.counts.enter(peer)
            except RaftlogError as err:
                await rpc.abort(context, err)
            try:
                return await behaviour(request, context)
            finally:
                self.counts.leave(peer)

        return counted

    def _streaming(self, behaviour: Callable[..., AsyncGenerator[Any, None]]
                   ) -> Callable[..., AsyncIterator[Any]]:
        async def counted(request: Any, context: Context) -> AsyncIterator[Any]:
            peer = context.peer()
            try:
                self.counts.enter(peer)
            except RaftlogError as err:
                await rpc.abort(context, err)
            try:
                async with contextlib.aclosing(behaviour(request, context)) as responses:
                    async for response in responses:
                        yield response
            finally:
                self.counts.leave(peer)

        return counted
