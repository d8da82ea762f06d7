"""How many long-lived Subscribe calls a node holds at once.

`SubscriptionLimitInterceptor` takes a slot for every call of the limited methods while it runs
(served here or relayed to the stream's primary: both cost this node a task and buffers) and
refuses a call that finds every slot taken with RESOURCE_EXHAUSTED / TOO_MANY_SUBSCRIPTIONS,
before anything is read. A slot comes back when the call ends, however it ends (finished,
failed, cancelled by the client or by the server's shutdown).

Relayed calls count: the operations relay them inside the servicer, which the interceptor wraps:
`grpc.aio.server(interceptors=[MalformedRequestInterceptor(), SubscriptionLimitInterceptor()])`.

`StreamSubscriptions` counts the same calls per stream where they are served, on the stream's
primary (node/ops/consumers.py takes a slot around the events it serves; a relaying node serves
none, so a forwarded call counts once), against the stream's `max_subscriptions`
(docs/quotas.md).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.transport import rpc

Context = grpc.aio.ServicerContext[Any, Any]
LIMITED_METHODS = frozenset({"/raftlog.v1.Consumers/Subscribe"})


class SubscriptionSlots:
    """A counter with a ceiling; single-threaded (the event loop)."""

    def __init__(self, slots_max: int | None = None) -> None:
        """`slots_max` defaults to limits.subscriptions_max."""
        self.slots_max = limits.subscriptions_max if slots_max is None else slots_max
        self.taken = 0

    def take(self, method: str) -> None:
        """Takes a slot or raises TOO_MANY_SUBSCRIPTIONS."""
        if self.taken >= self.slots_max:
            raise RaftlogError(
                Reason.TOO_MANY_SUBSCRIPTIONS,
                f"this node holds {self.taken} subscriptions, its limit; end one or subscribe "
                "through another node", method=method, limit=self.slots_max,
                retry_after_ms=limits.subscriptions_retry_after_ms)
        self.taken += 1

    def give_back(self) -> None:
        self.taken -= 1


class SubscriptionLimitInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, slots: SubscriptionSlots | None = None, *,
                 methods: frozenset[str] = LIMITED_METHODS) -> None:
        self.slots = slots or SubscriptionSlots()
        self._methods = methods

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler: Any = await continuation(details)
        method: str = details.method  # type: ignore[attr-defined]
        if (handler is None or method not in self._methods or handler.unary_stream is None
                or not inspect.isasyncgenfunction(handler.unary_stream)):
            return handler
        return grpc.unary_stream_rpc_method_handler(
            self._held(method, handler.unary_stream),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)

    def _held(self, method: str, behaviour: Callable[[Any, Context], AsyncGenerator[Any, None]]
              ) -> Callable[[Any, Context], AsyncIterator[Any]]:
        async def held(request: Any, context: Context) -> AsyncIterator[Any]:
            try:
                self.slots.take(method)
            except RaftlogError as err:
                await rpc.abort(context, err)
            try:
                async with contextlib.aclosing(behaviour(request, context)) as responses:
                    async for response in responses:
                        yield response
            finally:
                self.slots.give_back()

        return held


class StreamSubscriptions:
    """Subscriptions served here, per stream, against each stream's `max_subscriptions`
    (`limit_of(stream)`, 0 = none); single-threaded (the event loop). Every subscription is
    counted, limited or not, so a limit set later applies to those already open; a stream
    leaves the table when its last one ends."""

    def __init__(self, limit_of: Callable[[str], int]) -> None:
        self._limit_of = limit_of
        self._open: dict[str, int] = {}

    def open(self, stream: str) -> int:
        return self._open.get(stream, 0)

    def take(self, stream: str) -> Callable[[], None]:
        """Holds one subscription of `stream` and answers what gives it back (call it once,
        when the subscription ends), or raises TOO_MANY_SUBSCRIPTIONS holding nothing."""
        taken, limit = self.open(stream), self._limit_of(stream)
        if limit and taken >= limit:
            raise RaftlogError(
                Reason.TOO_MANY_SUBSCRIPTIONS,
                f"stream {stream!r} has {taken} subscriptions open, its max_subscriptions "
                f"({limit}); end one, or retry later", stream=stream, limit=limit,
                retry_after_ms=limits.subscriptions_retry_after_ms)
        self._open[stream] = taken + 1
        return functools.partial(self._give_back, stream)

    def _give_back(self, stream: str) -> None:
        left = self._open.get(stream, 0) - 1
        if left > 0:
            self._open[stream] = left
        else:
            self._open.pop(stream, None)
