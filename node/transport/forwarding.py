"""The one forwarder: sends a canonical request to the node that serves it (a stream's primary,
the Raft leader, each primary of a split PublishStream, every node of a fan-out) and gives back
its answer, or its failure as the RaftlogError that node raised.

Callers name the call by its canonical method path (`Forward`, kept by the operations layer),
never by the front-end method that received it. A forwarded call carries the caller's deadline
(or limits.forward_timeout_s_default), its metadata, its request id and a hop count (calls.py);
while it waits, it checks every limits.forward_check_s that the node it waits on still answers,
so a silent node fails the call fast instead of at the deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import grpc

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.node.transport.channels import ChannelPool

log = logging.getLogger(__name__)

Resp = TypeVar("Resp")


@dataclass(frozen=True)
class Forward(Generic[Resp]):
    """A canonical call: its method path and how to read its answer."""

    path: str
    parse: Callable[[bytes], Resp]


class Liveness(Protocol):
    def unreachable(self, address: str) -> RaftlogError | None:
        """Why a call forwarded to `address` should stop waiting (the node there went
        silent), or None."""
        ...


class RemoteStatus(RaftlogError):
    """A forwarded call failed with a status that carries no raftlog ErrorInfo (e.g. the
    deadline passed on the way): the same status code, reason FORWARD_FAILED."""

    def __init__(self, code: grpc.StatusCode, message: str, *, address: str) -> None:
        super().__init__(Reason.FORWARD_FAILED, message, address=address)
        self._code_name = code.name

    @property
    def status_name(self) -> str:
        return self._code_name


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


class NotConnected(RaftlogError):
    """FORWARD_FAILED for a call that never reached a connection (the channel could not
    connect, so nothing of the request was sent): safe to send again."""


def _not_connected(err: grpc.aio.AioRpcError) -> bool:
    return (err.code() == grpc.StatusCode.UNAVAILABLE
            and "failed to connect" in (err.details() or "").lower())


def remote_error(err: grpc.aio.AioRpcError, address: str) -> RaftlogError:
    """What a forwarded call's failure means here: the remote node's own error when it sent
    one, FORWARD_FAILED when the node could not be reached, else its status as it was."""
    raised = rpc.from_rpc_error(err)
    if raised is not None:
        return raised
    if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN):
        kind = NotConnected if _not_connected(err) else RaftlogError
        return kind(Reason.FORWARD_FAILED, f"cannot reach the node serving the call at "
                    f"{address}: {err.details()}", address=address)
    return RemoteStatus(err.code(), err.details() or err.code().name, address=address)


class Forwarder:
    """`stream_pool` (default `pool`) carries relayed server streams (channels.py's
    STREAM_RELAY_OPTIONS); `on_forward(path)` is told of every call sent on (metrics);
    `identity(path)` gives the headers that carry the caller's verified identity (auth.py)."""

    def __init__(self, pool: ChannelPool, liveness: Liveness, *,
                 stream_pool: ChannelPool | None = None,
                 on_forward: Callable[[str], None] | None = None,
                 identity: Callable[[str], list[tuple[str, str]]] | None = None) -> None:
        self._pool = pool
        self._identity = identity
        self._on_forward = on_forward
        self._liveness = liveness
        self._stream_pool = stream_pool or pool
        self._relays: dict[str, set[_Relay]] = {}  # the open server streams, by address
        self._watcher: asyncio.Task[None] | None = None

    async def unary(self, address: str, call: Forward[Resp], request: Any, via: Call, *,
                    timeout_s: float | None = None,
                    headers: Iterable[tuple[str, str]] = ()) -> Resp:
        """The answer of `address` to `request`; its failure raised as a RaftlogError.

        A node that restarted a moment ago may find this node's channel to it waiting out a
        reconnect backoff (at most limits.reconnect_backoff_ms_max): a call that could not
        connect, so sent nothing, is sent once more at once on a fresh channel, which dials
        now. A node that is down refuses that dial too, so the call still fails fast (a caller
        looking for a new Raft leader must not wait out a backoff on the old one)."""
        self._count(call)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout_s or via.timeout_s())
        metadata = [*via.outgoing(), *headers, *self._identity_of(call)]

        async def send(channel: grpc.aio.Channel) -> Resp:
            method: Any = channel.unary_unary(
                call.path, request_serializer=_serialize, response_deserializer=call.parse)
            return await self._answer(address, method(
                request, timeout=max(deadline - loop.time(), 0.001), metadata=metadata))

        channel = self._pool.get(address)
        try:
            return await send(channel)
        except NotConnected:
            if deadline - loop.time() <= 0:
                raise
            return await send(self._pool.renew(address, channel))

    async def client_stream(self, address: str, call: Forward[Resp], requests: Iterable[Any],
                            via: Call) -> Resp:
        """Sends `requests` as one client stream; the answer as `unary`."""
        self._count(call)
        method: Any = self._pool.get(address).stream_unary(
            call.path, request_serializer=_serialize, response_deserializer=call.parse)
        return await self._answer(address, method(
            iter(requests), timeout=via.timeout_s(),
            metadata=[*via.outgoing(), *self._identity_of(call)]))

    def _identity_of(self, call: Forward[Any]) -> list[tuple[str, str]]:
        return [] if self._identity is None else self._identity(call.path)

    def _count(self, call: Forward[Any]) -> None:
        if self._on_forward is not None:
            self._on_forward(call.path)

    async def _answer(self, address: str, call: Awaitable[Resp]) -> Resp:
        """Waits for a forwarded call's answer, checking every limits.forward_check_s that
        the node at `address` still answers (a silent one fails the call now, not at its
        deadline)."""
        pending = asyncio.ensure_future(call)
        try:
            while True:
                done, _ = await asyncio.wait({pending}, timeout=limits.forward_check_s)
                if done:
                    return pending.result()
                gone = self._liveness.unreachable(address)
                if gone is not None:
                    raise gone
        except grpc.aio.AioRpcError as err:
            raise remote_error(err, address) from None
        finally:
            pending.cancel()

    async def server_stream(self, address: str, call: Forward[Resp], request: Any,
                            via: Call) -> AsyncIterator[Resp]:
        """Relays a server stream item by item, at the pace the caller reads. Liveness is
        checked as for `_answer` (by one watcher for every relay, `_watch_relays`): a relay
        without a deadline (a Subscribe) from a node that went silent without closing its
        connections (cut off, frozen) ends when the node is found silent, not never."""
        metadata = [*via.outgoing(), *self._identity_of(call)]
        self._count(call)
        method: Any = self._stream_pool.get(address).unary_stream(
            call.path, request_serializer=_serialize, response_deserializer=call.parse)
        stream = method(request, timeout=via.remaining_s(), metadata=metadata)
        relay = _Relay(stream)
        self._relays.setdefault(address, set()).add(relay)
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(
                self._watch_relays(), name="forwarded-streams-liveness")
        try:
            async for item in stream:
                yield item
        except grpc.aio.AioRpcError as err:
            raise remote_error(err, address) from None
        except asyncio.CancelledError:
            if relay.gone is None:
                raise
            raise relay.gone from None  # the watcher ended the stream
        finally:
            self._relays.get(address, set()).discard(relay)
            stream.cancel()

    async def _watch_relays(self) -> None:
        """Every limits.forward_check_s, ends the relays from a node that went silent; stops
        once no relay is open (the next one starts it again)."""
        try:
            while any(self._relays.values()):
                await asyncio.sleep(limits.forward_check_s)
                for address, relays in list(self._relays.items()):
                    if not relays:
                        del self._relays[address]
                        continue
                    gone = self._liveness.unreachable(address)
                    for relay in list(relays) if gone is not None else ():
                        relay.gone = gone
                        relay.stream.cancel()
        finally:
            self._watcher = None


@dataclass(eq=False)
class _Relay:
    """One relayed server stream; `gone` is why the watcher ended it."""

    stream: Any
    gone: RaftlogError | None = None
