"""How the workload reaches the nodes: `Nodes` (grpc.aio channels and stubs to a list of
nodes, one of them current, `rotate` moves on), signed calls to the nodes' peer listeners
(`PeerAccess`), `rpc` (one call that moves on to the next node after a failure), `error_name`
(what a failure is called in the histories), and the call timeouts and channel options they
share. Part of the workload (chaos/workload.py re-exports it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from raftlog.internal import replication_pb2, replication_pb2_grpc
from raftlog.node.transport.credentials import PEER_TOKEN_HEADER, Credential
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import cluster_pb2_grpc, consumers_pb2_grpc, streams_pb2_grpc

Clock = Callable[[], float]  # seconds, monotonic

call_timeout_s_default = 1.0
read_attempts_max = 20  # one read call, over every node, before a collector gives up
read_retry_s = 0.2

# Reconnect quickly to a node that was killed and restarted (grpc's default backoff grows to 2 min).
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
]


class _NoPeerAccess(grpc.RpcError):
    """The collectors were not given the peer listener of a node (single-node mode)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNIMPLEMENTED

    def details(self) -> str:
        return str(self)

    def trailing_metadata(self) -> tuple[()]:
        return ()


def error_name(exc: BaseException) -> str:
    """The catalogued reason (NOT_PRIMARY...), else the gRPC status name, else the type."""
    if isinstance(exc, grpc.RpcError):
        err = from_rpc_error(exc)
        if err is not None:
            return err.reason.name
        if isinstance(exc, grpc.aio.AioRpcError):
            return exc.code().name
    return type(exc).__name__


@dataclass(frozen=True)
class PeerAccess:
    """How to reach the nodes' peer listeners (node-to-node services: ReadLocal,
    GetReplicaState): each node's peer address by its gRPC address, and the cluster
    credential that signs the calls."""

    credential: Credential
    peer_of: dict[str, str]


class _PeerStub:
    """The Replication calls the collectors make, on a node's peer listener, signed."""

    def __init__(self, channel: grpc.aio.Channel, credential: Credential) -> None:
        self._stub: Any = replication_pb2_grpc.ReplicationStub(channel)  # type: ignore[no-untyped-call]
        self._credential = credential

    def _metadata(self, method: str) -> tuple[tuple[str, str], ...]:
        path = f"/raftlog.internal.Replication/{method}"
        return ((PEER_TOKEN_HEADER, self._credential.token(principal="workload", method=path)),)

    async def ReadLocal(self, request: replication_pb2.ReadLocalRequest, *,
                        timeout: float) -> replication_pb2.ReadLocalResponse:
        reply: replication_pb2.ReadLocalResponse = await self._stub.ReadLocal(
            request, timeout=timeout, metadata=self._metadata("ReadLocal"))
        return reply

    async def GetReplicaState(self, request: replication_pb2.GetReplicaStateRequest, *,
                              timeout: float) -> replication_pb2.ReplicaState:
        reply: replication_pb2.ReplicaState = await self._stub.GetReplicaState(
            request, timeout=timeout, metadata=self._metadata("GetReplicaState"))
        return reply


class Nodes:
    """grpc.aio channels to a list of nodes, one of them current; `rotate` moves on. Create
    and use it inside one event loop; `close` it there. With `peer`, `replication(address)`
    reaches the node's peer listener."""

    def __init__(self, addresses: Sequence[str], *, start: int = 0,
                 peer: PeerAccess | None = None) -> None:
        if not addresses:
            raise ValueError("at least one node address is needed")
        self.addresses = list(addresses)
        self.index = start % len(self.addresses)
        self.peer = peer
        self._channels: dict[str, grpc.aio.Channel] = {}

    @property
    def current(self) -> str:
        return self.addresses[self.index]

    def rotate(self) -> None:
        self.index = (self.index + 1) % len(self.addresses)

    def channel(self, address: str | None = None) -> grpc.aio.Channel:
        address = address or self.current
        if address not in self._channels:
            self._channels[address] = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        return self._channels[address]

    # Generated *_pb2_grpc stubs are untyped to mypy; requests and responses are typed.
    def streams(self, address: str | None = None) -> Any:
        return streams_pb2_grpc.StreamsStub(self.channel(address))  # type: ignore[no-untyped-call]

    def consumers(self, address: str | None = None) -> Any:
        return consumers_pb2_grpc.ConsumersStub(self.channel(address))  # type: ignore[no-untyped-call]

    def cluster(self, address: str | None = None) -> Any:
        return cluster_pb2_grpc.ClusterStub(self.channel(address))  # type: ignore[no-untyped-call]

    def replication(self, address: str | None = None) -> _PeerStub:
        """The node's Replication service; UNAVAILABLE-like failure (a grpc error) when this
        has no peer access or does not know the node's peer address."""
        address = address or self.current
        if self.peer is None or address not in self.peer.peer_of:
            raise _NoPeerAccess(f"no peer access to {address}")
        return _PeerStub(self.channel(self.peer.peer_of[address]), self.peer.credential)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close(None)


class CollectError(Exception):
    """A collector could not read what it needs from any node."""


async def rpc(nodes: Nodes, service: str, method: str, request: Any, *, timeout_s: float,
              attempts_max: int = read_attempts_max) -> Any:
    """`nodes.<service>().<method>(request)` on the current node, moving on to the next one
    after a failure (pausing read_retry_s after each round); the last error is raised after
    `attempts_max` attempts."""
    for attempt in range(1, attempts_max + 1):
        try:
            stub = getattr(nodes, service)()
            return await getattr(stub, method)(request, timeout=timeout_s)
        except grpc.RpcError:
            if attempt >= attempts_max:
                raise
            nodes.rotate()
            if attempt % len(nodes.addresses) == 0:
                await asyncio.sleep(read_retry_s)
    raise CollectError(f"{method}: attempts_max must be at least 1, not {attempts_max}")
