"""The simulated network between nodes (and the client): latency, partitions, slow and lossy
links, connection resets and crashed peers, in virtual time, with seeded randomness.

Every link is modelled as TCP under gRPC carries it, per direction (a, b):
- a message takes the link's latency plus seeded jitter; with probability `loss_p` it is
  retransmitted, arriving `retransmit_s` later. Messages of one call arrive in order.
- a *blocked* direction (a partition, full, one-way or bridged) holds what is sent: it arrives
  once the direction is open again, unless the call ends first. A stream call held longer than
  `stall_reset_s` breaks (keepalive), losing what it held.
- a crashed node refuses: calls to it fail at once, its open calls break;
- with probability `dup_p` a unary request runs twice on the callee (as a retry below the
  caller would make it); the caller sees the first answer.

Unary calls (`unary`) run the callee's handler as a task of the callee's incarnation, so a crash
cancels it; the caller's deadline cancels it too, as gRPC does. Stream calls (`transport(node)`)
implement `LinkTransport` (node/replication/links.py) by driving the callee's
`ReplicationService.replicate`, the body of the real Replicate servicer, as
node/replication/memory_link.py does, with the per-message timing above.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from raftlog.base.errors import RaftlogError, Reason
from raftlog.chaos.sim.trace import Trace
from raftlog.internal import replication_pb2
from raftlog.node.replication.links import LinkReset, LinkTransport
from raftlog.node.replication.memory_link import QueuedCall, ReplicaEndpoint

T = TypeVar("T")
CLIENT = "client"  # the endpoint the workload's clients send from
stall_reset_s = 2.0  # a stream call held this long by a blocked direction breaks (keepalive)


@dataclass
class LinkSettings:
    """How one direction of one link behaves (seconds, probability)."""

    latency_s: float = 0.001
    jitter_s: float = 0.001
    loss_p: float = 0.0
    retransmit_s: float = 0.2  # about TCP's minimum retransmission timeout
    dup_p: float = 0.0  # a unary request delivered twice (a retry below the caller)


class SimNetwork:
    """Endpoints, their incarnations and the state of every link; see the module docstring."""

    def __init__(self, *, rng: random.Random, trace: Trace, base: LinkSettings) -> None:
        self._rng = rng
        self.trace = trace
        self._base = base
        self._settings: dict[tuple[str, str], LinkSettings] = {}
        self._blocked: set[tuple[str, str]] = set()
        self._contexts: dict[str, contextvars.Context] = {}
        self._endpoints: dict[str, ReplicaEndpoint] = {}
        self._calls: list[SimLinkCall] = []
        self._changed: asyncio.Future[None] | None = None
        self.root = contextvars.copy_context()  # the simulator's own tasks run in this one

    # ----------------------------------------------------------------- endpoints

    def attach(self, node: str, *, context: contextvars.Context,
               endpoint: ReplicaEndpoint | None) -> None:
        """A node incarnation is up: its calls run in `context`."""
        self._contexts[node] = context
        if endpoint is not None:
            self._endpoints[node] = endpoint

    def detach(self, node: str) -> None:
        """The node crashed: it refuses calls and every call to or from it breaks."""
        self._contexts.pop(node, None)
        self._endpoints.pop(node, None)
        for call in list(self._calls):
            if node in call.key:
                call.reset(f"{node} went away")

    def is_up(self, node: str) -> bool:
        return node == CLIENT or node in self._contexts

    def context(self, node: str) -> contextvars.Context:
        return self._contexts.get(node, self.root)

    # ----------------------------------------------------------------- faults

    def settings(self, a: str, b: str) -> LinkSettings:
        return self._settings.get((a, b), self._base)

    def set_link(self, a: str, b: str, settings: LinkSettings) -> None:
        self._settings[(a, b)] = settings
        self._notify()

    def block(self, pairs: set[tuple[str, str]]) -> None:
        """From now on these directions hold what is sent (in addition to those blocked)."""
        self._blocked |= pairs
        self._notify()

    def heal(self) -> None:
        """No partition and no slow link any more."""
        self._blocked.clear()
        self._settings.clear()
        self._notify()

    def reset_calls(self, a: str, b: str) -> int:
        """Breaks the stream calls between a and b (either way), as a connection reset does."""
        broken = [call for call in self._calls if set(call.key) == {a, b}]
        for call in broken:
            call.reset(f"connection between {a} and {b} reset")
        return len(broken)

    def blocked(self, a: str, b: str) -> bool:
        return (a, b) in self._blocked

    def reachable(self, a: str, b: str) -> bool:
        """Both up, and both directions open."""
        return self.is_up(a) and self.is_up(b) and not self.blocked(a, b) \
            and not self.blocked(b, a)

    def _notify(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None and not changed.done():
            changed.set_result(None)

    async def wait_change(self, timeout_s: float) -> None:
        """Until the faults change, at most `timeout_s`."""
        if self._changed is None:
            self._changed = asyncio.get_running_loop().create_future()
        await asyncio.wait([self._changed], timeout=timeout_s)

    # ----------------------------------------------------------------- timing

    def transit_s(self, a: str, b: str) -> float:
        """One message's time on the link a -> b (seeded)."""
        link = self.settings(a, b)
        seconds = link.latency_s + link.jitter_s * self._rng.random()
        if link.loss_p and self._rng.random() < link.loss_p:
            seconds += link.retransmit_s
        return seconds

    async def cross(self, a: str, b: str) -> None:
        """One message from a to b: held while the direction is blocked, then its transit."""
        while self.blocked(a, b):
            await self.wait_change(stall_reset_s)
        await asyncio.sleep(self.transit_s(a, b))

    # ----------------------------------------------------------------- unary calls

    async def unary(self, a: str, b: str, serve: Callable[[], Awaitable[T]], *,
                    timeout_s: float, what: str) -> T:
        """`serve()` run on node b for a caller on a: the answer, or its RaftlogError; TIMEOUT
        at the deadline (the handler is then cancelled), FORWARD_FAILED when b is down or goes
        down meanwhile."""
        try:
            async with asyncio.timeout(timeout_s):  # no extra task, unlike wait_for
                return await self._unary(a, b, serve, what)
        except TimeoutError:
            raise RaftlogError(Reason.TIMEOUT, f"{what}: {b} did not answer {a} within "
                               f"{timeout_s} s") from None

    async def _unary(self, a: str, b: str, serve: Callable[[], Awaitable[T]], what: str) -> T:
        if not self.is_up(b):
            await asyncio.sleep(self.transit_s(a, b))
            raise RaftlogError(Reason.FORWARD_FAILED, f"{what}: {b} refused the connection")
        await self.cross(a, b)
        if not self.is_up(b):
            raise RaftlogError(Reason.FORWARD_FAILED, f"{what}: {b} went away")
        loop = asyncio.get_running_loop()
        task: asyncio.Task[T] = loop.create_task(_call(serve), context=self.context(b))
        task.add_done_callback(_discard)  # its outcome may go unread: the caller's deadline
        if self.settings(a, b).dup_p and self._rng.random() < self.settings(a, b).dup_p:
            loop.call_later(self.transit_s(a, b), self._again, b, serve, what)
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            task.cancel()  # the caller's deadline: the handler stops too
            raise
        if task.cancelled():
            raise RaftlogError(Reason.FORWARD_FAILED, f"{what}: {b} went away")
        await self.cross(b, a)
        return task.result()

    def _again(self, b: str, serve: Callable[[], Awaitable[T]], what: str) -> None:
        """The duplicate of a unary request: run on b if it is up; its answer goes nowhere."""
        if not self.is_up(b):
            return
        self.trace.note("duplicate", f"{what} to {b}")
        task = asyncio.get_running_loop().create_task(_call(serve), context=self.context(b))
        task.add_done_callback(_discard)

    # ----------------------------------------------------------------- stream calls

    def transport(self, node: str) -> SimLinkTransport:
        return SimLinkTransport(self, node)

    def endpoint(self, node: str) -> ReplicaEndpoint | None:
        return self._endpoints.get(node)

    def opened(self, call: SimLinkCall) -> None:
        self._calls.append(call)

    def closed(self, call: SimLinkCall) -> None:
        if call in self._calls:
            self._calls.remove(call)


