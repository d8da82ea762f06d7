"""The wire under a primary's replication links (node/replication/primary.py, `PeerLink`).

A link's logic (heartbeats, the lease's clock, request timeouts, commit and fence notices,
reconnects) needs only this of the wire, per replica node:

- `LinkTransport.open(node_id, requests)` opens one long-lived Replicate call. The link
  *sends* a `ReplicateRequest` by putting it where `requests` (an async iterator the call
  drains, in order) takes it from.
- `LinkCall.acks()` *receives* the replica's `ReplicateAck`s, in order with the requests they
  answer (and the fence notices the replica pushes between them). It ends when the replica
  ends the call; it raises `LinkReset` when the call breaks (peer unreachable, connection
  lost, refused), or `RaftlogError` when the node cannot be addressed.
- `LinkCall.cancel()` *closes* the call from this side: an `acks()` iteration in progress then
  raises `asyncio.CancelledError` (as a cancelled gRPC call does).

Two implementations: `GrpcLinkTransport` here (the Replicate call of raftlog.internal.Replication
on the peer listener, signed with the cluster credential by `PeerClient`), used by every node,
and `MemoryNetwork` in `memory_link.py`, which hands the requests to a replica-side handler in
the same process (the same code the Replicate servicer runs), for tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

import grpc

from raftlog.internal import replication_pb2
from raftlog.node.transport.peer import PeerClient


class LinkReset(Exception):
    """The Replicate call broke; the link reopens it."""


class LinkCall(Protocol):
    """One open Replicate call to a replica node."""

    def acks(self) -> AsyncIterator[replication_pb2.ReplicateAck]:
        """The replica's answers, in order; see the module docstring for how it ends."""
        ...

    def cancel(self) -> None:
        """Ends the call from this side (an iteration of `acks()` raises CancelledError)."""
        ...


class LinkTransport(Protocol):
    """Opens Replicate calls to replica nodes."""

    def open(self, node_id: str,
             requests: AsyncIterator[replication_pb2.ReplicateRequest]) -> LinkCall:
        """A new call to `node_id` that sends what `requests` yields, in order."""
        ...


class GrpcLinkCall:
    """A Replicate call on a peer channel."""

    def __init__(self, call: Any) -> None:
        self._call = call

    async def acks(self) -> AsyncIterator[replication_pb2.ReplicateAck]:
        try:
            async for ack in self._call:
                yield ack
        except grpc.aio.AioRpcError as err:
            raise LinkReset(str(err)) from err

    def cancel(self) -> None:
        self._call.cancel()


class GrpcLinkTransport:
    """Replicate calls to other members' peer listeners (PeerClient signs each)."""

    def __init__(self, peers: PeerClient) -> None:
        self._peers = peers

    def open(self, node_id: str,
             requests: AsyncIterator[replication_pb2.ReplicateRequest]) -> GrpcLinkCall:
        return GrpcLinkCall(self._peers.replicate(node_id, requests))
