"""What one user may hold open on a node at once: connections and Subscribe calls
(docs/quotas.md).

A user's `max_connections` counts the client connections (by the peer address gRPC reports for
a call, one per TCP connection, as connections.py counts them node-wide) that have a call of the
user open; `max_subscriptions` counts the user's open calls of the subscription methods. A call
that would take the user past either is refused with RESOURCE_EXHAUSTED / QUOTA_EXCEEDED and a
retry hint before its handler runs; what it held comes back when it ends, however it ends.

Counted on the node the call reached: a call another node forwarded (its identity says so) was
counted there, and calls of SYSTEM (auth off, the cluster credential) are not counted. So a user
may hold its quota on each node, as its publish rates (node/ops/quotas.py).

`UserLimitInterceptor` goes after the AuthInterceptor in the server's list, so that its wrapper
runs inside the one that settles the identity (auth.current()).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.transport import auth, rpc


@dataclass
class _Held:
    calls_by_peer: dict[str, int] = field(default_factory=dict)
    subscriptions: int = 0


class UserSessions:
    """Open calls per user and connection, and open subscriptions per user; single-threaded
    (the event loop)."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}

    def connections(self, user: str) -> int:
        held = self._held.get(user)
        return len(held.calls_by_peer) if held else 0

    def subscriptions(self, user: str) -> int:
        held = self._held.get(user)
        return held.subscriptions if held else 0

    def take(self, identity: auth.Identity, *, peer: str, subscription: bool
             ) -> Callable[[], None]:
        """Holds one call of `identity` from `peer` and answers what gives it back (call it
        once, when the call ends), or raises QUOTA_EXCEEDED holding nothing."""
        if identity.rules is None or identity.forwarded or not (
                identity.max_connections or identity.max_subscriptions):
            return _nothing
        self._take(identity, peer, subscription)
        return functools.partial(self._give_back, identity.name, peer, subscription)

    def _take(self, identity: auth.Identity, peer: str, subscription: bool) -> None:
        held = self._held.setdefault(identity.name, _Held())
        new_connection = peer not in held.calls_by_peer
        if new_connection and identity.max_connections \
                and len(held.calls_by_peer) >= identity.max_connections:
            self._forget_if_idle(identity.name)
            raise _exceeded(identity.name, "connections", identity.max_connections,
                            limits.connections_retry_after_ms)
        if subscription and identity.max_subscriptions \
                and held.subscriptions >= identity.max_subscriptions:
            self._forget_if_idle(identity.name)
            raise _exceeded(identity.name, "subscriptions", identity.max_subscriptions,
                            limits.subscriptions_retry_after_ms)
        held.calls_by_peer[peer] = held.calls_by_peer.get(peer, 0) + 1
        held.subscriptions += subscription

    def _give_back(self, user: str, peer: str, subscription: bool) -> None:
        held = self._held.get(user)
        if held is None:
            return
        left = held.calls_by_peer.get(peer, 0) - 1
        if left > 0:
            held.calls_by_peer[peer] = left
        else:
            held.calls_by_peer.pop(peer, None)
        held.subscriptions -= subscription
        self._forget_if_idle(user)

    def _forget_if_idle(self, user: str) -> None:
        held = self._held.get(user)
        if held is not None and not held.calls_by_peer:
            del self._held[user]


def _nothing() -> None:
    return None


def _exceeded(user: str, measure: str, limit: int, retry_after_ms: int) -> RaftlogError:
    return RaftlogError(
        Reason.QUOTA_EXCEEDED,
        f"user {user!r} holds {limit} {measure} on this node, its quota; end one, or retry "
        "later", user=user, measure=measure, limit=limit, retry_after_ms=retry_after_ms)


class UserLimitInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, sessions: UserSessions, *, subscription_methods: frozenset[str]) -> None:
        self.sessions = sessions
        self._subscription_methods = subscription_methods

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler: Any = await continuation(details)
        if handler is None:
            return None
        subscription = str(details.method) in self._subscription_methods
        wrap = {"unary_unary": (self._unary, grpc.unary_unary_rpc_method_handler),
                "stream_unary": (self._unary, grpc.stream_unary_rpc_method_handler),
                "unary_stream": (self._streaming, grpc.unary_stream_rpc_method_handler),
                "stream_stream": (self._streaming, grpc.stream_stream_rpc_method_handler)}
        for kind, (wrapper, make) in wrap.items():
            behaviour = getattr(handler, kind)
            if behaviour is not None:
                return make(wrapper(behaviour, subscription),
                            request_deserializer=handler.request_deserializer,
                            response_serializer=handler.response_serializer)
        return handler

    def _unary(self, behaviour: Callable[..., Any], subscription: bool
               ) -> Callable[..., Awaitable[Any]]:
        async def held(request: Any, context: Any) -> Any:
            try:
                give_back = self.sessions.take(auth.current(), peer=context.peer(),
                                               subscription=subscription)
            except RaftlogError as err:
                await rpc.abort(context, err)
            try:
                result = behaviour(request, context)
                return await result if hasattr(result, "__await__") else result
            finally:
                give_back()

        return held

    def _streaming(self, behaviour: Callable[..., Any], subscription: bool
                   ) -> Callable[..., AsyncIterator[Any]]:
        async def held(request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                give_back = self.sessions.take(auth.current(), peer=context.peer(),
                                               subscription=subscription)
            except RaftlogError as err:
                await rpc.abort(context, err)
            try:
                responses = behaviour(request, context)
                try:
                    async for response in responses:
                        yield response
                finally:
                    close = getattr(responses, "aclose", None)
                    if close is not None:
                        await close()
            finally:
                give_back()

        return held
