"""An in-memory `LinkTransport` (node/replication/links.py): replication between simulated
nodes of one process, for tests of the primary's side and of failover without sockets.

`MemoryNetwork` knows each node's replica-side endpoint (a `ReplicationService`; its
`replicate` is the body of the Replicate servicer, so the requests run exactly the code a
node's peer listener runs) and hands every node a transport (`transport(node_id)`). A call
pumps the link's requests into the endpoint and the endpoint's answers back, in order, like a
gRPC stream. Faults are per direction (from, to) and take effect at once:

- `cut(a, b)`: no call opens (as an unreachable peer: the call fails at once), and the open ones
  break (`LinkReset`), like a lost connection; `restore(a, b)` heals it.
- `drop(a, b)`: requests vanish (and with `acks=True` the answers too) while the call stays
  open, like a peer that stopped answering: the link notices only by its request timeout.
- `delay(a, b, s)`: every request and every answer arrives `s` seconds (event loop time)
  after it was sent, in order, like a slow pipe: what is sent meanwhile is in flight together.

`taps` see each request as it is delivered (tests check what travelled).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from raftlog.internal import replication_pb2
from raftlog.node.replication.links import LinkReset


class ReplicaEndpoint(Protocol):
    """The replica side of a node: `ReplicationService.replicate`."""

    def replicate(self, request_iterator: AsyncIterator[replication_pb2.ReplicateRequest]
                  ) -> AsyncGenerator[replication_pb2.ReplicateAck, None]: ...


@dataclass
class LinkFaults:
    """What goes wrong on the calls from one node to another."""

    cut: bool = False
    drop_requests: bool = False
    drop_acks: bool = False
    delay_s: float = 0.0


Tap = Callable[[str, str, replication_pb2.ReplicateRequest], None]


class MemoryNetwork:
    """Simulated nodes' replica endpoints and the faults between them; see the module
    docstring."""

    def __init__(self) -> None:
        self._endpoints: dict[str, ReplicaEndpoint] = {}
        self._faults: dict[tuple[str, str], LinkFaults] = {}
        self._calls: dict[tuple[str, str], set[MemoryCall]] = {}
        self.taps: list[Tap] = []

    def add(self, node_id: str, endpoint: ReplicaEndpoint) -> None:
        self._endpoints[node_id] = endpoint

    def endpoint(self, node_id: str) -> ReplicaEndpoint | None:
        return self._endpoints.get(node_id)

    def transport(self, node_id: str) -> MemoryLinkTransport:
        """The transport of `node_id`'s links (what its ReplicationManager is built with)."""
        return MemoryLinkTransport(self, node_id)

    def faults(self, from_node: str, to_node: str) -> LinkFaults:
        return self._faults.setdefault((from_node, to_node), LinkFaults())

    def cut(self, from_node: str, to_node: str) -> None:
        self.faults(from_node, to_node).cut = True
        for call in list(self._calls.get((from_node, to_node), ())):
            call.reset(f"the link from {from_node} to {to_node} was cut")

    def drop(self, from_node: str, to_node: str, *, acks: bool = False) -> None:
        faults = self.faults(from_node, to_node)
        faults.drop_requests = True
        faults.drop_acks = faults.drop_acks or acks

    def delay(self, from_node: str, to_node: str, seconds: float) -> None:
        self.faults(from_node, to_node).delay_s = seconds

    def restore(self, from_node: str, to_node: str) -> None:
        """No more faults on that link (calls it broke stay broken; the link reopens)."""
        self._faults[(from_node, to_node)] = LinkFaults()

    def open_calls(self, from_node: str, to_node: str) -> int:
        return len(self._calls.get((from_node, to_node), ()))

    def _opened(self, call: MemoryCall) -> None:
        self._calls.setdefault(call.key, set()).add(call)

    def _closed(self, call: MemoryCall) -> None:
        calls = self._calls.get(call.key)
        if calls is not None:
            calls.discard(call)

    async def close(self) -> None:
        """Ends every open call (and waits for their tasks)."""
        calls = [call for calls in self._calls.values() for call in calls]
        for call in calls:
            call.cancel()
        await asyncio.gather(*(call.task for call in calls), return_exceptions=True)
        self._calls.clear()


