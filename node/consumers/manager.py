"""Durable pull consumers of a node: delivery, acknowledgement, redelivery, dead letters,
work-queue and interest removal, and when consumer state is saved.

One `ConsumerManager` per node, used only on the event loop thread (no threads, no blocking
calls; one asyncio.Lock per stream serialises consumer create and delete). The rules that
change one consumer's state live in `consumer_state.py`, config validation in
`consumer_config.py`, persistence behind the `ConsumerStore` protocol (`consumer_store.py`):
this module never knows how records are kept.

Ordering rules:
- Ack and Term return only after a `store.save` that includes them has completed, and on a
  work-queue stream only after the messages were removed. Removal comes first, then the save:
  a crash between them leaves a pending seq whose message is gone, which is skipped.
- Saves of one consumer are coalesced (`_Flusher`): one save in flight at a time, and every
  caller waits for a save whose snapshot was taken after its change.
- Fetch, Nak and InProgress do not save: deliveries lost in a crash are redelivered
  (at-least-once). Dead-lettering does save, like a Term.
- A closed consumer (deleted, or its stream detached) starts no new save and fails every caller
  still waiting for one: a save racing a delete cannot bring the record back, and an ack whose
  save raced a detach is never reported durable.
- Nothing above the log's commit_seq is ever handed out (G4).
- Ack, Term, Nak and InProgress answer per seq (`Settled`): the valid seqs of a call take
  effect (and Ack and Term are durable on return) even when others are refused; which seqs may
  be settled is decided in `consumer_state.py`.

Interest retention: a message is removed once every consumer whose filter matches it has
acknowledged it (a consumer whose filter does not match it never holds it back), and at once
when no consumer's filter matches it or the stream has no consumer. Checked: up to the lowest
ack floor as a range, each seq a consumer finishes when it does, and new messages once.
"""

from __future__ import annotations

import asyncio
import builtins
import math
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

from raftlog.base import limits
from raftlog.base import subjects as subject_rules
from raftlog.base.clock import Clock
from raftlog.base.errors import InvariantViolation, RaftlogError, Reason
from raftlog.base.waiters import settle
from raftlog.internal import storage_pb2
from raftlog.node.consumers.config import check_work_queue_filter, validate_config
from raftlog.node.consumers.state import DeliveryState
from raftlog.node.consumers.store import ConsumerStore
from raftlog.node.engine.log import LogEntry, StreamLog
from raftlog.v1 import consumers_pb2, types_pb2

_POLICY = consumers_pb2.DeliverPolicy
# A redelivery deadline that has just passed is handed out by the next collect; this floor only
# keeps a wait from ever being zero, so no path can turn into a busy loop.
_redelivery_wait_s_min = 0.001
DLQ_HEADERS = ("raftlog-dlq-stream", "raftlog-dlq-consumer", "raftlog-dlq-seq",
               "raftlog-dlq-subject", "raftlog-dlq-deliveries")


class _Flusher:
    """Coalesces the saves of one consumer: at most one in flight; `flush` returns once a save
    whose snapshot was taken after the call has completed (or raises what that save raised)."""

    def __init__(self, begin_save: Callable[[], Awaitable[None]]) -> None:
        # begin_save() takes the snapshot synchronously and returns the awaitable that saves it.
        self._begin_save = begin_save
        self._requested = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._closed: RaftlogError | None = None

    async def flush(self) -> None:
        if self._closed is not None:
            raise self._closed
        self._requested += 1
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((self._requested, waiter))
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        await waiter

    def close(self, error: RaftlogError) -> None:
        """No save starts after this; every waiter fails with `error`."""
        self._closed = error
        self._settle(self._requested, error)

    async def _run(self) -> None:
        try:
            while self._closed is None and self._waiters:
                covered = self._requested  # no await before the snapshot in begin_save()
                try:
                    await self._begin_save()
                except Exception as exc:
                    self._settle(covered, exc)
                else:
                    self._settle(covered, self._closed)
        finally:
            self._task = None

    def _settle(self, covered: int, error: BaseException | None) -> None:
        ready = []
        while self._waiters and self._waiters[0][0] <= covered:
            ready.append(self._waiters.popleft()[1])
        settle(ready, error)


