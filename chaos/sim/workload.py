"""The simulated clients: publishers that give every message a msg_id and retry it until it is
acknowledged (sometimes to two nodes at once), readers that read acknowledged seqs back, and
consumers that fetch and ack (leaving some unacked, to be redelivered) and, once the publishers
are done, drain; all record what the cluster told them in a `History` for the checks
(checks.py).

A client talks to any node (the one that acknowledged its last publish, or a seeded random
one); the node forwards to the stream's primary. Every call has a deadline; a timeout leaves
the outcome unknown, so the retry with the same msg_id must be deduplicated (G6).
"""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from raftlog.base.errors import RaftlogError
from raftlog.chaos.sim.network import CLIENT, SimNetwork
from raftlog.chaos.sim.node import Served, SimNode
from raftlog.chaos.sim.trace import Trace
from raftlog.v1 import streams_pb2

T = TypeVar("T")
client_timeout_s = 1.0  # one client call's deadline
publish_attempts_max = 200  # attempts of one message before the publisher gives up on it
retry_backoff_s_min = 0.02  # a failed attempt is retried after a seeded wait in this range
retry_backoff_s_max = 0.2
publish_pause_s_max = 0.05  # between two messages of one publisher, seeded
hedge_p = 0.05  # a publish sent to two nodes at once (a hedged request)
hint_p = 0.7  # a call goes to the node that answered last (else to a seeded random node)
read_pause_s_max = 0.1  # between two reads of one reader, seeded
payload_bytes = 24
CONSUMER = "c"  # the durable consumer of every stream
consumer_ack_wait_ms = 500  # its ack wait: unacked deliveries come back this soon
fetch_batch = 10  # messages one fetch asks for
fetch_wait_ms = 100  # how long one fetch waits for a message
ack_skip_p = 0.1  # a delivered message the consumer does not ack (redelivered later)
drain_idle_fetches = consumer_ack_wait_ms // fetch_wait_ms + 3  # empty fetches in a row that
# end a drain: longer than the ack wait, so nothing left unacked is still to come


@dataclass(frozen=True)
class Delivery:
    stream: str
    served: Served  # seq, msg_id, payload, the node and its epoch
    fetch_sent_s: float


@dataclass(frozen=True)
class AckDone:
    """A consumer ack the cluster acknowledged: these seqs are done from `acked_s` on."""

    stream: str
    seqs: tuple[int, ...]
    acked_s: float


@dataclass
class History:
    """What the clients were told."""

    sent: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # msg_id -> stream, payload
    acks: dict[str, list[Served]] = field(default_factory=dict)  # msg_id -> every ack
    reads: list[tuple[str, Served]] = field(default_factory=list)  # (stream, what was read)
    deliveries: list[Delivery] = field(default_factory=list)
    consumer_acks: list[AckDone] = field(default_factory=list)
    drained: set[str] = field(default_factory=set)  # streams whose consumer drained
    attempts: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    gave_up: list[str] = field(default_factory=list)

    def acked_seqs(self, stream: str) -> list[int]:
        return [served.seq for msg_id, acks in self.acks.items()
                if self.sent[msg_id][0] == stream for served in acks]


