"""A seeded, bounded workload for a raftlog cluster, and the checker of what it recorded.

Independent of pytest: the failover tests, `scripts/bench_failover.py` and the chaos harness
all drive it. It owns four things:

- `Publisher`: publishes uniquely identified messages to one stream (unary `Publish`, or
  `PublishBatch` of K) through a list of nodes, moving to the next node on failure and retrying
  with the SAME msg_id after a bounded backoff, so that dedupe keeps a retried message once. It
  records every attempt and every acknowledged (msg_id, seq).
- `Consumer`: a fetch + ack loop on a durable consumer through any node; it records every
  delivery (seq, msg_id, deliver_count) and every ack the server acknowledged.
- Collectors (`read_stream`, `read_replicas`, `wait_replicas_converged`): what the cluster holds
  now, through the public API and through `ReadLocal` on every node.
- `check(...)`: pure (histories + collected state in, a `Report` out). It reports acknowledged
  messages missing or at another seq than acknowledged, duplicates, gaps, deliveries of messages
  that are not stored (uncommitted reads), acks acknowledged and then undone, and replicas that
  differ on the committed prefix. A failed report prints `reproduce with seed=...`.
  `failover_timing` measures the time from a fault to the first acknowledged publish after it.

A message's identity travels in its payload (`wl1|<msg_id>|<filler>`), so a copy stored without
its msg_id field (or under another seq) is still recognised. Everything is bounded: message
counts, run time, attempts per message, pages read, every call's deadline.

The module is longer than the ~800 lines CONVENTIONS.md suggests: the chaos harness imports one
module for clients, collectors and checker; it reads in five sections (Publisher, Consumer,
collecting, checking, failover timing).

The seed fixes the message ids, payloads, subjects, node order and backoff jitter; it cannot fix
the scheduling of processes, so a rerun with the same seed makes the same requests, not
necessarily the same interleaving.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import os
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from raftlog.internal import replication_pb2, replication_pb2_grpc, storage_pb2
from raftlog.node.api.batches import expand_results
from raftlog.node.transport.credentials import PEER_TOKEN_HEADER, Credential
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    consumers_pb2,
    consumers_pb2_grpc,
    streams_pb2,
    streams_pb2_grpc,
    types_pb2,
)

Clock = Callable[[], float]  # seconds, monotonic

SEED_ENV = "RAFTLOG_WORKLOAD_SEED"
PAYLOAD_MAGIC = b"wl1"
call_timeout_s_default = 1.0
backoff_s_initial = 0.01
backoff_s_max = 0.2
attempts_per_message_max = 10_000  # the run's time bound normally ends retries first
ack_attempts_max = 5
poll_period_s = 0.005
read_page_max = 1_000  # messages per ScanExactAtSubject / ReadLocal page
read_pages_max = 10_000
read_attempts_max = 20  # one read call, over every node, before a collector gives up
read_retry_s = 0.2
gap_probes_max = 200  # GetMessage probes of seqs the scans did not return
samples_shown = 10  # violations listed per kind in a summary
deliveries_max_default = 2_000_000

# Permanent failures: retrying the same request cannot help, so the publisher stops.
FATAL_REASONS = frozenset({
    "INVALID_NAME", "INVALID_SUBJECT", "INVALID_CONFIG", "INVALID_ARGUMENT",
    "SUBJECT_NOT_IN_STREAM", "MESSAGE_TOO_LARGE", "UNAUTHENTICATED", "PERMISSION_DENIED",
})

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


def seed_from_env(default: int | None = None) -> int:
    """$RAFTLOG_WORKLOAD_SEED, else `default`, else a fresh random seed."""
    text = os.environ.get(SEED_ENV, "")
    if text:
        return int(text, 0)
    return default if default is not None else random.SystemRandom().randrange(2**32)


def encode_payload(*, msg_id: str, size_bytes: int, rng: random.Random) -> bytes:
    head = PAYLOAD_MAGIC + b"|" + msg_id.encode() + b"|"
    filler = max(0, size_bytes - len(head))
    return head + bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz", k=filler))


def decode_payload(payload: bytes) -> str | None:
    """The msg_id a workload payload carries, or None when it is not one."""
    parts = payload.split(b"|", 2)
    if len(parts) < 3 or parts[0] != PAYLOAD_MAGIC:
        return None
    return parts[1].decode(errors="replace")


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


class _Backoff:
    """Doubling, jittered (seeded) sleeps between backoff_s_initial and backoff_s_max."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._next_s = backoff_s_initial

    def reset(self) -> None:
        self._next_s = backoff_s_initial

    async def sleep(self) -> None:
        await asyncio.sleep(self._next_s * (0.5 + self._rng.random()))
        self._next_s = min(backoff_s_max, self._next_s * 2)


# ---------------------------------------------------------------------------------------------
# Publisher


@dataclass(frozen=True)
class Attempt:
    """One message in one call. `seq` is 0 unless the call acknowledged the message."""

    msg_id: str
    node: str
    sent_at: float
    done_at: float
    seq: int = 0
    duplicate: bool = False
    error: str = ""


@dataclass(frozen=True)
class Ack:
    """An acknowledged publish: the server said msg_id is stored at seq."""

    msg_id: str
    seq: int
    duplicate: bool
    sent_at: float
    acked_at: float
    node: str