@dataclass(frozen=True)
class Settled:
    """What one Ack, Term, Nak or InProgress call did: how many seqs changed state, and each
    refused seq with why (the others took effect)."""

    applied: int
    refused: dict[int, RaftlogError] = field(default_factory=dict)


@dataclass(eq=False)
class _Consumer:
    state: DeliveryState
    flusher: _Flusher = field(init=False)
    # Replaced on every notify: a waiter holds the Event it saw before it looked for work.
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    removals: list[int] = field(default_factory=list)  # work queue: done, not yet removed
    closed: RaftlogError | None = None


@dataclass(eq=False)
class _Stream:
    log: StreamLog
    retention: int
    subjects: tuple[str, ...]
    consumers: dict[str, _Consumer] = field(default_factory=dict)
    admin: asyncio.Lock = field(default_factory=asyncio.Lock)  # serialises create and delete
    trimming: bool = False
    interest_scanned: int = 0  # interest: seqs up to here were checked against the filters
    trim_due: set[int] = field(default_factory=set)  # interest: seqs a consumer just finished


@dataclass
class _Batch:
    """One collect's messages and the caps they stay under. Dead letters count toward the
    batch, so one fetch does a bounded number of republishes."""

    stream: str
    size_max: int
    bytes_max: int | None = None  # of LogEntry.size_bytes, besides the payload cap
    messages: list[types_pb2.Message] = field(default_factory=list)
    payload_bytes: int = 0
    message_bytes: int = 0
    dead_lettered: list[int] = field(default_factory=list)
    full: bool = False

    def room(self) -> int:
        return 0 if self.full else self.size_max - len(self.messages) - len(self.dead_lettered)

    def fits(self, entry: LogEntry) -> bool:
        """The payload cap and bytes_max; the first message always fits."""
        if self.messages and (
                self.payload_bytes + len(entry.payload) > limits.fetch_bytes_max
                or (self.bytes_max is not None
                    and self.message_bytes + entry.size_bytes > self.bytes_max)):
            self.full = True
        return not self.full

    def add(self, entry: LogEntry, *, deliver_count: int) -> None:
        self.messages.append(to_message(self.stream, entry, deliver_count=deliver_count))
        self.payload_bytes += len(entry.payload)
        self.message_bytes += entry.size_bytes


def to_message(stream: str, entry: LogEntry, *, deliver_count: int) -> types_pb2.Message:
    return types_pb2.Message(
        seq=entry.seq, subject=entry.subject, ts_ms=entry.ts_ms,
        headers=[types_pb2.Header(key=key, value=value) for key, value in entry.headers],
        payload=entry.payload, msg_id=entry.msg_id, deliver_count=deliver_count, stream=stream,
    )


def start_state(log: StreamLog, config: consumers_pb2.ConsumerConfig, *,
                created_ms: int) -> DeliveryState:
    """A new consumer's state: its cursor sits just below the start position, so everything
    before the start counts as done."""
    policy, filter_subject = config.deliver_policy, config.filter_subject
    start_seqs: list[int] = []
    resume_seq = 0
    if policy == _POLICY.DELIVER_POLICY_ALL:
        start = log.first_seq
    elif policy == _POLICY.DELIVER_POLICY_LAST:
        start = max(log.last_seqs_per_subject(filter_subject), default=log.commit_seq + 1)
    elif policy == _POLICY.DELIVER_POLICY_NEW:
        start = log.commit_seq + 1
    elif policy == _POLICY.DELIVER_POLICY_BY_START_SEQ:
        start = config.opt_start_seq
    elif policy == _POLICY.DELIVER_POLICY_BY_START_TIME:
        start = log.first_seq_at_or_after_time(config.opt_start_time_ms)
    elif policy == _POLICY.DELIVER_POLICY_LAST_PER_SUBJECT:
        resume_seq = log.commit_seq
        start_seqs = log.last_seqs_per_subject(filter_subject)
        start = start_seqs[0] if start_seqs else resume_seq + 1
    else:
        raise InvariantViolation(f"deliver policy {policy} passed validation")
    return DeliveryState(config=config, created_ms=created_ms, delivered_seq=start - 1,
                         start_seqs=deque(start_seqs), start_resume_seq=resume_seq)