async def _call(serve: Callable[[], Awaitable[T]]) -> T:
    return await serve()


def _discard(task: asyncio.Task[Any]) -> None:
    """Marks a finished handler's outcome as read (a duplicate's, or one whose caller gave up
    first), so that asyncio does not report it as never retrieved."""
    if not task.cancelled():
        task.exception()


class SimLinkTransport:
    """The `LinkTransport` of one node on a SimNetwork."""

    def __init__(self, network: SimNetwork, node: str) -> None:
        self._network = network
        self.node = node

    def open(self, node_id: str,
             requests: AsyncIterator[replication_pb2.ReplicateRequest]) -> SimLinkCall:
        return SimLinkCall(self._network, self.node, node_id, requests)


_END = object()  # the callee ended the call


class _Pipe:
    """One direction of a stream call: messages in order, each arriving at
    max(sent + transit, the previous arrival), held while the direction is blocked. Driven by
    loop timers, not a task (the hot path of a run)."""

    def __init__(self, network: SimNetwork, a: str, b: str, deliver: Callable[[object], None],
                 on_stall: Callable[[str], None]) -> None:
        self._network = network
        self._a, self._b = a, b
        self._deliver = deliver
        self._on_stall = on_stall
        self._items: collections.deque[tuple[float, object]] = collections.deque()
        self._last_at_s = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._stall: asyncio.Task[None] | None = None
        self._closed = False

    def send(self, item: object) -> None:
        loop = asyncio.get_running_loop()
        at_s = max(loop.time() + self._network.transit_s(self._a, self._b), self._last_at_s)
        self._last_at_s = at_s
        self._items.append((at_s, item))
        if self._timer is None and self._stall is None and not self._closed:
            self._arm(loop)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = loop.call_at(self._items[0][0], self._due, context=self._network.root)

    def _due(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        while self._items and self._items[0][0] <= loop.time() and not self._closed:
            if self._network.blocked(self._a, self._b):
                self._stall = loop.create_task(self._held(), context=self._network.root)
                return
            self._deliver(self._items.popleft()[1])
        if self._items and not self._closed:
            self._arm(loop)

    async def _held(self) -> None:
        """The direction is blocked: wait for it to open (then go on) or break the call."""
        loop = asyncio.get_running_loop()
        stalled_at_s = loop.time()
        while self._network.blocked(self._a, self._b):
            remaining_s = stalled_at_s + stall_reset_s - loop.time()
            if remaining_s <= 0:
                self._on_stall(f"{self._a} -> {self._b} held for {stall_reset_s} s")
                return
            await self._network.wait_change(remaining_s)
        self._stall = None
        self._due()

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._stall is not None and self._stall is not asyncio.current_task():
            self._stall.cancel()


class SimLinkCall(QueuedCall):
    """One Replicate call from node a to node b (a `LinkCall`)."""

    def __init__(self, network: SimNetwork, a: str, b: str,
                 requests: AsyncIterator[replication_pb2.ReplicateRequest]) -> None:
        super().__init__()
        self._network = network
        self.key = (a, b)
        self._inbound: asyncio.Queue[replication_pb2.ReplicateRequest | None] = asyncio.Queue()
        self._up = _Pipe(network, a, b, self._arrive, self.reset)
        self._down = _Pipe(network, b, a, self._answer, self.reset)
        loop = asyncio.get_running_loop()
        self._handler: asyncio.Task[None] | None = None
        network.opened(self)
        self._reader = loop.create_task(self._read(requests), name=f"sim-link-{a}-{b}")
        endpoint = network.endpoint(b)
        if endpoint is None:
            self._down.send(LinkReset(f"{b} refused the connection from {a}"))
            return
        self._handler = loop.create_task(self._serve(endpoint), context=network.context(b))

    async def _read(self, requests: AsyncIterator[replication_pb2.ReplicateRequest]) -> None:
        async for request in requests:
            if self._done:
                return
            self._network.trace.fold(f"rq {self.key[0]}>{self.key[1]} {request.stream} "
                                     f"{request.first_seq} {len(request.messages)} "
                                     f"{request.request_id}")
            self._up.send(request)

    def _arrive(self, item: object) -> None:
        if isinstance(item, replication_pb2.ReplicateRequest):
            self._inbound.put_nowait(item)

    async def _requests(self) -> AsyncIterator[replication_pb2.ReplicateRequest]:
        while True:
            request = await self._inbound.get()
            if request is None:
                return
            yield request

    async def _serve(self, endpoint: ReplicaEndpoint) -> None:
        answers = endpoint.replicate(self._requests())
        try:
            async for ack in answers:
                self._down.send(ack)
            self._down.send(_END)
        except asyncio.CancelledError:
            self.reset(f"{self.key[1]} went away")
            raise
        except Exception as err:  # the handler failed: the call ends with an error status
            self._down.send(LinkReset(f"the Replicate call to {self.key[1]} failed: {err!r}"))
        finally:
            await answers.aclose()

    def _answer(self, item: object) -> None:
        if self._done:
            return
        if item is _END:
            self._finish(None)
        elif isinstance(item, BaseException):
            self._finish(item)
        elif isinstance(item, replication_pb2.ReplicateAck):
            self._answers.put_nowait(item)

    def _ended(self) -> None:
        self._network.closed(self)
        for pipe in (self._up, self._down):
            pipe.close()
        self._reader.cancel()
        if self._handler is not None:
            self._handler.cancel()


if TYPE_CHECKING:
    def _keeps_the_protocol(transport: SimLinkTransport) -> LinkTransport:
        return transport  # mypy checks here that the transport has the protocol's shape