@dataclass
class PublishHistory:
    name: str
    stream: str
    seed: int
    sent: list[str] = field(default_factory=list)  # msg_ids in first-send order
    subjects: set[str] = field(default_factory=set)
    attempts: list[Attempt] = field(default_factory=list)
    acked: dict[str, Ack] = field(default_factory=dict)
    stopped_by: str = ""  # count | time | stop | fatal
    fatal_error: str = ""

    @property
    def unacked(self) -> list[str]:
        return [msg_id for msg_id in self.sent if msg_id not in self.acked]

    def errors(self) -> collections.Counter[str]:
        return collections.Counter(a.error for a in self.attempts if a.error)


@dataclass
class PublisherConfig:
    stream: str
    subject_prefix: str  # subjects are `<prefix>.<k>`, k < subjects
    name: str = "p"  # msg_ids are `<name>-<seed hex>-<n>`: unique per name and seed
    subjects: int = 1
    count_max: int = 10_000
    duration_s_max: float = 60.0
    batch_size: int = 1  # 1 = unary Publish; K > 1 = PublishBatch of K
    payload_bytes: int = 64
    rate_per_s: float | None = None  # messages per second; None = as fast as acks come
    call_timeout_s: float = call_timeout_s_default
    use_msg_id: bool = True  # False: no dedupe, so a retry may store a message twice
    first_node: str = ""  # the address to start on; '' = one picked by the seed


class Publisher:
    """`history = await Publisher(addresses, config, seed=s).run()`; `stop()` ends it early."""

    def __init__(self, addresses: Sequence[str], config: PublisherConfig, *, seed: int,
                 clock: Clock = time.monotonic) -> None:
        self.config = config
        self.seed = seed
        self.clock = clock
        self._rng = random.Random(f"{seed}:{config.name}")
        start = self._rng.randrange(len(addresses))
        if config.first_node:
            start = list(addresses).index(config.first_node)
        self._nodes = Nodes(addresses, start=start)
        self._backoff = _Backoff(self._rng)
        self._stopping = False
        self.history = PublishHistory(name=config.name, stream=config.stream, seed=seed)

    def stop(self) -> None:
        """Ends the run after the call in flight (its message may stay unacknowledged)."""
        self._stopping = True

    async def run(self) -> PublishHistory:
        history, config = self.history, self.config
        deadline = self.clock() + config.duration_s_max
        next_send_at = self.clock()
        try:
            while not history.stopped_by:
                if self._stopping:
                    history.stopped_by = "stop"
                elif len(history.sent) >= config.count_max:
                    history.stopped_by = "count"
                elif self.clock() >= deadline:
                    history.stopped_by = "time"
                else:
                    next_send_at = await self._pace(next_send_at)
                    if not self._stopping:  # stop() may come during the pause
                        await self._deliver(self._new_messages(), deadline=deadline)
        finally:
            await self._nodes.close()
        return history

    async def _pace(self, next_send_at: float) -> float:
        if self.config.rate_per_s is None:
            return next_send_at
        now = self.clock()
        if next_send_at > now:
            await asyncio.sleep(next_send_at - now)
        return max(next_send_at, now) + self.config.batch_size / self.config.rate_per_s

    def _new_messages(self) -> list[streams_pb2.PublishEntry]:
        config, history = self.config, self.history
        count = min(config.batch_size, config.count_max - len(history.sent))
        entries = []
        for _ in range(count):
            msg_id = f"{config.name}-{self.seed:x}-{len(history.sent) + 1}"
            subject = f"{config.subject_prefix}.{self._rng.randrange(config.subjects)}"
            payload = encode_payload(msg_id=msg_id, size_bytes=config.payload_bytes, rng=self._rng)
            entries.append(streams_pb2.PublishEntry(
                subject=subject, payload=payload, msg_id=msg_id if config.use_msg_id else ""))
            history.sent.append(msg_id)
            history.subjects.add(subject)
        return entries

    async def _deliver(self, entries: list[streams_pb2.PublishEntry], *, deadline: float) -> None:
        """Sends `entries` until each is acknowledged, the run ends, or attempts run out."""
        pending = entries
        for _ in range(attempts_per_message_max):
            if not pending or self._stopping or self.clock() >= deadline:
                return
            node, sent_at = self._nodes.current, self.clock()
            outcomes = await self._call(pending)
            done_at = self.clock()
            failed = []
            for entry, (seq, duplicate, error) in zip(pending, outcomes, strict=True):
                msg_id = _entry_id(entry)
                self.history.attempts.append(
                    Attempt(msg_id, node, sent_at, done_at, seq, duplicate, error))
                if seq:
                    self.history.acked[msg_id] = Ack(msg_id, seq, duplicate, sent_at, done_at, node)
                else:
                    failed.append(entry)
                    if error in FATAL_REASONS:
                        self.history.fatal_error = error
                        self.history.stopped_by = "fatal"
                        self._stopping = True
            pending = failed
            if pending:
                self._nodes.rotate()
                await self._backoff.sleep()
            else:
                self._backoff.reset()

    async def _call(self, entries: list[streams_pb2.PublishEntry]) -> list[tuple[int, bool, str]]:
        """(seq or 0, duplicate, error) per entry."""
        config = self.config
        stub = self._nodes.streams()
        try:
            if config.batch_size == 1:
                [entry] = entries
                ack = await stub.Publish(_as_request(entry, stream=config.stream),
                                         timeout=config.call_timeout_s)
                return [(int(ack.seq), bool(ack.duplicate), "")]
            response = await stub.PublishBatch(
                streams_pb2.PublishBatchRequest(stream=config.stream, entries=entries),
                timeout=config.call_timeout_s)
        except grpc.RpcError as exc:
            return [(0, False, error_name(exc))] * len(entries)
        results = expand_results(response)
        if len(results) != len(entries):
            return [(0, False, "RESULT_COUNT_MISMATCH")] * len(entries)
        return [(int(r.ack.seq), bool(r.ack.duplicate), "") if r.HasField("ack")
                else (0, False, r.error.reason or "ERROR") for r in results]

    # -- waiting on progress (for tests and benchmarks) ----------------------------------

    async def wait_acked(self, count: int, *, timeout_s: float) -> bool:
        """Until at least `count` messages are acknowledged; False at the timeout."""
        return await _poll(lambda: len(self.history.acked) >= count, timeout_s, self.clock)

    async def wait_ack_sent_after(self, at: float, *, timeout_s: float) -> float | None:
        """Until a publish SENT at or after `at` is acknowledged; seconds from `at` to that
        ack, or None at the timeout or when the run ended first."""
        cursor = 0
        found: list[float] = []

        def scan() -> bool:  # attempts are appended in send order: scan each one once
            nonlocal cursor
            attempts = self.history.attempts
            while cursor < len(attempts) and not found:
                attempt = attempts[cursor]
                cursor += 1
                if attempt.seq and attempt.sent_at >= at:
                    found.append(attempt.done_at - at)
            return bool(found) or bool(self.history.stopped_by)

        await _poll(scan, timeout_s, self.clock)
        return found[0] if found else None