def dead_letter_headers(stream: str, consumer: str, entry: LogEntry, *,
                        deliveries: int) -> tuple[tuple[str, str], ...]:
    values = (stream, consumer, str(entry.seq), entry.subject, str(deliveries))
    return entry.headers + tuple(zip(DLQ_HEADERS, values, strict=True))


def _may_hold(log: StreamLog, filter_subject: str) -> Callable[[int], bool]:
    """Whether a seq above the cursor may have been handed to this consumer by an earlier
    primary: its message is gone, or the filter matches it."""
    def may_hold(seq: int) -> bool:
        entry = log.peek(seq)
        return entry is None or not filter_subject or subject_rules.matches(filter_subject,
                                                                            entry.subject)
    return may_hold


def _present_in(log: StreamLog, filter_subject: str = "") -> Callable[[int], bool]:
    """Whether a seq still holds a message this consumer could be handed (after a failover
    the cluster's record cannot tell a delivered seq from one the filter skipped)."""
    def present(seq: int) -> bool:
        entry = log.peek(seq)
        return entry is not None and (
            not filter_subject or subject_rules.matches(filter_subject, entry.subject))
    return present


class ConsumerManager:
    """Every consumer of every stream attached to this node."""

    def __init__(self, *, store: ConsumerStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._streams: dict[str, _Stream] = {}

    # ----------------------------------------------------------------- streams (engine hooks)

    def attach_stream(self, log: StreamLog, *, retention: int, subjects: Sequence[str]) -> None:
        """Starts serving a stream's consumers from their saved records."""
        if log.name in self._streams:
            raise InvariantViolation(f"stream {log.name} attached twice")
        stream = _Stream(log=log, retention=retention, subjects=tuple(subjects))
        for record in self._store.load(log.name):
            self._restore(stream, record)
        self._streams[log.name] = stream

    def adopt(self, stream: str, name: str) -> bool:
        """Starts serving one consumer the store holds and this manager lacks (created after
        the stream was attached, e.g. through a deposed primary); False when the store has
        none. The others are left as they are."""
        found = self._stream(stream)
        if name in found.consumers:
            return True
        for record in self._store.load(stream):
            if record.config.name == name:
                self._restore(found, record)
                return True
        return False

    def _restore(self, found: _Stream, record: storage_pb2.ConsumerRecord) -> None:
        log = found.log
        state = DeliveryState.from_record(record, now_s=self._clock.monotonic_s())
        state.forget_removed(first_seq=log.first_seq,
                             exists=_present_in(log, state.config.filter_subject))
        # Deliveries are not saved: anything stored here may have been handed out already.
        state.restored_last_seq = log.last_seq
        self._add(found, state)

    def update_stream_subjects(self, stream: str, subjects: Sequence[str]) -> None:
        self._stream(stream).subjects = tuple(subjects)

    def detach_stream(self, stream: str) -> None:
        """The stream is gone: its consumers close and their waiters wake with the error."""
        found = self._streams.pop(stream, None)
        if found is None:
            return
        error = RaftlogError(Reason.STREAM_NOT_FOUND, f"stream {stream!r} was deleted",
                             stream=stream)
        for consumer in found.consumers.values():
            self._close(consumer, error)

    async def delete_stream_consumers(self, stream: str) -> None:
        self.detach_stream(stream)
        for record in self._store.load(stream):
            await self._store.delete(stream, record.config.name)

    def consumer_count(self, stream: str) -> int:
        return len(self._stream(stream).consumers)

    def commit_seq(self, stream: str) -> int:
        return self._stream(stream).log.commit_seq

    def on_purged(self, stream: str) -> None:
        """Messages were removed under the consumers: skip them and move the floors."""
        found = self._stream(stream)
        for consumer in found.consumers.values():
            consumer.state.forget_removed(first_seq=found.log.first_seq,
                                          exists=_present_in(found.log))
            self._notify(consumer)

    async def maybe_trim_interest(self, stream: str) -> int:
        """Interest retention: removes what every consumer is done with; returns the count."""
        return await self._maybe_trim(self._stream(stream))

    # ----------------------------------------------------------------- consumer lifecycle

    async def create(self, stream: str, config: consumers_pb2.ConsumerConfig
                     ) -> consumers_pb2.ConsumerInfo:
        found = self._stream(stream)
        config = validate_config(config, stream_subjects=found.subjects)
        async with found.admin:
            found = self._stream(stream)
            existing = found.consumers.get(config.name)
            if existing is not None:
                return await self._recreate(found, existing, config)
            self._check_room(found, config)
            state = start_state(found.log, config, created_ms=self._clock.wall_ms())
            consumer = self._add(found, state)
            try:
                await consumer.flusher.flush()
            except Exception:  # not on cancellation: the save goes on, so the consumer stays
                if found.consumers.get(config.name) is consumer:
                    del found.consumers[config.name]
                    self._close(consumer, self._not_found(stream, config.name))
                raise
            return self._info(found, consumer)

    async def delete(self, stream: str, name: str) -> None:
        found = self._stream(stream)
        async with found.admin:
            found, consumer = self._lookup(stream, name)
            del found.consumers[name]
            self._close(consumer, self._not_found(stream, name))
            await self._store.delete(stream, name)
            # What only this consumer wanted is wanted by nobody now: check again.
            found.interest_scanned = min(
                (c.state.ack_floor for c in found.consumers.values()), default=0)
        await self._maybe_trim(found)

    def list(self, stream: str) -> builtins.list[consumers_pb2.ConsumerInfo]:
        found = self._stream(stream)
        return [self._info(found, found.consumers[name]) for name in sorted(found.consumers)]

    def info(self, stream: str, name: str) -> consumers_pb2.ConsumerInfo:
        return self._info(*self._lookup(stream, name))

    def is_drained(self, stream: str, name: str) -> bool:
        """Nothing left to hand out now: no undelivered match, no redelivery due."""
        found, consumer = self._lookup(stream, name)
        if consumer.state.pending.first_due(self._clock.monotonic_s()) is not None:
            return False
        return self._num_pending(found, consumer.state) == 0

    async def _recreate(self, found: _Stream, existing: _Consumer,
                        config: consumers_pb2.ConsumerConfig) -> consumers_pb2.ConsumerInfo:
        if existing.state.config != config:
            raise RaftlogError(
                Reason.CONSUMER_EXISTS,
                f"consumer {config.name!r} exists on stream {found.log.name!r} with a "
                "different config", stream=found.log.name, consumer=config.name)
        await existing.flusher.flush()  # its creation may still be on its way to the store
        return self._info(found, existing)

    def _check_room(self, found: _Stream, config: consumers_pb2.ConsumerConfig) -> None:
        if len(found.consumers) >= limits.consumers_per_stream_max:
            raise RaftlogError(
                Reason.TOO_MANY_CONSUMERS,
                f"stream {found.log.name!r} has {limits.consumers_per_stream_max} consumers, "
                "the most it may have", limit=limits.consumers_per_stream_max)
        if found.retention == types_pb2.RETENTION_POLICY_WORK_QUEUE:
            check_work_queue_filter(config.name, config.filter_subject,
                                    others=(c.state.config for c in found.consumers.values()))

    # ----------------------------------------------------------------- fetch

    async def fetch(self, stream: str, name: str, *, batch: int, max_wait_ms: int,
                    bytes_max: int | None = None) -> builtins.list[types_pb2.Message]:
        """Up to `batch` messages (and, if given, at most `bytes_max` of LogEntry.size_bytes
        together, but at least one): due redeliveries first, then new ones. Waits up to
        `max_wait_ms` (real time) for the first one, woken by commits and consumer changes."""
        _check_range("batch", batch, low=1, high=limits.fetch_batch_max)
        _check_range("max_wait_ms", max_wait_ms, low=0, high=limits.fetch_wait_ms_max)
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + max_wait_ms / 1000
        while True:
            found, consumer = self._lookup(stream, name)
            changed, above_seq = consumer.changed, found.log.commit_seq
            messages = await self._collect(found, consumer, batch=batch, bytes_max=bytes_max)
            remaining_s = give_up_at - loop.time()
            if messages or remaining_s <= 0:
                return messages
            timeout_s = min(remaining_s, self._until_redelivery_s(consumer))
            await _wait_for_work(found.log, changed, above_seq=above_seq, timeout_s=timeout_s)

    async def _collect(self, found: _Stream, consumer: _Consumer, *, batch: int,
                       bytes_max: int | None = None) -> builtins.list[types_pb2.Message]:
        out = _Batch(stream=found.log.name, size_max=batch, bytes_max=bytes_max)
        await self._redeliver_due(found, consumer, out)
        if consumer.closed is None:
            self._deliver_new(found, consumer, out)
        if out.dead_lettered:
            await self._make_durable(found, consumer, out.dead_lettered)
        return out.messages

    async def _redeliver_due(self, found: _Stream, consumer: _Consumer, out: _Batch) -> None:
        state = consumer.state
        while out.room() > 0 and consumer.closed is None:
            now_s = self._clock.monotonic_s()
            seq = state.pending.first_due(now_s)
            if seq is None:
                return
            entry = found.log.read(seq)
            if entry is None:
                state.drop_removed(seq)
            elif state.exhausted(seq):
                if await self._dead_letter(found, consumer, entry):
                    out.dead_lettered.append(seq)
            elif out.fits(entry):
                out.add(entry, deliver_count=state.deliver(seq, now_s=now_s))

    def _deliver_new(self, found: _Stream, consumer: _Consumer, out: _Batch) -> None:
        state = consumer.state
        room = min(out.room(), state.config.max_ack_pending - len(state.pending))
        if room <= 0 or state.delivery_paused(acked_max=limits.acked_above_floor_max):
            return
        now_s, commit_seq = self._clock.monotonic_s(), found.log.commit_seq
        for entry in _undelivered(found.log, state, limit=room):
            if entry.seq > commit_seq:
                raise InvariantViolation(f"stream {found.log.name}: seq {entry.seq} above "
                                         f"commit_seq {commit_seq} offered to a consumer")
            if not out.fits(entry):
                return
            out.add(entry, deliver_count=state.deliver(entry.seq, now_s=now_s))

    def _until_redelivery_s(self, consumer: _Consumer) -> float:
        deadline_s = consumer.state.pending.next_deadline_s()
        if deadline_s is None:
            return math.inf
        return max(deadline_s - self._clock.monotonic_s(), _redelivery_wait_s_min)

    # ----------------------------------------------------------------- acknowledgements

    async def ack(self, stream: str, name: str, seqs: Sequence[int]) -> Settled:
        """Per seq; the seqs that took effect are durable (and removed from a work queue) on
        return."""
        found, consumer = self._lookup(stream, name)
        state = consumer.state
        done, refused = state.ack(seqs, commit_seq=found.log.commit_seq,
                                  may_hold=_may_hold(found.log, state.config.filter_subject))
        if done:
            _skip_acked_ahead(found.log, state)
        if len(refused) < len(set(seqs)):  # an accepted seq waits for its (or an earlier) save
            await self._make_durable(found, consumer, done)
        return Settled(applied=len(done), refused=refused)

    async def term(self, stream: str, name: str, seqs: Sequence[int]) -> Settled:
        """Never redeliver: counts as acked, durable on return."""
        return await self.ack(stream, name, seqs)

    async def nak(self, stream: str, name: str, seqs: Sequence[int], *,
                  delay_ms: int) -> Settled:
        """Redeliver after `delay_ms`; a seq out of deliveries is dead-lettered instead."""
        _check_range("delay_ms", delay_ms, low=0, high=limits.nak_delay_ms_max)
        found, consumer = self._lookup(stream, name)
        state = consumer.state
        changed, exhausted, refused = state.nak(
            seqs, delay_s=delay_ms / 1000, now_s=self._clock.monotonic_s(),
            commit_seq=found.log.commit_seq,
            may_hold=_may_hold(found.log, state.config.filter_subject))
        self._notify(consumer)
        dead: builtins.list[int] = []
        for seq in exhausted:
            entry = found.log.read(seq)
            if entry is None:
                consumer.state.drop_removed(seq)
            elif consumer.closed is None and await self._dead_letter(found, consumer, entry):
                dead.append(seq)
        if dead:
            await self._make_durable(found, consumer, dead)
        return Settled(applied=changed, refused=refused)

    async def in_progress(self, stream: str, name: str, seqs: Sequence[int]) -> Settled:
        """Restarts the ack wait of each pending seq."""
        found, consumer = self._lookup(stream, name)
        state = consumer.state
        changed, refused = state.in_progress(
            seqs, now_s=self._clock.monotonic_s(), commit_seq=found.log.commit_seq,
            may_hold=_may_hold(found.log, state.config.filter_subject))
        return Settled(applied=changed, refused=refused)

    async def _dead_letter(self, found: _Stream, consumer: _Consumer, entry: LogEntry) -> bool:
        """Republishes a message out of deliveries (if a subject is set) and gives up on it.
        False when it was acked while the republish was in flight."""
        state = consumer.state
        pending = state.pending.get(entry.seq)
        if pending is None:
            return False
        # Not due while the republish is in flight, so a concurrent fetch leaves it alone.
        wait_s = state.wait_s(deliveries=pending.deliveries)
        state.pending.reschedule(entry.seq, deadline_s=self._clock.monotonic_s() + wait_s)
        subject = state.config.dead_letter_subject
        if subject:
            headers = dead_letter_headers(found.log.name, state.name, entry,
                                          deliveries=pending.deliveries)
            await found.log.publish_internal(subject=subject, payload=entry.payload,
                                             headers=headers)
        return state.dead_letter(entry.seq)

    async def _make_durable(self, found: _Stream, consumer: _Consumer,
                            done: Sequence[int]) -> None:
        """After seqs became done: wake fetchers, save (removing work-queue messages first),
        then trim an interest stream."""
        if done:
            if found.retention == types_pb2.RETENTION_POLICY_WORK_QUEUE:
                consumer.removals.extend(done)
            self._notify(consumer)
        # Also when nothing changed: a repeated ack must not return before the first one's save.
        await consumer.flusher.flush()
        if done:
            await self._maybe_trim(found, done)

    # ----------------------------------------------------------------- saving

    def _add(self, found: _Stream, state: DeliveryState) -> _Consumer:
        consumer = _Consumer(state=state)
        consumer.flusher = _Flusher(lambda: self._begin_save(found, consumer))
        found.consumers[state.name] = consumer
        return consumer

    def _begin_save(self, found: _Stream, consumer: _Consumer) -> Awaitable[None]:
        record = consumer.state.to_record()
        removals, consumer.removals = consumer.removals, []
        return self._finish_save(found, consumer, record, removals)

    async def _finish_save(self, found: _Stream, consumer: _Consumer,
                           record: storage_pb2.ConsumerRecord,
                           removals: builtins.list[int]) -> None:
        step = limits.retention_sweep_deletes_max
        for index in range(0, len(removals), step):
            try:
                await found.log.remove(removals[index:index + step])
            except BaseException:
                consumer.removals[:0] = removals[index:]
                raise
        if consumer.closed is not None:
            raise consumer.closed
        await self._store.save(found.log.name, record)

    async def _maybe_trim(self, found: _Stream, done: Sequence[int] = ()) -> int:
        """Interest retention: removes what no consumer still wants: everything when the
        stream has no consumer; else what every consumer acknowledged (up to the lowest ack
        floor), each of `done` (seqs a consumer just finished) that every consumer whose filter
        matches it has finished, and new messages that no consumer's filter matches. A trim
        already running takes over `done`."""
        if found.retention != types_pb2.RETENTION_POLICY_INTEREST:
            return 0
        found.trim_due.update(done)
        if found.trimming:
            return 0
        found.trimming = True
        try:
            if not found.consumers:
                found.trim_due.clear()
                log = found.log
                seqs = [entry.seq for entry in log.scan(
                    from_seq=log.first_seq, limit=limits.retention_sweep_deletes_max)]
                return await log.remove(seqs) if seqs else 0
            removed = await self._trim_acked(found)
            while found.trim_due and self._streams.get(found.log.name) is found:
                finished, found.trim_due = found.trim_due, set()
                removed += await self._trim_done(found, finished)
            return removed + await self._trim_unwanted(found)
        finally:
            found.trimming = False

    async def _trim_acked(self, found: _Stream) -> int:
        removed = 0
        while self._streams.get(found.log.name) is found and found.consumers:
            log = found.log
            floor = self._lowest_floor(found)
            first = log.first_seq
            if first > floor:
                break
            last = min(floor, first + limits.retention_sweep_deletes_max - 1)
            removed += await log.remove(list(range(first, last + 1)))
            if log.first_seq <= last:
                break  # the head did not move past the batch: never spin on it
        return removed

    @staticmethod
    def _lowest_floor(found: _Stream) -> int:
        return min(min(c.state.ack_floor for c in found.consumers.values()),
                   found.log.commit_seq)

    async def _trim_done(self, found: _Stream, seqs: set[int]) -> int:
        """Removes each of `seqs` that every consumer whose filter matches its message has
        finished (above the lowest floor: `_trim_acked` had the rest)."""
        log, floor = found.log, self._lowest_floor(found)
        states = [c.state for c in found.consumers.values()]
        removable: builtins.list[int] = []
        for seq in sorted(seqs):
            entry = log.peek(seq) if floor < seq <= log.commit_seq else None
            if entry is not None and not any(_holds(state, entry) for state in states):
                removable.append(seq)
        removed = 0
        step = limits.retention_sweep_deletes_max
        for index in range(0, len(removable), step):
            removed += await log.remove(removable[index:index + step])
        return removed

    async def _trim_unwanted(self, found: _Stream) -> int:
        """Removes committed messages that match no consumer's filter (each seq is looked at
        once: `interest_scanned` moves past it)."""
        log = found.log
        filters = [c.state.config.filter_subject for c in found.consumers.values()]
        if not all(filters):  # some consumer wants every subject
            found.interest_scanned = log.commit_seq
            return 0
        start = max(found.interest_scanned + 1, log.first_seq)
        unwanted: builtins.list[int] = []
        scanned = start - 1
        for entry in log.scan(from_seq=start, limit=limits.retention_sweep_deletes_max):
            scanned = entry.seq
            if not any(subject_rules.matches(f, entry.subject) for f in filters):
                unwanted.append(entry.seq)
        if scanned < start:  # nothing stored past the cursor
            scanned = log.commit_seq
        found.interest_scanned = max(found.interest_scanned, scanned)
        return await log.remove(unwanted) if unwanted else 0

    def check_stream_subjects(self, stream: str, subjects: Sequence[str]) -> None:
        """Refuses (INVALID_CONFIG) stream subjects that a consumer could no longer work
        with: its filter would match nothing, or its dead-letter subject would be refused."""
        found = self._stream(stream)
        for name, consumer in found.consumers.items():
            config = consumer.state.config
            if not subjects:
                continue
            if config.filter_subject and not any(
                    subject_rules.patterns_overlap(config.filter_subject, s) for s in subjects):
                raise RaftlogError(Reason.INVALID_CONFIG, f"consumer {name!r} filters on "
                                   f"{config.filter_subject!r}, which the new subjects exclude",
                                   consumer=name)
            if config.dead_letter_subject and not subject_rules.matches_any(
                    list(subjects), config.dead_letter_subject):
                raise RaftlogError(Reason.INVALID_CONFIG, f"consumer {name!r} dead-letters to "
                                   f"{config.dead_letter_subject!r}, which the new subjects "
                                   "refuse", consumer=name)

    # ----------------------------------------------------------------- lookup and reporting

    def _stream(self, stream: str) -> _Stream:
        found = self._streams.get(stream)
        if found is None:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"no stream named {stream!r}",
                               stream=stream)
        return found

    def _lookup(self, stream: str, name: str) -> tuple[_Stream, _Consumer]:
        found = self._stream(stream)
        consumer = found.consumers.get(name)
        if consumer is None:
            raise self._not_found(stream, name)
        return found, consumer

    @staticmethod
    def _not_found(stream: str, name: str) -> RaftlogError:
        return RaftlogError(Reason.CONSUMER_NOT_FOUND,
                            f"stream {stream!r} has no consumer named {name!r}",
                            stream=stream, consumer=name)

    @staticmethod
    def _notify(consumer: _Consumer) -> None:
        consumer.changed.set()
        consumer.changed = asyncio.Event()

    def _close(self, consumer: _Consumer, error: RaftlogError) -> None:
        consumer.closed = error
        consumer.flusher.close(error)
        self._notify(consumer)

    def _num_pending(self, found: _Stream, state: DeliveryState) -> int:
        log, from_seq = found.log, state.undelivered_from_seq
        # Acked ahead of the cursor (after a failover): counted by the log, never handed out.
        acked_ahead = sum(1 for seq in state.acked
                          if seq >= from_seq and log.peek(seq) is not None)
        return len(state.start_seqs) + max(0, log.count_matching(
            from_seq=from_seq, filter_subject=state.config.filter_subject) - acked_ahead)

    def _info(self, found: _Stream, consumer: _Consumer) -> consumers_pb2.ConsumerInfo:
        state = consumer.state
        return consumers_pb2.ConsumerInfo(
            stream=found.log.name, config=state.config, created_ms=state.created_ms,
            state=state.snapshot(num_pending=self._num_pending(found, state)))


