"""The workload's clients, driven against a live cluster: `Publisher` publishes uniquely
identified messages to one stream (unary `Publish`, or `PublishBatch` of K) through a list of
nodes, moving to the next node on failure and retrying with the SAME msg_id after a bounded,
seeded backoff, so that dedupe keeps a retried message once; `Consumer` runs a fetch + ack loop
on a durable consumer through any node. Both record what happened (history.py). Part of the
workload (chaos/workload.py re-exports it).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from raftlog.chaos.clients import (
    Clock,
    Nodes,
    call_timeout_s_default,
    error_name,
    read_attempts_max,
    rpc,
)
from raftlog.chaos.history import (
    Ack,
    AckDone,
    Attempt,
    ConsumeHistory,
    Delivery,
    PublishHistory,
    decode_payload,
    encode_payload,
)
from raftlog.node.ops.batches import expand_results
from raftlog.v1 import consumers_pb2, streams_pb2

backoff_s_initial = 0.01
backoff_s_max = 0.2
attempts_per_message_max = 10_000  # the run's time bound normally ends retries first
ack_attempts_max = 5
poll_period_s = 0.005
deliveries_max_default = 2_000_000

# Permanent failures: retrying the same request cannot help, so the publisher stops.
FATAL_REASONS = frozenset({
    "INVALID_NAME", "INVALID_SUBJECT", "INVALID_CONFIG", "INVALID_ARGUMENT",
    "SUBJECT_NOT_IN_STREAM", "MESSAGE_TOO_LARGE", "UNAUTHENTICATED", "PERMISSION_DENIED",
})


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


@dataclass(frozen=True)
class _Outcome:
    """What one message's publish got: a seq (0: none) or an error."""

    seq: int = 0
    duplicate: bool = False
    error: str = ""
    epoch: int = 0
    primary: str = ""

    @staticmethod
    def of(ack: streams_pb2.PublishAck) -> _Outcome:
        return _Outcome(int(ack.seq), bool(ack.duplicate), "", int(ack.epoch), ack.primary)


class Publisher:
    """`history = await Publisher(addresses, config, seed=s).run()`; `stop()` ends it early."""

    def __init__(self, addresses: Sequence[str], config: PublisherConfig, *, seed: int,
                 clock: Clock = time.monotonic, on_ack: Callable[[], None] | None = None
                 ) -> None:
        """`on_ack()` runs the moment a call's answer acknowledged a write."""
        self.config = config
        self._on_ack = on_ack
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
            if self._on_ack is not None and any(outcome.seq for outcome in outcomes):
                self._on_ack()
            failed = []
            for entry, outcome in zip(pending, outcomes, strict=True):
                msg_id = _entry_id(entry)
                seq, duplicate, error = outcome.seq, outcome.duplicate, outcome.error
                self.history.attempts.append(
                    Attempt(msg_id, node, sent_at, done_at, seq, duplicate, error,
                            outcome.epoch, outcome.primary))
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

    async def _call(self, entries: list[streams_pb2.PublishEntry]) -> list[_Outcome]:
        """One outcome per entry."""
        config = self.config
        stub = self._nodes.streams()
        try:
            if config.batch_size == 1:
                [entry] = entries
                ack = await stub.Publish(_as_request(entry, stream=config.stream),
                                         timeout=config.call_timeout_s)
                return [_Outcome.of(ack)]
            response = await stub.PublishBatch(
                streams_pb2.PublishBatchRequest(stream=config.stream, entries=entries),
                timeout=config.call_timeout_s)
        except grpc.RpcError as exc:
            return [_Outcome(error=error_name(exc))] * len(entries)
        results = expand_results(response)
        if len(results) != len(entries):
            return [_Outcome(error="RESULT_COUNT_MISMATCH")] * len(entries)
        return [_Outcome.of(r.ack) if r.HasField("ack")
                else _Outcome(error=r.error.reason or "ERROR") for r in results]

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
    # Ack calls at once: 1 acks each fetch's seqs in one call before the next fetch; more
    # splits them into that many calls that run while the next fetches go out (so a
    # consumer's saves overlap, and the node gathers them).
    acks_inflight: int = 1


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
        self._ack_slots = asyncio.Semaphore(config.acks_inflight)
        self._acking: set[asyncio.Task[None]] = set()

    async def create(self, *, attempts_max: int = read_attempts_max) -> None:
        """Creates the durable consumer (DELIVER_POLICY_ALL); an existing one is kept."""
        config = self.config
        request = consumers_pb2.CreateConsumerRequest(
            stream=config.stream,
            config=consumers_pb2.ConsumerConfig(
                name=config.name, ack_wait_ms=config.ack_wait_ms,
                max_ack_pending=config.max_ack_pending))
        try:
            await rpc(self._nodes, "consumers", "CreateConsumer", request,
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
            if self._acking:
                await asyncio.gather(*self._acking)
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
        if response.messages and self.config.acks_inflight > 1:
            await self._ack_behind(tuple(int(m.seq) for m in response.messages))
        elif response.messages:
            await self._ack(tuple(int(m.seq) for m in response.messages))
        elif self._drain and self._stop_at is not None and await self._is_drained():
            self.history.drained = True
            self.history.stopped_by = "drained"

    async def _ack_behind(self, seqs: tuple[int, ...]) -> None:
        """Splits the seqs into up to `acks_inflight` Ack calls that run while the next fetches
        go out; waits only for a free slot."""
        parts = self.config.acks_inflight
        for part in range(min(parts, len(seqs))):
            await self._ack_slots.acquire()
            task = asyncio.create_task(self._ack(seqs[part::parts]))
            task.add_done_callback(self._acked)
            self._acking.add(task)

    def _acked(self, task: asyncio.Task[None]) -> None:
        self._acking.discard(task)
        self._ack_slots.release()

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
        info: consumers_pb2.ConsumerInfo = await rpc(
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