def _entry_id(entry: streams_pb2.PublishEntry) -> str:
    return entry.msg_id or decode_payload(entry.payload) or ""


def _as_request(entry: streams_pb2.PublishEntry, *, stream: str) -> streams_pb2.PublishRequest:
    return streams_pb2.PublishRequest(stream=stream, subject=entry.subject,
                                      payload=entry.payload, msg_id=entry.msg_id)


async def _poll(predicate: Callable[[], bool], timeout_s: float, clock: Clock) -> bool:
    deadline = clock() + timeout_s
    while not predicate():
        if clock() >= deadline:
            return False
        await asyncio.sleep(poll_period_s)
    return True


# ---------------------------------------------------------------------------------------------
# Consumer


@dataclass(frozen=True)
class Delivery:
    seq: int
    msg_id: str  # from the payload (the msg_id field when the payload is not a workload's)
    deliver_count: int
    fetch_sent_at: float
    received_at: float
    node: str


@dataclass(frozen=True)
class AckDone:
    """An Ack call the server answered OK: these seqs are acknowledged from `acked_at` on."""

    seqs: tuple[int, ...]
    sent_at: float
    acked_at: float
    node: str


@dataclass
class ConsumeHistory:
    name: str
    stream: str
    deliveries: list[Delivery] = field(default_factory=list)
    acks: list[AckDone] = field(default_factory=list)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    drained: bool = False  # ended with nothing pending and nothing awaiting ack
    stopped_by: str = ""  # stop | drained | time | limit
    final_state: consumers_pb2.ConsumerState | None = None


@dataclass
class ConsumerConfig:
    stream: str
    name: str = "wl"
    batch: int = 100
    max_wait_ms: int = 100
    ack_wait_ms: int = 5_000
    max_ack_pending: int = 10_000
    call_timeout_s: float = call_timeout_s_default
    duration_s_max: float = 120.0
    deliveries_max: int = deliveries_max_default


