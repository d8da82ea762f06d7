"""Any node serves any request: a server interceptor sends every per-stream call to the
stream's primary, over a pooled channel, with a hop limit, the caller's deadline and metadata.

The services themselves know nothing of this: the interceptor wraps their handlers. A call is
served locally when the router says this node is the primary; otherwise its request is sent
on as is, and the primary's answer (or its status, ErrorInfo included) is relayed unchanged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc

from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.transport import rpc

log = logging.getLogger(__name__)

HOPS_HEADER = "raftlog-hops"
hops_max = 3  # a call forwarded more often than this is refused (HOP_LIMIT)
forward_timeout_s_default = 30.0  # when the caller set no deadline
forward_check_s = 0.1  # a forwarded call checks this often that the primary still answers
channels_max = 64  # pooled channels to other nodes; the least recently used is closed beyond
reconnect_backoff_ms = 100
reconnect_backoff_ms_max = 1000
_STATUS_DETAILS_KEY = "grpc-status-details-bin"
# Channels for relayed server streams (Subscribe): without the BDP probe a stream's receive window
# stays at gRPC's 64 KiB, so a relay whose client does not read holds at most that much of the
# primary's answer, not the megabytes a grown window lets in.
STREAM_RELAY_OPTIONS: list[tuple[str, Any]] = [("grpc.http2.bdp_probe", 0)]

Context = grpc.aio.ServicerContext[Any, Any]


def _name(request: Any) -> str:
    return str(request.name)


def _stream(request: Any) -> str:
    return str(request.stream)


def _config_name(request: Any) -> str:
    return str(request.config.name)


# Per-stream methods and where their request names the stream.
ROUTED: dict[str, Callable[[Any], str]] = {
    "/raftlog.v1.Streams/CreateStream": _config_name,
    "/raftlog.v1.Streams/UpdateStream": _name,
    "/raftlog.v1.Streams/DeleteStream": _name,
    "/raftlog.v1.Streams/GetStreamInfo": _name,
    "/raftlog.v1.Streams/PurgeStream": _name,
    "/raftlog.v1.Streams/GetMessage": _stream,
    "/raftlog.v1.Streams/ReadLatestAtSubject": _stream,
    "/raftlog.v1.Streams/ListSubjectsByPrefix": _stream,
    "/raftlog.v1.Streams/ScanExactAtSubject": _stream,
    "/raftlog.v1.Streams/Publish": _stream,
    "/raftlog.v1.Streams/PublishBatch": _stream,
    "/raftlog.v1.Consumers/CreateConsumer": _stream,
    "/raftlog.v1.Consumers/DeleteConsumer": _stream,
    "/raftlog.v1.Consumers/ListConsumers": _stream,
    "/raftlog.v1.Consumers/GetConsumerInfo": _stream,
    "/raftlog.v1.Consumers/Fetch": _stream,
    "/raftlog.v1.Consumers/Ack": _stream,
    "/raftlog.v1.Consumers/Nak": _stream,
    "/raftlog.v1.Consumers/Term": _stream,
    "/raftlog.v1.Consumers/InProgress": _stream,
    "/raftlog.v1.Consumers/Subscribe": _stream,
}


class Router(Protocol):
    def primary_address(self, stream: str) -> str | None:
        """gRPC address of the stream's primary; None when it is this node. Raises
        RaftlogError (UNAVAILABLE) when no node can be named."""
        ...

    def unreachable(self, address: str) -> RaftlogError | None:
        """Why a call forwarded to `address` should stop waiting (the node there went
        silent), or None."""
        ...


class ChannelPool:
    """Long-lived channels to other nodes, at most channels_max of them."""

    def __init__(self, *, options: list[tuple[str, Any]] | None = None) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        merged = dict([
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            # A node that restarts is reachable again within a second, not after grpc's
            # default backoff of up to two minutes.
            ("grpc.initial_reconnect_backoff_ms", reconnect_backoff_ms),
            ("grpc.min_reconnect_backoff_ms", reconnect_backoff_ms),
            ("grpc.max_reconnect_backoff_ms", reconnect_backoff_ms_max),
        ])
        merged.update(options or ())  # the caller's options replace the defaults
        self._options = list(merged.items())

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.pop(address, None)
        if channel is None:
            channel = grpc.aio.insecure_channel(address, options=self._options)
            if len(self._channels) >= channels_max:
                oldest = next(iter(self._channels))
                self._channels.pop(oldest)
        self._channels[address] = channel
        return channel

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


def _serialize(message: Any) -> bytes:
    return message if isinstance(message, bytes) else bytes(message.SerializeToString())


def _relay_serializer(serializer: Callable[[Any], bytes] | None) -> Callable[[Any], bytes]:
    """Serializes a local answer as the service would, and passes a relayed one through."""
    def serialize(message: Any) -> bytes:
        if isinstance(message, bytes):
            return message
        return serializer(message) if serializer is not None else _serialize(message)
    return serialize


def outgoing_metadata(context: Context) -> list[tuple[str, str]]:
    """The caller's metadata to send on, with the hop count raised; HOP_LIMIT past hops_max."""
    hops = 0
    forwarded: list[tuple[str, str]] = []
    for key, value in context.invocation_metadata() or ():
        if key == HOPS_HEADER:
            hops = int(value) if str(value).isdigit() else hops_max
        elif not key.startswith(("grpc-", ":")) and key not in ("user-agent", "te",
                                                               "content-type"):
            forwarded.append((key, value if isinstance(value, str) else value.decode()))
    if hops >= hops_max:
        raise RaftlogError(Reason.HOP_LIMIT,
                           f"the call was forwarded {hops} times without reaching the primary",
                           hops=hops)
    forwarded.append((HOPS_HEADER, str(hops + 1)))
    return forwarded