def _holds(state: DeliveryState, entry: LogEntry) -> bool:
    """Interest retention: this consumer still wants the message (its filter matches it and
    it is not done with it)."""
    filter_subject = state.config.filter_subject
    return (not filter_subject or subject_rules.matches(filter_subject, entry.subject)) and \
        not state.is_done(entry.seq)


def _skip_acked_ahead(log: StreamLog, state: DeliveryState) -> None:
    """After acks ahead of the cursor: moves the cursor (and so the floor) over the ones that
    are next in line, so that the floor does not wait for a fetch to pass them."""
    if state.start_seqs or not state.acked:
        return
    for entry in log.scan(from_seq=state.delivered_seq + 1,
                          filter_subject=state.config.filter_subject, limit=len(state.acked)):
        if not state.skip_acked_ahead(entry.seq):
            return


def _undelivered(log: StreamLog, state: DeliveryState, *, limit: int) -> Iterator[LogEntry]:
    """The next entries to hand out: the LAST_PER_SUBJECT start set, then the filtered scan.
    The caller delivers each entry before asking for the next one, or stops."""
    produced = 0
    while state.start_seqs and produced < limit:
        seq = state.start_seqs[0]
        entry = log.read(seq)
        if entry is None or seq in state.acked:
            state.skip_to(seq)
            continue
        produced += 1
        yield entry
    if state.start_seqs or produced >= limit:
        return
    filter_subject, from_seq = state.config.filter_subject, state.delivered_seq + 1
    # Seqs acked ahead of the cursor (after a failover) are passed over, not handed out: the
    # scan may look at that many more entries.
    for entry in log.scan(from_seq=from_seq, filter_subject=filter_subject,
                          limit=limit - produced + len(state.acked)):
        if state.skip_acked_ahead(entry.seq):
            continue
        produced += 1
        yield entry
        if produced >= limit:
            return
    if produced == 0 and from_seq <= log.commit_seq and not log.count_matching(
        from_seq=from_seq, filter_subject=filter_subject
    ):
        # Nothing up to the commit matches: move the cursor (and so the ack floor) past it.
        state.skip_to(log.commit_seq)


async def _wait_for_work(log: StreamLog, changed: asyncio.Event, *, above_seq: int,
                         timeout_s: float) -> None:
    """Until a commit above `above_seq`, a change to the consumer, or the timeout."""
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + timeout_s
    commit = asyncio.ensure_future(log.wait_for_commit(above_seq=above_seq, timeout_s=timeout_s))
    change = asyncio.ensure_future(changed.wait())
    try:
        done, _ = await asyncio.wait({commit, change}, timeout=timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if done == {commit} and not commit.result():
            # A closed log answers at once: only a consumer change (or the timeout) helps now.
            await asyncio.wait({change}, timeout=max(give_up_at - loop.time(), 0))
    finally:
        for waiter in (commit, change):
            waiter.cancel()
        await asyncio.gather(commit, change, return_exceptions=True)


def _check_range(name: str, value: int, *, low: int, high: int) -> None:
    if not low <= value <= high:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"{name} must be in {low}..{high}, "
                           f"not {value}", field=name, limit=high)