class Consumer:
    """`await consumer.create()`, then `history = await consumer.run()` in a task;
    `stop(drain_timeout_s=...)` ends it, after draining what is pending when asked to."""

    def __init__(self, addresses: Sequence[str], config: ConsumerConfig, *, seed: int,
                 clock: Clock = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self._rng = random.Random(f"{seed}:consumer:{config.name}")
        self._nodes = Nodes(addresses, start=self._rng.randrange(len(addresses)))
        self._backoff = _Backoff(self._rng)
        self._stop_at: float | None = None
        self._drain = False
        self.history = ConsumeHistory(name=config.name, stream=config.stream)

    async def create(self, *, attempts_max: int = read_attempts_max) -> None:
        """Creates the durable consumer (DELIVER_POLICY_ALL); an existing one is kept."""
        config = self.config
        request = consumers_pb2.CreateConsumerRequest(
            stream=config.stream,
            config=consumers_pb2.ConsumerConfig(
                name=config.name, ack_wait_ms=config.ack_wait_ms,
                max_ack_pending=config.max_ack_pending))
        try:
            await _rpc(self._nodes, "consumers", "CreateConsumer", request,
                       timeout_s=config.call_timeout_s * 5, attempts_max=attempts_max)
        except grpc.RpcError as exc:
            if error_name(exc) != "CONSUMER_EXISTS":
                raise

    def stop(self, *, drain_timeout_s: float = 0.0) -> None:
        """Ends the run; with a drain time, first until nothing is pending or awaiting ack."""
        self._drain = drain_timeout_s > 0
        self._stop_at = self.clock() + drain_timeout_s

    async def run(self) -> ConsumeHistory:
        deadline = self.clock() + self.config.duration_s_max
        history = self.history
        try:
            while not history.stopped_by:
                if self.clock() >= deadline:
                    history.stopped_by = "time"
                elif len(history.deliveries) >= self.config.deliveries_max:
                    history.stopped_by = "limit"
                elif self._stop_at is not None and (not self._drain
                                                    or self.clock() >= self._stop_at):
                    history.stopped_by = "stop"
                else:
                    await self._step()
            history.final_state = await self._state()
        finally:
            await self._nodes.close()
        return history

    async def _step(self) -> None:
        config, node = self.config, self._nodes.current
        sent_at = self.clock()
        try:
            response = await self._nodes.consumers().Fetch(
                consumers_pb2.FetchRequest(stream=config.stream, consumer=config.name,
                                           batch=config.batch, max_wait_ms=config.max_wait_ms),
                timeout=config.call_timeout_s + config.max_wait_ms / 1000)
        except grpc.RpcError as exc:
            self.history.errors[f"fetch:{error_name(exc)}"] += 1
            self._nodes.rotate()
            await self._backoff.sleep()
            return
        self._backoff.reset()
        received_at = self.clock()
        for message in response.messages:
            msg_id = decode_payload(message.payload) or message.msg_id
            self.history.deliveries.append(Delivery(
                int(message.seq), msg_id, int(message.deliver_count), sent_at, received_at, node))
        if response.messages:
            await self._ack(tuple(int(m.seq) for m in response.messages))
        elif self._drain and self._stop_at is not None and await self._is_drained():
            self.history.drained = True
            self.history.stopped_by = "drained"

    async def _ack(self, seqs: tuple[int, ...]) -> None:
        """Acks per seq: only the seqs the server accepted count as acknowledged; the ones it
        refused with a retryable (UNAVAILABLE) error are sent again."""
        for _ in range(ack_attempts_max):
            request = consumers_pb2.AckRequest(stream=self.config.stream,
                                               consumer=self.config.name, seqs=seqs)
            node, sent_at = self._nodes.current, self.clock()
            try:
                reply = await self._nodes.consumers().Ack(request,
                                                          timeout=self.config.call_timeout_s)
            except grpc.RpcError as exc:
                self.history.errors[f"ack:{error_name(exc)}"] += 1
                self._nodes.rotate()
                await self._backoff.sleep()
                continue
            refused = {r.seq: r.error for r in reply.results if r.HasField("error")}
            for error in refused.values():
                self.history.errors[f"ack-seq:{error.reason}"] += 1
            accepted = tuple(seq for seq in seqs if seq not in refused)
            if accepted:
                self.history.acks.append(AckDone(accepted, sent_at, self.clock(), node))
            seqs = tuple(seq for seq in seqs if seq in refused
                         and refused[seq].code == grpc.StatusCode.UNAVAILABLE.value[0])
            if not seqs:
                return
            await self._backoff.sleep()

    async def _info(self) -> consumers_pb2.ConsumerInfo:
        request = consumers_pb2.GetConsumerInfoRequest(stream=self.config.stream,
                                                       consumer=self.config.name)
        timeout_s = self.config.call_timeout_s
        info: consumers_pb2.ConsumerInfo = await _rpc(
            self._nodes, "consumers", "GetConsumerInfo", request, timeout_s=timeout_s,
            attempts_max=len(self._nodes.addresses))
        return info

    async def _is_drained(self) -> bool:
        try:
            state = (await self._info()).state
        except grpc.RpcError as exc:
            self.history.errors[f"info:{error_name(exc)}"] += 1
            return False
        return state.num_pending == 0 and state.num_ack_pending == 0

    async def _state(self) -> consumers_pb2.ConsumerState | None:
        try:
            return (await self._info()).state
        except grpc.RpcError as exc:
            self.history.errors[f"info:{error_name(exc)}"] += 1
            return None


# ---------------------------------------------------------------------------------------------
# Collecting what the cluster holds


class CollectError(Exception):
    """A collector could not read what it needs from any node."""


async def _rpc(nodes: Nodes, service: str, method: str, request: Any, *, timeout_s: float,
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


@dataclass(frozen=True)
class StoredView:
    seq: int
    subject: str
    msg_id: str  # the msg_id field as stored ('' when published without one)
    payload_id: str | None  # decoded from the payload; None when it is not a workload payload


@dataclass
class StreamContents:
    """The stream as the public API serves it (`read_stream`)."""

    stream: str
    first_seq: int
    last_seq: int
    commit_seq: int
    messages: dict[int, StoredView] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def visible_last_seq(self) -> int:
        """The last seq readers may see: the commit seq when the node reports one."""
        return min(self.last_seq, self.commit_seq) if self.commit_seq else self.last_seq


async def read_stream(addresses: Sequence[str], stream: str, *,
                      call_timeout_s: float = 5.0) -> StreamContents:
    """Every message of `stream`, read through any node: all its subjects (ListSubjectsByPrefix)
    scanned page by page, then GetMessage probes of seqs the scans did not return."""
    nodes = Nodes(addresses)
    try:
        info = await _rpc(nodes, "streams", "GetStreamInfo",
                          streams_pb2.GetStreamInfoRequest(name=stream), timeout_s=call_timeout_s)
        state = info.state
        contents = StreamContents(stream, int(state.first_seq), int(state.last_seq),
                                  int(state.commit_seq))
        listing = await _rpc(nodes, "streams", "ListSubjectsByPrefix",
                             streams_pb2.ListSubjectsByPrefixRequest(stream=stream, limit=100_000),
                             timeout_s=call_timeout_s)
        if listing.truncated:
            contents.notes.append("subject listing truncated; probing the rest by seq")
        for summary in listing.subjects:
            await _scan_subject(nodes, contents, summary.subject, call_timeout_s=call_timeout_s)
        await _probe_unseen(nodes, contents, call_timeout_s=call_timeout_s)
    except grpc.RpcError as exc:
        raise CollectError(f"cannot read stream {stream!r}: {error_name(exc)}") from exc
    finally:
        await nodes.close()
    return contents


def _view(message: types_pb2.Message) -> StoredView:
    return StoredView(int(message.seq), message.subject, message.msg_id,
                      decode_payload(message.payload))


async def _scan_subject(nodes: Nodes, contents: StreamContents, subject: str, *,
                        call_timeout_s: float) -> None:
    from_seq = 0
    for _ in range(read_pages_max):
        request = streams_pb2.ScanExactAtSubjectRequest(
            stream=contents.stream, subject=subject, from_seq=from_seq, limit=read_page_max)
        page = await _rpc(nodes, "streams", "ScanExactAtSubject", request,
                          timeout_s=call_timeout_s)
        for message in page.messages:
            contents.messages[int(message.seq)] = _view(message)
        if not page.next_seq or not page.messages:
            return
        from_seq = int(page.next_seq)
    contents.notes.append(f"scan of {subject!r} stopped after {read_pages_max} pages")


async def _probe_unseen(nodes: Nodes, contents: StreamContents, *, call_timeout_s: float) -> None:
    unseen = [seq for seq in range(contents.first_seq, contents.visible_last_seq + 1)
              if seq not in contents.messages]
    for seq in unseen[:gap_probes_max]:
        request = streams_pb2.GetMessageRequest(stream=contents.stream, seq=seq)
        try:
            message = await _rpc(nodes, "streams", "GetMessage", request,
                                 timeout_s=call_timeout_s)
        except grpc.RpcError as exc:
            if error_name(exc) == "MESSAGE_NOT_FOUND":
                continue
            raise
        contents.messages[seq] = _view(message)
    if len(unseen) > gap_probes_max:
        contents.notes.append(f"{len(unseen)} seqs unseen by the scans; probed {gap_probes_max}")


@dataclass(frozen=True)
class ReplicaCopy:
    """One node's local copy of a stream (ReadLocal): its position and stored bytes."""

    node: str
    address: str
    epoch: int
    first_seq: int
    last_seq: int
    commit_seq: int
    stored: dict[int, bytes]


@dataclass
class ReplicaSurvey:
    copies: list[ReplicaCopy] = field(default_factory=list)
    primary: str = ""  # node id, from ExplainRoute ('' when unknown)
    replicas: tuple[str, ...] = ()  # node ids the route names
    notes: list[str] = field(default_factory=list)

    @property
    def primary_commit_seq(self) -> int | None:
        for copy in self.copies:
            if copy.node == self.primary:
                return copy.commit_seq
        return None


async def read_replicas(addresses: Sequence[str], stream: str, *,
                        call_timeout_s: float = 5.0,
                        peer: PeerAccess | None = None) -> ReplicaSurvey:
    """ReadLocal on every node in `addresses` (on its peer listener, through `peer`); nodes
    without a copy, unreachable, or not serving ReadLocal are left out and named in `notes`."""
    survey = ReplicaSurvey()
    nodes = Nodes(addresses, peer=peer)
    try:
        try:
            route = await _rpc(nodes, "cluster", "ExplainRoute",
                               cluster_pb2.ExplainRouteRequest(stream=stream),
                               timeout_s=call_timeout_s, attempts_max=len(addresses))
            survey.primary, survey.replicas = route.primary, tuple(route.replicas)
        except grpc.RpcError as exc:
            survey.notes.append(f"ExplainRoute failed everywhere: {error_name(exc)}")
        for address in addresses:
            try:
                copy = await _read_copy(nodes, address, stream, call_timeout_s=call_timeout_s)
            except grpc.RpcError as exc:
                survey.notes.append(f"{address}: ReadLocal {error_name(exc)}")
                continue
            if copy is None:
                survey.notes.append(f"{address}: holds no copy of {stream!r}")
            else:
                survey.copies.append(copy)
    finally:
        await nodes.close()
    return survey


async def _read_copy(nodes: Nodes, address: str, stream: str, *,
                     call_timeout_s: float) -> ReplicaCopy | None:
    stub = nodes.replication(address)
    stored: dict[int, bytes] = {}
    from_seq = 1
    state = None
    for _ in range(read_pages_max):
        page = await stub.ReadLocal(replication_pb2.ReadLocalRequest(
            stream=stream, from_seq=from_seq, limit=read_page_max), timeout=call_timeout_s)
        state = page.state if state is None else state
        if not page.state.exists:
            return None
        for message in page.messages:
            stored[int(message.seq)] = bytes(message.stored)
        if not page.messages or page.messages[-1].seq >= state.last_seq:
            break
        from_seq = int(page.messages[-1].seq) + 1
    assert state is not None  # read_pages_max >= 1
    return ReplicaCopy(state.node_id or address, address, int(state.epoch), int(state.first_seq),
                       int(state.last_seq), int(state.commit_seq), stored)


async def wait_replicas_converged(addresses: Sequence[str], stream: str, *, copies_min: int,
                                  timeout_s: float, clock: Clock = time.monotonic,
                                  peer: PeerAccess | None = None) -> bool:
    """Until at least `copies_min` nodes hold the stream with one last_seq equal to one
    commit_seq (nothing in flight, nobody behind); False at the timeout or when the nodes do
    not serve GetReplicaState."""
    nodes = Nodes(addresses, peer=peer)
    request = replication_pb2.GetReplicaStateRequest(stream=stream)

    async def converged() -> bool:
        states = []
        for address in addresses:
            try:
                state = await nodes.replication(address).GetReplicaState(request, timeout=1.0)
            except grpc.RpcError as exc:
                if error_name(exc) == "UNIMPLEMENTED":
                    raise
                continue
            if state.exists:
                states.append((state.last_seq, state.commit_seq))
        return len(states) >= copies_min and len({seq for pair in states for seq in pair}) == 1

    deadline = clock() + timeout_s
    try:
        while clock() < deadline:
            if await converged():
                return True
            await asyncio.sleep(0.05)
    except grpc.RpcError:
        return False
    finally:
        await nodes.close()
    return False


async def wait_caught_up(addresses: Sequence[str], stream: str, *, replica: str,
                         timeout_s: float, clock: Clock = time.monotonic,
                         peer: PeerAccess | None = None) -> float | None:
    """Until the node at address `replica` holds everything its stream's primary had
    committed when asked just before it (so it works under a steady publisher); seconds
    taken, or None at the timeout."""
    nodes = Nodes(addresses, peer=peer)
    request = replication_pb2.GetReplicaStateRequest(stream=stream)
    started = clock()
    try:
        while clock() - started < timeout_s:
            try:
                route = await _rpc(nodes, "cluster", "ExplainRoute",
                                   cluster_pb2.ExplainRouteRequest(stream=stream), timeout_s=1.0,
                                   attempts_max=len(nodes.addresses))
                primary = await nodes.replication(route.primary_grpc_address).GetReplicaState(
                    request, timeout=1.0)
                copy = await nodes.replication(replica).GetReplicaState(request, timeout=1.0)
                if copy.exists and primary.commit_seq and copy.last_seq >= primary.commit_seq:
                    return clock() - started
            except grpc.RpcError:
                pass
            await asyncio.sleep(0.05)
    finally:
        await nodes.close()
    return None


# ---------------------------------------------------------------------------------------------
# Checking


@dataclass(frozen=True)
class WrongSeq:
    msg_id: str
    acked_seq: int
    stored_seqs: tuple[int, ...]


@dataclass(frozen=True)
class AckUndone:
    """`seq`'s ack was acknowledged at `acked_at`, yet a fetch sent later delivered it."""

    consumer: str
    seq: int
    acked_at: float
    redelivered_fetch_sent_at: float
    deliver_count: int


@dataclass(frozen=True)
class Divergence:
    seq: int
    kind: str  # missing | differs | api-differs
    nodes: tuple[str, ...]  # the nodes that disagree with the first copy (or lack the seq)


@dataclass
class Report:
    seed: int
    stream: str
    acked: int = 0
    present: int = 0  # acknowledged messages found at their seq
    acked_missing: list[str] = field(default_factory=list)
    acked_wrong_seq: list[WrongSeq] = field(default_factory=list)
    duplicates: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    gaps: list[tuple[int, int]] = field(default_factory=list)  # inclusive seq ranges
    corrupt: list[int] = field(default_factory=list)  # msg_id field disagrees with the payload
    delivered_not_stored: list[Delivery] = field(default_factory=list)
    acks_undone: list[AckUndone] = field(default_factory=list)
    ack_floor_behind: list[tuple[str, int, int]] = field(default_factory=list)
    undelivered: list[tuple[str, int]] = field(default_factory=list)
    divergence: list[Divergence] = field(default_factory=list)
    replicas_compared: int = 0
    replicas_required: int = 0
    committed_prefix: int = 0
    unacked_present: int = 0  # not acknowledged yet stored (ambiguous, not a violation)
    unacked_absent: int = 0
    notes: list[str] = field(default_factory=list)

    VIOLATIONS = ("acked_missing", "acked_wrong_seq", "duplicates", "gaps", "corrupt",
                  "delivered_not_stored", "acks_undone", "ack_floor_behind", "undelivered",
                  "divergence")

    def violations(self) -> dict[str, int]:
        """Count per kind of violation found; `replicas_short` when fewer copies were compared
        than required."""
        found = {name: len(getattr(self, name)) for name in self.VIOLATIONS}
        found["replicas_short"] = max(0, self.replicas_required - self.replicas_compared)
        return {name: count for name, count in found.items() if count}

    @property
    def ok(self) -> bool:
        return not self.violations()

    def summary(self) -> str:
        lines = [f"workload check of stream {self.stream!r}: "
                 f"{'clean' if self.ok else 'FAILED ' + str(self.violations())}",
                 f"  acked {self.acked}, present {self.present}, unacked present "
                 f"{self.unacked_present} / absent {self.unacked_absent}; replicas compared "
                 f"{self.replicas_compared} (required {self.replicas_required}) through seq "
                 f"{self.committed_prefix}"]
        for name in self.VIOLATIONS:
            values = getattr(self, name)
            if values:
                shown = ", ".join(str(v) for v in values[:samples_shown])
                hidden = len(values) - samples_shown
                more = f" (+{hidden} more)" if hidden > 0 else ""
                lines.append(f"  {name}: {shown}{more}")
        lines += [f"  note: {note}" for note in self.notes]
        if not self.ok:
            lines.append(f"  reproduce with seed={self.seed} ({SEED_ENV}={self.seed})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        counts = {name: len(getattr(self, name)) for name in self.VIOLATIONS}
        return {"ok": self.ok, "seed": self.seed, "stream": self.stream, "acked": self.acked,
                "present": self.present, **counts, "unacked_present": self.unacked_present,
                "unacked_absent": self.unacked_absent,
                "replicas_compared": self.replicas_compared,
                "committed_prefix": self.committed_prefix, "notes": self.notes}

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise CheckFailed(self.summary())


class CheckFailed(AssertionError):
    """A workload check found a violation; the message is the report's summary."""


def check(*, seed: int, contents: StreamContents, published: Sequence[PublishHistory] = (),
          consumed: Sequence[ConsumeHistory] = (), replicas: ReplicaSurvey | None = None,
          replicas_required: int = 0, full_prefix: bool = False, quiet: bool = False) -> Report:
    """Checks the histories against the stream's contents and the replicas against each other.

    Replicas are compared on seqs from the highest head to the committed prefix: the lowest
    commit_seq among the copies, or with `full_prefix` the primary's commit_seq (then a copy
    that lacks a seq below it counts as divergence: use it after `wait_replicas_converged`).
    Prints the summary, with the seed to reproduce, to stderr when the check fails."""
    report = Report(seed=seed, stream=contents.stream, replicas_required=replicas_required)
    report.notes += contents.notes
    if contents.commit_seq and contents.last_seq > contents.commit_seq:
        report.notes.append(f"last seq {contents.last_seq} above commit seq {contents.commit_seq}")
    seqs_by_id = _seqs_by_id(contents, report)
    _check_publishes(report, published, contents, seqs_by_id)
    report.duplicates = [(msg_id, tuple(seqs)) for msg_id, seqs in seqs_by_id.items()
                         if len(seqs) > 1]
    report.gaps = list(_ranges(seq for seq in range(contents.first_seq,
                                                    contents.visible_last_seq + 1)
                               if seq not in contents.messages))
    for history in _by_consumer(consumed):
        _check_consumer(report, history, contents)
    if replicas is not None:
        _check_replicas(report, replicas, contents, full_prefix=full_prefix)
    if not report.ok and not quiet:
        print(report.summary(), file=sys.stderr)
    return report


def _seqs_by_id(contents: StreamContents, report: Report) -> dict[str, list[int]]:
    seqs_by_id: dict[str, list[int]] = collections.defaultdict(list)
    for seq in sorted(contents.messages):
        view = contents.messages[seq]
        if view.payload_id is None:
            report.notes.append(f"seq {seq}: not a workload payload")
            continue
        if view.msg_id and view.msg_id != view.payload_id:
            report.corrupt.append(seq)
        seqs_by_id[view.payload_id].append(seq)
    return seqs_by_id


def _check_publishes(report: Report, published: Sequence[PublishHistory],
                     contents: StreamContents, seqs_by_id: dict[str, list[int]]) -> None:
    for history in published:
        for msg_id, ack in history.acked.items():
            report.acked += 1
            seqs = seqs_by_id.get(msg_id, [])
            if not seqs:
                report.acked_missing.append(msg_id)
            elif ack.seq not in seqs:
                report.acked_wrong_seq.append(WrongSeq(msg_id, ack.seq, tuple(seqs)))
            else:
                report.present += 1
        for msg_id in history.unacked:
            if msg_id in seqs_by_id:
                report.unacked_present += 1
            else:
                report.unacked_absent += 1


def _by_consumer(histories: Sequence[ConsumeHistory]) -> list[ConsumeHistory]:
    """One history per durable consumer: clients of the same consumer are merged (an ack
    acknowledged to one client must not come back to another)."""
    merged: dict[str, ConsumeHistory] = {}
    for history in histories:
        into = merged.setdefault(history.name, ConsumeHistory(name=history.name,
                                                              stream=history.stream))
        into.deliveries += history.deliveries
        into.acks += history.acks
        into.errors.update(history.errors)
        if history.drained or into.final_state is None:
            into.final_state = history.final_state
        into.drained = into.drained or history.drained
    return list(merged.values())


def _check_consumer(report: Report, history: ConsumeHistory, contents: StreamContents) -> None:
    first_acked_at: dict[int, float] = {}
    for ack in history.acks:
        for seq in ack.seqs:
            first_acked_at[seq] = min(first_acked_at.get(seq, ack.acked_at), ack.acked_at)
    delivered: set[int] = set()
    for delivery in history.deliveries:
        delivered.add(delivery.seq)
        view = contents.messages.get(delivery.seq)
        stored_id = None if view is None else (view.payload_id or view.msg_id)
        below_head = delivery.seq < contents.first_seq
        if not below_head and stored_id != delivery.msg_id:
            report.delivered_not_stored.append(delivery)
        acked_at = first_acked_at.get(delivery.seq)
        if acked_at is not None and delivery.fetch_sent_at > acked_at:
            report.acks_undone.append(AckUndone(history.name, delivery.seq, acked_at,
                                                delivery.fetch_sent_at, delivery.deliver_count))
    acked_prefix = 0
    while acked_prefix + 1 in first_acked_at:
        acked_prefix += 1
    state = history.final_state
    if state is not None and state.ack_floor < acked_prefix:
        report.ack_floor_behind.append((history.name, int(state.ack_floor), acked_prefix))
    if history.drained:
        report.undelivered += [(history.name, seq) for seq in sorted(contents.messages)
                               if seq not in delivered]


def _check_replicas(report: Report, survey: ReplicaSurvey, contents: StreamContents, *,
                    full_prefix: bool) -> None:
    report.notes += survey.notes
    copies = survey.copies
    report.replicas_compared = len(copies)
    if not copies:
        return
    primary_commit = survey.primary_commit_seq
    if full_prefix and primary_commit is None:
        report.notes.append(f"primary {survey.primary or '?'} has no copy; using the lowest "
                            "commit seq")
    prefix = (primary_commit if full_prefix and primary_commit is not None
              else min(copy.commit_seq for copy in copies))
    report.committed_prefix = prefix
    low = max(copy.first_seq for copy in copies)
    for seq in range(low, prefix + 1):
        _compare_seq(report, seq, copies, contents)


def _compare_seq(report: Report, seq: int, copies: Sequence[ReplicaCopy],
                 contents: StreamContents) -> None:
    lacking = tuple(copy.node for copy in copies if seq not in copy.stored)
    if lacking:
        report.divergence.append(Divergence(seq, "missing", lacking))
    held = [copy for copy in copies if seq in copy.stored]
    if not held:
        return
    reference = held[0].stored[seq]
    differing = tuple(copy.node for copy in held[1:] if copy.stored[seq] != reference)
    if differing:
        report.divergence.append(Divergence(seq, "differs", (held[0].node, *differing)))
    view = contents.messages.get(seq)
    if view is not None and _stored_id(reference) != (view.payload_id or view.msg_id):
        report.divergence.append(Divergence(seq, "api-differs", (held[0].node,)))


def _stored_id(stored: bytes) -> str:
    message = storage_pb2.StoredMessage.FromString(stored)
    return decode_payload(message.payload) or message.msg_id


def _ranges(seqs: Iterable[int]) -> Iterator[tuple[int, int]]:
    start = previous = None
    for seq in seqs:
        if previous is not None and seq == previous + 1:
            previous = seq
            continue
        if start is not None and previous is not None:
            yield (start, previous)
        start = previous = seq
    if start is not None and previous is not None:
        yield (start, previous)


async def audit(addresses: Sequence[str], stream: str, *, seed: int,
                published: Sequence[PublishHistory] = (), consumed: Sequence[ConsumeHistory] = (),
                replicas_required: int = 0, converge_timeout_s: float = 10.0,
                quiet: bool = False, peer: PeerAccess | None = None) -> Report:
    """Collects (after waiting up to `converge_timeout_s` for the replicas to agree on their
    last seq) and checks. With replicas_required > 0 the full primary prefix is compared;
    that needs `peer` (the nodes' peer listeners and the cluster credential)."""
    converged = replicas_required == 0 or await wait_replicas_converged(
        addresses, stream, copies_min=replicas_required, timeout_s=converge_timeout_s,
        peer=peer)
    contents = await read_stream(addresses, stream)
    survey = await read_replicas(addresses, stream, peer=peer)
    if not converged:
        survey.notes.append(f"{replicas_required} replicas did not agree on one last and commit "
                            f"seq within {converge_timeout_s} s")
    return check(seed=seed, contents=contents, published=published, consumed=consumed,
                 replicas=survey, replicas_required=replicas_required,
                 full_prefix=replicas_required > 0, quiet=quiet)


# ---------------------------------------------------------------------------------------------
# Failover timing


@dataclass(frozen=True)
class FailoverTiming:
    """Seconds, measured on the publishers' clock from `fault_at` (just before the signal)."""

    fault_at: float
    recover_s: float | None  # to the ack of the first publish SENT after the fault
    first_ack_s: float | None  # to the first ack RECEIVED after the fault (any send time)
    outage_s: float | None  # from the last ack before the fault to the first one after it
    max_ack_gap_s: float  # the largest gap between consecutive acks in the histories
    acked_before: int
    acked_after: int

    def to_dict(self) -> dict[str, Any]:
        return {key: (round(value, 4) if isinstance(value, float) else value)
                for key, value in dataclasses.asdict(self).items()}


def _first_ack_sent_after(attempts: Sequence[Attempt], at: float) -> float | None:
    times = [a.done_at - at for a in attempts if a.seq and a.sent_at >= at]
    return min(times, default=None)


def failover_timing(histories: Sequence[PublishHistory], *, fault_at: float) -> FailoverTiming:
    attempts = [a for history in histories for a in history.attempts]
    ack_times = sorted({a.done_at for a in attempts if a.seq})
    before = [t for t in ack_times if t < fault_at]
    after = [t for t in ack_times if t >= fault_at]
    gaps = [later - earlier for earlier, later in itertools.pairwise(ack_times)]
    return FailoverTiming(
        fault_at=fault_at,
        recover_s=_first_ack_sent_after(attempts, fault_at),
        first_ack_s=(after[0] - fault_at) if after else None,
        outage_s=(after[0] - before[-1]) if after and before else None,
        max_ack_gap_s=max(gaps, default=0.0),
        acked_before=sum(1 for a in attempts if a.seq and a.done_at < fault_at),
        acked_after=sum(1 for a in attempts if a.seq and a.done_at >= fault_at),
    )


# ---------------------------------------------------------------------------------------------
# Where a stream lives


async def explain_route(addresses: Sequence[str], stream: str, *,
                        timeout_s: float = 2.0) -> cluster_pb2.RouteExplanation:
    nodes = Nodes(addresses)
    try:
        route: cluster_pb2.RouteExplanation = await _rpc(
            nodes, "cluster", "ExplainRoute", cluster_pb2.ExplainRouteRequest(stream=stream),
            timeout_s=timeout_s, attempts_max=len(addresses))
        return route
    finally:
        await nodes.close()


async def create_stream(addresses: Sequence[str], stream: str, *, subjects: Sequence[str],
                        replicas: int = 3, timeout_s: float = 10.0) -> types_pb2.StreamInfo:
    """Creates a limits-retention stream (the checker assumes nothing is removed). A retry
    that finds the stream created by an attempt that timed out returns its info."""
    nodes = Nodes(addresses)
    config = types_pb2.StreamConfig(name=stream, subjects=list(subjects), replicas=replicas)
    try:
        try:
            info: types_pb2.StreamInfo = await _rpc(
                nodes, "streams", "CreateStream", streams_pb2.CreateStreamRequest(config=config),
                timeout_s=timeout_s)
        except grpc.RpcError as exc:
            if error_name(exc) != "STREAM_EXISTS":
                raise
            info = await _rpc(nodes, "streams", "GetStreamInfo",
                              streams_pb2.GetStreamInfoRequest(name=stream), timeout_s=timeout_s)
        return info
    finally:
        await nodes.close()