class Clients:
    """The publishers, readers and consumers of one run."""

    def __init__(self, *, nodes: dict[str, SimNode], network: SimNetwork, rng: random.Random,
                 trace: Trace, streams: tuple[str, ...], history: History) -> None:
        self._nodes = nodes
        self._network = network
        self._rng = rng
        self._trace = trace
        self._streams = streams
        self.history = history
        self.stopping = False  # no new messages once the faults are over
        self.draining = False  # the publishers are done: consumers drain and stop
        self._hints: dict[str, str] = {}  # stream -> the node that acknowledged last

    def _pick(self, stream: str) -> str:
        hint = self._hints.get(stream)
        if hint is not None and self._rng.random() < hint_p:
            return hint
        return self._rng.choice(sorted(self._nodes))

    async def _call(self, node: str, what: str, serve: Callable[[SimNode], Awaitable[T]]) -> T:
        async def run() -> T:
            return await serve(self._nodes[node])

        return await self._network.unary(CLIENT, node, run, timeout_s=client_timeout_s,
                                         what=what)

    # ----------------------------------------------------------------- publishers

    async def publisher(self, index: int) -> None:
        stream = self._streams[index % len(self._streams)]
        count = 0
        while not self.stopping:
            msg_id = f"p{index}-{count}"
            payload = f"{msg_id}|".encode().ljust(payload_bytes, b".")
            self.history.sent[msg_id] = (stream, payload)
            await self._publish(stream, msg_id, payload)
            count += 1
            await asyncio.sleep(self._rng.uniform(0, publish_pause_s_max))

    async def _publish(self, stream: str, msg_id: str, payload: bytes) -> None:
        request = streams_pb2.PublishRequest(stream=stream, subject=f"sim.{stream}",
                                             payload=payload, msg_id=msg_id)
        for _ in range(publish_attempts_max):
            targets = [self._pick(stream)]
            if self._rng.random() < hedge_p:
                targets.append(self._rng.choice(sorted(self._nodes)))
            outcomes = await asyncio.gather(*(self._attempt(node, msg_id, request)
                                              for node in targets))
            if any(outcomes):
                return
            await asyncio.sleep(self._rng.uniform(retry_backoff_s_min, retry_backoff_s_max))
        self.history.gave_up.append(msg_id)

    async def _attempt(self, node: str, msg_id: str,
                       request: streams_pb2.PublishRequest) -> bool:
        self.history.attempts += 1
        try:
            served = await self._call(node, "client Publish",
                                      lambda target: target.serve_publish(request, hops=0))
        except RaftlogError as err:
            self.history.errors[err.reason.name] += 1
            self._trace.fold(f"pub {msg_id} {node} {err.reason.name}")
            return False
        self.history.acks.setdefault(msg_id, []).append(served)
        self._hints[request.stream] = served.node
        self._trace.note("ack", f"{msg_id} seq {served.seq} by {served.node} epoch "
                         f"{served.epoch}{' dup' if served.duplicate else ''}")
        return True

    # ----------------------------------------------------------------- readers

    async def reader(self, index: int) -> None:
        stream = self._streams[index % len(self._streams)]
        while not self.stopping:
            await asyncio.sleep(self._rng.uniform(0, read_pause_s_max))
            acked = self.history.acked_seqs(stream)
            if not acked:
                continue
            seq = self._rng.randint(1, max(acked))
            node = self._pick(stream)

            def read(target: SimNode, seq: int = seq) -> Awaitable[Served]:
                return target.serve_read(stream, seq, hops=0)

            try:
                served = await self._call(node, "client GetMessage", read)
            except RaftlogError as err:
                self.history.errors[f"read:{err.reason.name}"] += 1
                continue
            self.history.reads.append((stream, served))
            self._trace.fold(f"read {stream} {seq} {served.msg_id} by {served.node}")


    # ----------------------------------------------------------------- consumers

    async def consumer(self, index: int) -> None:
        """Fetches and acks until the publishers are done and the consumer has drained."""
        stream = self._streams[index % len(self._streams)]
        loop = asyncio.get_running_loop()
        idle = 0
        while not (self.draining and idle >= drain_idle_fetches):
            node = self._pick(stream)
            sent_s = loop.time()
            try:
                served = await self._call(node, "client Fetch", lambda target: target.serve_fetch(
                    stream, CONSUMER, batch=fetch_batch, wait_ms=fetch_wait_ms, hops=0))
            except RaftlogError as err:
                self.history.errors[f"fetch:{err.reason.name}"] += 1
                await asyncio.sleep(self._rng.uniform(retry_backoff_s_min, retry_backoff_s_max))
                continue
            idle = 0 if served or not self.draining else idle + 1
            self.history.deliveries += [Delivery(stream, one, sent_s) for one in served]
            for one in served:
                self._trace.fold(f"deliver {stream} {one.seq} {one.msg_id} by {one.node}")
            chosen = [one.seq for one in served if self._rng.random() >= ack_skip_p]
            if chosen:
                await self._ack(node, stream, chosen)
        self.history.drained.add(stream)

    async def _ack(self, node: str, stream: str, seqs: list[int]) -> None:
        try:
            done = await self._call(node, "client Ack", lambda target: target.serve_ack(
                stream, CONSUMER, seqs, hops=0))
        except RaftlogError as err:
            self.history.errors[f"ack:{err.reason.name}"] += 1
            return
        self.history.consumer_acks.append(AckDone(stream, tuple(done),
                                                  asyncio.get_running_loop().time()))
        self._trace.fold(f"acked {stream} {done}")