class MemoryLinkTransport:
    """The `LinkTransport` of one node on a MemoryNetwork."""

    def __init__(self, network: MemoryNetwork, node_id: str) -> None:
        self._network = network
        self.node_id = node_id

    def open(self, node_id: str,
             requests: AsyncIterator[replication_pb2.ReplicateRequest]) -> MemoryCall:
        return MemoryCall(self._network, self.node_id, node_id, requests)


class QueuedCall:
    """The receiving half of an in-process Replicate call (a `LinkCall`), shared by this
    module's calls and the simulation's (chaos/sim/network.py): the answers, then how the call
    ended, go through one queue. `_finish(end)` ends the call once (None: the replica ended
    it) and runs `_ended()`; `reset` and `cancel` end it from this side through `_break`."""

    def __init__(self) -> None:
        # Answers, then how the call ended: None (the replica ended it) or an exception.
        self._answers: asyncio.Queue[replication_pb2.ReplicateAck | BaseException | None] = \
            asyncio.Queue()
        self._done = False

    def _finish(self, end: BaseException | None) -> None:
        if not self._done:
            self._done = True
            self._answers.put_nowait(end)
            self._ended()

    def _ended(self) -> None:
        """Once, when the call ends: the subclass lets go of what it holds."""

    def _break(self, end: BaseException) -> None:
        self._finish(end)

    def reset(self, reason: str) -> None:
        """Breaks the call as a lost connection does: `acks()` raises LinkReset."""
        self._break(LinkReset(reason))

    def cancel(self) -> None:
        self._break(asyncio.CancelledError())

    async def acks(self) -> AsyncIterator[replication_pb2.ReplicateAck]:
        try:
            while True:
                item = await self._answers.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        except asyncio.CancelledError:
            self.cancel()  # the reader itself was cancelled: end the call with it
            raise


class MemoryCall(QueuedCall):
    """One Replicate call between two simulated nodes (a `LinkCall`)."""

    def __init__(self, network: MemoryNetwork, from_node: str, to_node: str,
                 requests: AsyncIterator[replication_pb2.ReplicateRequest]) -> None:
        super().__init__()
        self._network = network
        self.key = (from_node, to_node)
        network._opened(self)
        self.task = asyncio.get_running_loop().create_task(
            self._run(requests), name=f"memory-link-{from_node}-{to_node}")

    def _faults(self) -> LinkFaults:
        return self._network.faults(*self.key)

    async def _run(self, requests: AsyncIterator[replication_pb2.ReplicateRequest]) -> None:
        endpoint = self._network.endpoint(self.key[1])
        if endpoint is None or self._faults().cut:
            self._finish(LinkReset(f"{self.key[1]} is unreachable from {self.key[0]}"))
            return
        answers = endpoint.replicate(self._deliver(requests))
        try:
            async for ack in _delayed(answers, self._faults):
                if not self._faults().drop_acks:
                    self._answers.put_nowait(ack)
        except Exception as err:  # the handler failed: the call ends with an error status
            self._finish(LinkReset(f"the Replicate call to {self.key[1]} failed: {err!r}"))
            return
        finally:
            await answers.aclose()
        self._finish(None)

    async def _deliver(self, requests: AsyncIterator[replication_pb2.ReplicateRequest]
                       ) -> AsyncIterator[replication_pb2.ReplicateRequest]:
        async for request in _delayed(requests, self._faults):
            if self._done or self._faults().drop_requests:
                continue
            for tap in self._network.taps:
                tap(self.key[0], self.key[1], request)
            yield request

    def _ended(self) -> None:
        self._network._closed(self)

    def _break(self, end: BaseException) -> None:
        if not self._done:
            self._finish(end)
            self.task.cancel()


_Item = TypeVar("_Item")


async def _delayed(items: AsyncIterator[_Item], faults: Callable[[], LinkFaults]
                   ) -> AsyncIterator[_Item]:
    """`items`, each once `faults().delay_s` has passed since it came (in order; items that
    come meanwhile wait together, not one after another)."""
    loop = asyncio.get_running_loop()
    came: asyncio.Queue[tuple[float, _Item] | Exception | None] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for item in items:
                came.put_nowait((loop.time(), item))
        except Exception as err:
            came.put_nowait(err)
            return
        came.put_nowait(None)

    task = loop.create_task(pump())
    try:
        while (entry := await came.get()) is not None:
            if isinstance(entry, Exception):
                raise entry
            came_at, item = entry
            wait_s = came_at + faults().delay_s - loop.time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            yield item
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