def remaining_s(context: Context) -> float:
    remaining = context.time_remaining()
    return forward_timeout_s_default if remaining is None else max(remaining, 0.001)


async def relay_error(context: Context, err: grpc.aio.AioRpcError, address: str) -> None:
    trailing = tuple(err.trailing_metadata() or ())
    if any(key == _STATUS_DETAILS_KEY for key, _ in trailing):
        await context.abort(err.code(), err.details() or "", trailing)
    if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN):
        await rpc.abort(context, RaftlogError(
            Reason.FORWARD_FAILED, f"cannot reach the stream's primary at {address}: "
            f"{err.details()}", address=address))
    await context.abort(err.code(), err.details() or "", trailing)


class RoutingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, router: Router, pool: ChannelPool, *,
                 stream_pool: ChannelPool | None = None) -> None:
        """`stream_pool` (default `pool`) carries relayed server streams; see
        STREAM_RELAY_OPTIONS."""
        self._router = router
        self._pool = pool
        self._stream_pool = stream_pool or pool

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        # The handler types of grpc's stubs describe the sync API; these handlers are aio.
        handler: Any = await continuation(details)
        method: str = details.method  # type: ignore[attr-defined]
        pick = ROUTED.get(method)
        if handler is None or pick is None:
            return handler
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, pick, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=_relay_serializer(handler.response_serializer),
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._server_stream(method, pick, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=_relay_serializer(handler.response_serializer),
            )
        return handler

    def _unary(self, method: str, pick: Callable[[Any], str],
               local: Callable[[Any, Context], Awaitable[Any]]
               ) -> Callable[[Any, Context], Awaitable[Any]]:
        async def behavior(request: Any, context: Context) -> Any:
            try:
                address = self._router.primary_address(pick(request))
                if address is None:
                    return await local(request, context)
                metadata = outgoing_metadata(context)
            except RaftlogError as err:
                await rpc.abort(context, err)
                raise
            call: Any = self._pool.get(address).unary_unary(
                method, request_serializer=_serialize, response_deserializer=None)
            pending = asyncio.ensure_future(
                call(request, timeout=remaining_s(context), metadata=metadata))
            try:
                while True:
                    done, _ = await asyncio.wait({pending}, timeout=forward_check_s)
                    if done:
                        return pending.result()
                    gone = self._router.unreachable(address)
                    if gone is not None:  # do not wait for the deadline of a silent primary
                        pending.cancel()
                        await rpc.abort(context, gone)
            except grpc.aio.AioRpcError as err:
                await relay_error(context, err, address)
                raise
            finally:
                pending.cancel()

        return behavior

    def _server_stream(self, method: str, pick: Callable[[Any], str],
                       local: Callable[[Any, Context], AsyncIterator[Any]]
                       ) -> Callable[[Any, Context], AsyncIterator[Any]]:
        async def behavior(request: Any, context: Context) -> AsyncIterator[Any]:
            try:
                address = self._router.primary_address(pick(request))
                metadata = outgoing_metadata(context) if address is not None else []
            except RaftlogError as err:
                await rpc.abort(context, err)
                raise
            if address is None:
                async for item in local(request, context):
                    yield item
                return
            call: Any = self._stream_pool.get(address).unary_stream(
                method, request_serializer=_serialize, response_deserializer=None)
            try:
                async for item in call(request, timeout=context.time_remaining(),
                                       metadata=metadata):
                    yield item
            except grpc.aio.AioRpcError as err:
                await relay_error(context, err, address)

        return behavior
