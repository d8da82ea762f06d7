"""Where a call is served: here, or forwarded (transport/forwarding.py) to the node that serves
it. A stream's calls go to its primary; membership and placement changes to the Raft leader.

`LocalRoute` is a node on its own (every call is served here); `ClusterRoute` asks the cluster
(the committed placement in ClusterNode, and the liveness of members).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.cluster.coordinator import ClusterNode
from raftlog.node.transport.calls import Call
from raftlog.node.transport.forwarding import Forward, Forwarder

Resp = TypeVar("Resp")


class Route(Protocol):
    @property
    def node_id(self) -> str: ...

    def primary(self, stream: str) -> str | None:
        """Address of the node serving `stream` (None: this one)."""
        ...

    def leader(self) -> str | None:
        """Address of the Raft leader (None: this node, or no cluster)."""
        ...

    def members(self) -> dict[str, str]:
        """Every member's address by node id ({} without a cluster)."""
        ...

    @property
    def forwarder(self) -> Forwarder | None: ...


async def unary(route: Route, address: str | None, call: Forward[Resp], request: Any, via: Call,
                local: Callable[[], Awaitable[Resp]]) -> Resp:
    """Serves here when `address` is None, else forwards `request` there."""
    if address is None or route.forwarder is None:
        return await local()
    return await route.forwarder.unary(address, call, request, via)


async def server_stream(route: Route, address: str | None, call: Forward[Resp], request: Any,
                        via: Call, local: Callable[[], AsyncIterator[Resp]]
                        ) -> AsyncIterator[Resp]:
    if address is None or route.forwarder is None:
        items = local()
        try:
            async for item in items:
                yield item
        finally:  # closed with this one (a generator left open would end only when collected)
            await maybe_aclose(items)
        return
    async for item in route.forwarder.server_stream(address, call, request, via):
        yield item


async def maybe_aclose(items: AsyncIterator[Any]) -> None:
    """Closes an async generator (what else an AsyncIterator is needs no closing)."""
    close = getattr(items, "aclose", None)
    if close is not None:
        await close()


async def client_stream(route: Route, address: str, call: Forward[Resp],
                        requests: Iterable[Any], via: Call) -> Resp:
    if route.forwarder is None:
        raise RaftlogError(Reason.INTERNAL, "a node without a cluster forwards nothing")
    return await route.forwarder.client_stream(address, call, requests, via)


class LocalRoute:
    """A node on its own serves every call."""

    node_id = ""
    forwarder: Forwarder | None = None

    def primary(self, stream: str) -> str | None:
        return None

    def leader(self) -> str | None:
        return None

    def members(self) -> dict[str, str]:
        return {}


class ClusterRoute:
    def __init__(self, cluster: ClusterNode, forwarder: Forwarder) -> None:
        self._cluster = cluster
        self._forwarder = forwarder

    @property
    def node_id(self) -> str:
        return self._cluster.node_id

    @property
    def forwarder(self) -> Forwarder:
        return self._forwarder

    def primary(self, stream: str) -> str | None:
        return self._cluster.primary_address(stream)

    def leader(self) -> str | None:
        if self._cluster.group.is_leader():
            return None
        leader = self._cluster.leader_node_id()
        if not leader:
            raise RaftlogError(Reason.NO_LEADER, "the cluster has no Raft leader",
                               retry_after_ms=limits.no_leader_retry_after_ms)
        return self._cluster.member_address(leader)

    def members(self) -> dict[str, str]:
        return self._cluster.member_addresses()
