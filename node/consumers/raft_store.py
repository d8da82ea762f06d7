"""Consumer state committed through the Raft metadata group: `RaftConsumerStore`, the
`ConsumerStore` (consumer_store.py) a stream's primary uses so that a new primary resumes every
consumer after failover without redelivering an acknowledged seq (G5).

Owns the mapping between the engine's `storage_pb2.ConsumerRecord` and the metadata group's
`ConsumerAssignment` / `ConsumerProgress` (raft.proto), and the coalescing of saves into
`ConsumerStateUpdate` commands. Knows nothing of gRPC; runs on the event loop thread only.

save: a record becomes a `ConsumerProgress` (ack floor, acked seqs above it, delivered_seq), minus
  what the locally applied state already holds (it holds only committed entries, and the state
  machine merges progress monotonically: floors and delivered_seq take the max, acked sets
  union; so the difference commits the same state). Saves arriving within
  `limits.consumer_save_coalesce_ms` of the first pending one, or until the batch nears
  `limits.metadata_command_bytes_max`, go out together; a later save of a consumer already
  pending is merged into it (max floor, union, max cursor). Up to
  `limits.consumer_batches_inflight_max` batches are in flight at once (they may commit in any
  order: the state machine merges); saves that arrive while that many are in flight wait for
  one to end and go together. A batch's commands (several when one would be too big) are
  proposed concurrently, and every caller waits for the commit of each command that carries
  part of its save. A save whose content is
  already committed returns without proposing.
  Errors: the proposal's error (NO_LEADER, TIMEOUT, ...) for every save in that command; a
  skipped update fails that consumer's save with the skip's reason (CONSUMER_NOT_FOUND,
  STREAM_NOT_FOUND, OVERLOADED); OVERLOADED when `limits.consumer_pending_saves_max` callers
  already wait.

load: see `record_from_assignment`. The Raft state knows the floor, the acked seqs above it and
  the delivery cursor, not which seqs in between were handed out: every unacked seq in
  (ack_floor, delivered_seq] comes back as a pending delivery due after the ack wait.

delete: proposes ConsumerDelete when the consumer is still in the state; one already gone is not
  an error. A save of that consumer still pending fails with CONSUMER_NOT_FOUND.

Timers (the coalescing window, the bounds on every wait) run on the event loop's clock, like
every other wait in node/; the injected Clock stamps the commands' now_ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import InvariantViolation, RaftlogError, Reason
from raftlog.base.waiters import settle
from raftlog.internal import raft_pb2, storage_pb2
from raftlog.raft import commands
from raftlog.raft.api import OUTCOME_UNKNOWN, MetaGroup, ensure_ok
from raftlog.raft.state_model import consumer_updates_max
from raftlog.v1 import consumers_pb2

log = logging.getLogger(__name__)

_GONE_REASONS = (Reason.CONSUMER_NOT_FOUND.name, Reason.STREAM_NOT_FOUND.name)

Key = tuple[str, str]  # (stream, consumer)


@dataclass(eq=False)
class PendingSave:
    """One consumer's progress waiting to be committed, and every caller waiting for it."""

    stream: str
    consumer: str
    ack_floor: int
    acked: set[int]  # all above ack_floor
    delivered_seq: int
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    fence_epoch: int = 0  # the saving primary's epoch (0 = unchecked)

    @property
    def key(self) -> Key:
        return (self.stream, self.consumer)

    @classmethod
    def from_record(cls, stream: str, record: storage_pb2.ConsumerRecord) -> PendingSave:
        floor = record.ack_floor
        return cls(stream=stream, consumer=record.config.name, ack_floor=floor,
                   acked={seq for seq in record.acked if seq > floor},
                   delivered_seq=record.delivered_seq)

    def merge(self, later: PendingSave) -> None:
        """Takes in a later save of the same consumer, as the state machine would merge both."""
        self.ack_floor = max(self.ack_floor, later.ack_floor)
        self.acked = {seq for seq in self.acked | later.acked if seq > self.ack_floor}
        self.delivered_seq = max(self.delivered_seq, later.delivered_seq)
        self.fence_epoch = max(self.fence_epoch, later.fence_epoch)

    def progress(self, acked: Iterable[int] = ()) -> raft_pb2.ConsumerProgress:
        progress = commands.consumer_progress(stream=self.stream, consumer=self.consumer,
                                              ack_floor=self.ack_floor, acked=acked,
                                              delivered_seq=self.delivered_seq)
        progress.fence_epoch = self.fence_epoch
        return progress

    def size_bytes(self) -> int:
        """Bytes this save adds to a ConsumerStateUpdate (before any split)."""
        return _entry_bytes(self.progress(sorted(self.acked)).ByteSize())


@dataclass(frozen=True)
class _Command:
    command: raft_pb2.RaftCommand
    keys: frozenset[Key]


class RaftConsumerStore:
    """ConsumerStore over the metadata group. One per node; event loop thread only."""

    def __init__(self, *, group: MetaGroup, clock: Clock,
                 coalesce_ms: float | None = None,
                 propose_timeout_s: float | None = None,
                 pending_saves_max: int | None = None,
                 redeliveries_on_load_max: int | None = None,
                 epoch_of: Callable[[str], int | None] | None = None) -> None:
        """`epoch_of(stream)` is the fence epoch this node leads the stream at, None when it
        does not lead it (any more); saves carry it so that the cluster refuses acks taken by
        a primary that was replaced meanwhile, and a node that does not lead refuses them
        itself. The other options default to the `consumer_*` limits (base/limits.py), read
        here."""
        self._epoch_of = epoch_of
        self._group = group
        self._clock = clock
        self._coalesce_s = (limits.consumer_save_coalesce_ms if coalesce_ms is None
                            else coalesce_ms) / 1000
        self._propose_timeout_s = (limits.consumer_propose_timeout_s if propose_timeout_s is None
                                   else propose_timeout_s)
        self._pending_saves_max = (limits.consumer_pending_saves_max if pending_saves_max is None
                                   else pending_saves_max)
        self._batches_inflight_max = limits.consumer_batches_inflight_max
        self._redeliveries_on_load_max = (limits.consumer_redeliveries_on_load_max
                                          if redeliveries_on_load_max is None
                                          else redeliveries_on_load_max)
        # The batch in flight took at most one propose round; the caller's, one more.
        self._save_wait_s_max = self._coalesce_s + 2 * (self._propose_timeout_s
                                                        + limits.consumer_propose_grace_s)
        self._budget_bytes = _budget_bytes()
        self._pending: dict[Key, PendingSave] = {}
        self._pending_bytes = 0
        self._first_pending_at = 0.0  # loop time the oldest pending save arrived
        self._waiting = 0  # callers whose futures are not settled
        self._wake = asyncio.Event()  # the pending batch is full: propose it now
        self._arrived = asyncio.Event()  # a save was enqueued (the runner may start a batch)
        self._task: asyncio.Task[None] | None = None
        self._closed: RaftlogError | None = None

    # ----------------------------------------------------------------- ConsumerStore

    def load(self, stream: str) -> list[storage_pb2.ConsumerRecord]:
        """Records for a primary taking the stream over; run `catch_up` first on a new primary."""
        with self._group.read_state() as state:
            found = [(_copy_config(a.config), a.created_ms, a.ack_floor, sorted(a.acked),
                      a.delivered_seq) for a in state.consumers.get(stream, {}).values()]
        return [record_from_assignment(config=config, created_ms=created_ms, ack_floor=floor,
                                       acked=acked, delivered_seq=delivered_seq,
                                       redeliveries_max=self._redeliveries_on_load_max)
                for config, created_ms, floor, acked, delivered_seq in found]

    async def save(self, stream: str, record: storage_pb2.ConsumerRecord) -> None:
        """Returns once the record's progress is committed by the metadata group."""
        if self._closed is not None:
            raise self._closed
        if not record.config.name:
            raise RaftlogError(Reason.INVALID_ARGUMENT, "a consumer record needs a name",
                               stream=stream)
        save = PendingSave.from_record(stream, record)
        if self._epoch_of is not None:
            epoch = self._epoch_of(stream)
            if epoch is None:
                # Deposed (or a replica now): the epoch number it knows may be its successor's,
                # and a save under it would pass the state machine's fence while the new
                # primary, which loaded the consumers when it took over, never sees it.
                raise RaftlogError(Reason.NOT_PRIMARY, f"this node no longer leads {stream!r}: "
                                   f"consumer {save.consumer}'s state was not saved",
                                   stream=stream, consumer=save.consumer)
            save.fence_epoch = epoch
        if not self._drop_committed(save):
            return  # the committed state already holds all of it
        if self._waiting >= self._pending_saves_max:
            raise RaftlogError(Reason.OVERLOADED,
                               f"{self._waiting} consumer state saves are waiting for the "
                               "metadata group; try again", limit=self._pending_saves_max)
        waiter = self._enqueue(save)
        try:
            await asyncio.wait_for(waiter, self._save_wait_s_max)  # cancels it on timeout
        except TimeoutError:
            raise RaftlogError(Reason.TIMEOUT, f"consumer {stream}/{save.consumer}: state not "
                               f"committed within {self._save_wait_s_max:.1f} s",
                               outcome=OUTCOME_UNKNOWN) from None

    async def delete(self, stream: str, name: str) -> None:
        """Removes the consumer from the metadata; one already gone is not an error."""
        dropped = self._pending.pop((stream, name), None)
        if dropped is not None:
            self._pending_bytes -= dropped.size_bytes()
            self._settle(dropped, _not_found(stream, name))
        with self._group.read_state() as state:
            if name not in state.consumers.get(stream, {}):
                return
        result = await self._propose(commands.consumer_delete(
            stream=stream, consumer=name, now_ms=self._clock.wall_ms()))
        if not result.ok and result.reason in _GONE_REASONS:
            return
        ensure_ok(result)

    # ----------------------------------------------------------------- extras

    async def catch_up(self) -> None:
        """Commits a Barrier: afterwards `load` sees every consumer state committed before the
        call. A node becoming a stream's primary runs this before attaching the stream."""
        ensure_ok(await self._propose(commands.barrier(now_ms=self._clock.wall_ms())))

    async def close(self) -> None:
        """Fails every waiting save with SHUTTING_DOWN; later saves fail the same way."""
        self._closed = RaftlogError(Reason.SHUTTING_DOWN, "the consumer store is closed")
        for save in self._take_pending():
            self._settle(save, self._closed)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ----------------------------------------------------------------- coalescing

    def _enqueue(self, save: PendingSave) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        pending = self._pending.get(save.key)
        if pending is None:
            if not self._pending:
                self._first_pending_at = loop.time()
            self._pending[save.key] = pending = save
        else:
            self._pending_bytes -= pending.size_bytes()
            pending.merge(save)
        pending.waiters.append(waiter)
        self._waiting += 1
        self._pending_bytes += pending.size_bytes()
        if self._full():
            self._wake.set()
        self._arrived.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        return waiter

    def _full(self) -> bool:
        return (self._pending_bytes >= self._budget_bytes
                or len(self._pending) >= consumer_updates_max)

    def _take_pending(self) -> list[PendingSave]:
        saves = list(self._pending.values())
        self._pending, self._pending_bytes = {}, 0
        return saves

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        inflight: set[asyncio.Task[None]] = set()
        try:
            while self._pending or inflight:
                room = len(inflight) < self._batches_inflight_max
                if self._pending and room:
                    self._wake.clear()
                    delay_s = self._first_pending_at + self._coalesce_s - loop.time()
                    if delay_s > 0 and not self._full():
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._wake.wait(), delay_s)
                    inflight.add(asyncio.create_task(self._commit(self._take_pending())))
                    continue
                # Nothing to start now: wait for a batch to end or, with room, a save to come.
                waits: set[asyncio.Future[Any]] = set(inflight)
                arrival: asyncio.Future[Any] | None = None
                if room:
                    self._arrived.clear()
                    arrival = asyncio.ensure_future(self._arrived.wait())
                    waits.add(arrival)
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if arrival is not None:
                        arrival.cancel()
                inflight = {task for task in inflight if not task.done()}
        finally:
            for task in inflight:  # closing: each batch settles its callers as it ends
                task.cancel()
            if inflight:
                await asyncio.wait(inflight)
            if self._task is asyncio.current_task():
                self._task = None

    async def _commit(self, saves: list[PendingSave]) -> None:
        """Proposes one batch and settles every waiter in it, whatever happens."""
        errors: dict[Key, RaftlogError] = {}
        try:
            errors = await self._propose_batch(saves)
        except asyncio.CancelledError:
            error = RaftlogError(Reason.SHUTTING_DOWN, "the consumer store is closed")
            errors = {save.key: error for save in saves}
            raise
        except Exception as exc:  # a bug: nobody is told "durable", the flusher goes on
            log.exception("consumer state batch failed")
            error = RaftlogError(Reason.INTERNAL, f"consumer state batch failed: {exc!r}")
            errors = {save.key: error for save in saves}
        finally:
            for save in saves:
                self._settle(save, errors.get(save.key))

    async def _propose_batch(self, saves: list[PendingSave]) -> dict[Key, RaftlogError]:
        # What committed while the batch waited (e.g. the batch before it) need not go again.
        fresh = [save for save in saves if self._drop_committed(save)]
        batch = build_commands(fresh, now_ms=self._clock.wall_ms(),
                               budget_bytes=self._budget_bytes)
        outcomes = await asyncio.gather(*(self._propose(c.command) for c in batch),
                                        return_exceptions=True)
        errors: dict[Key, RaftlogError] = {}
        for sent, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, raft_pb2.RaftResult):
                for key, error in _command_errors(sent, outcome):
                    errors.setdefault(key, error)
            elif isinstance(outcome, Exception):
                error = outcome if isinstance(outcome, RaftlogError) else RaftlogError(
                    Reason.INTERNAL, f"proposing consumer state failed: {outcome!r}")
                for key in sent.keys:
                    errors.setdefault(key, error)
            else:
                raise outcome  # CancelledError and the like: the store is closing
        return errors

    async def _propose(self, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
        """The group's result (rejections included); raises what propose raised, or TIMEOUT
        when the group did not answer within its own timeout plus
        `limits.consumer_propose_grace_s`."""
        wait_s = self._propose_timeout_s + limits.consumer_propose_grace_s
        try:
            return await asyncio.wait_for(
                self._group.propose(command, timeout_s=self._propose_timeout_s), wait_s)
        except TimeoutError:
            raise RaftlogError(Reason.TIMEOUT, "the metadata group did not answer within "
                               f"{wait_s:.1f} s",
                               outcome=OUTCOME_UNKNOWN) from None

    def _drop_committed(self, save: PendingSave) -> bool:
        """Removes from `save` what the locally applied (so committed) state holds; False when
        nothing is left to commit. An unknown consumer is left whole: the state machine says."""
        with self._group.read_state() as state:
            assignment = state.consumers.get(save.stream, {}).get(save.consumer)
            if assignment is None:
                return True
            floor, delivered_seq = assignment.ack_floor, assignment.delivered_seq
            save.acked = {seq for seq in save.acked
                          if seq > floor and seq not in assignment.acked}
        return bool(save.acked) or save.ack_floor > floor or save.delivered_seq > delivered_seq

    def _settle(self, save: PendingSave, error: RaftlogError | None) -> None:
        self._waiting -= len(save.waiters)
        settle(save.waiters, error)
        save.waiters.clear()


# ----------------------------------------------------------------- commands (pure)


def _budget_bytes() -> int:
    """Bytes of updates one command carries: the command limit less its framing."""
    return limits.metadata_command_bytes_max - limits.consumer_command_headroom_bytes


def build_commands(saves: Iterable[PendingSave], *, now_ms: int,
                   budget_bytes: int | None = None) -> list[_Command]:
    """ConsumerStateUpdate commands carrying every save, each under
    `limits.metadata_command_bytes_max`; a save too big for one command is split by acked
    seqs over several (same floor, same cursor: the state machine's merge makes the parts add
    up to the whole). `budget_bytes` defaults to that limit less the command's framing."""
    if budget_bytes is None:
        budget_bytes = _budget_bytes()
    command_bytes_max = limits.metadata_command_bytes_max
    out: list[_Command] = []
    parts: list[raft_pb2.ConsumerProgress] = []
    keys: set[Key] = set()
    used_bytes = 0

    def emit() -> None:
        command = commands.consumer_state_update(updates=parts, now_ms=now_ms)
        if command.ByteSize() > command_bytes_max:
            raise InvariantViolation(f"consumer state command of {command.ByteSize()} bytes "
                                     f"over {command_bytes_max}")
        out.append(_Command(command=command, keys=frozenset(keys)))

    for save in saves:
        for part in _split(save, budget_bytes=budget_bytes):
            part_bytes = _entry_bytes(part.ByteSize())
            if parts and (used_bytes + part_bytes > budget_bytes
                          or len(parts) >= consumer_updates_max):
                emit()
                parts, keys, used_bytes = [], set(), 0
            parts.append(part)
            keys.add(save.key)
            used_bytes += part_bytes
    if parts:
        emit()
    return out


def _split(save: PendingSave, *, budget_bytes: int) -> Iterator[raft_pb2.ConsumerProgress]:
    """The save as one progress entry, or several (by acked seqs) when one would not fit."""
    acked = sorted(save.acked)
    base_bytes = save.progress().ByteSize()
    chunk: list[int] = []
    chunk_bytes = 0  # varints of `chunk`
    for seq in acked:
        seq_bytes = _varint_bytes(seq)
        if chunk and _progress_entry_bytes(base_bytes, chunk_bytes + seq_bytes) > budget_bytes:
            yield _checked_part(save, chunk, budget_bytes=budget_bytes)
            chunk, chunk_bytes = [], 0
        chunk.append(seq)
        chunk_bytes += seq_bytes
    if chunk or not acked:
        yield _checked_part(save, chunk, budget_bytes=budget_bytes)


def _checked_part(save: PendingSave, acked: list[int], *, budget_bytes: int
                  ) -> raft_pb2.ConsumerProgress:
    part = save.progress(acked)
    if _entry_bytes(part.ByteSize()) > budget_bytes:
        raise InvariantViolation(f"consumer progress of {part.ByteSize()} bytes over the "
                                 f"{budget_bytes}-byte budget")
    return part


def _progress_entry_bytes(base_bytes: int, acked_bytes: int) -> int:
    """Bytes of a progress entry in ConsumerStateUpdate: base fields plus the packed acked."""
    packed = 1 + _varint_bytes(acked_bytes) + acked_bytes if acked_bytes else 0
    return _entry_bytes(base_bytes + packed)


def _entry_bytes(message_bytes: int) -> int:
    """A message as an element of a repeated field: tag, length, body."""
    return 1 + _varint_bytes(message_bytes) + message_bytes


def _varint_bytes(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _command_errors(sent: _Command, result: raft_pb2.RaftResult
                    ) -> Iterator[tuple[Key, RaftlogError]]:
    """The saves a committed (or rejected) command did not make durable, with why."""
    if not result.ok:
        try:
            ensure_ok(result)
        except RaftlogError as error:
            for key in sent.keys:
                yield key, error
        return
    for skipped in result.skipped:
        key = (skipped.stream, skipped.consumer)
        reason = Reason.__members__.get(skipped.reason, Reason.INTERNAL)
        if reason is Reason.STALE_EPOCH:  # a new primary took over: the client retries there
            reason = Reason.NOT_PRIMARY
        yield key, RaftlogError(
            reason, f"consumer state of {key[0]}/{key[1]} was not committed: the metadata "
            f"group skipped it ({skipped.reason})", stream=key[0], consumer=key[1],
            raft_index=result.index)


def _not_found(stream: str, name: str) -> RaftlogError:
    return RaftlogError(Reason.CONSUMER_NOT_FOUND,
                        f"consumer {name!r} of stream {stream!r} was deleted",
                        stream=stream, consumer=name)


# ----------------------------------------------------------------- load (pure)


def record_from_assignment(*, config: consumers_pb2.ConsumerConfig, created_ms: int,
                           ack_floor: int, acked: Iterable[int], delivered_seq: int,
                           redeliveries_max: int | None = None
                           ) -> storage_pb2.ConsumerRecord:
    """The ConsumerRecord a new primary resumes from, given the committed progress.

    DeliveryState.from_record reads a record as: every seq <= ack_floor is done; `acked` seqs
    are done; `deliveries` are handed out and unacked (due again after the ack wait); the cursor
    `delivered_seq` was passed, so nothing at or below it is handed out as new. Hence:
    - floor and acked are the committed ones (every ack answered to a client is in them), and
      the cursor is at least the highest of them, so (a) no acked seq is handed out again;
    - each unacked seq in (ack_floor, cursor] becomes a delivery (count 1, the least it had),
      so (b) whatever was handed out and not acked is redelivered once its ack wait passes.
      Seqs in that range that were skipped rather than handed out (removed, or not matching
      the filter) cannot be told apart without the log: the engine's attach_stream drops the
      removed ones, and must drop the ones its filter does not match. Seqs handed out after
      the last committed save lie above the cursor and are delivered as new; an ack of one
      is accepted all the same (consumer_state.py, `restored_last_seq`).
    - at most `redeliveries_max` deliveries (by default
      `limits.consumer_redeliveries_on_load_max`), the lowest unacked seqs; any unacked seq
      above them stays below the cursor and is treated as done (never an acked seq handed out
      again).
    Not in the metadata, so not restored: delivery counts above 1, num_dead_lettered and the
    LAST_PER_SUBJECT start set (delivery continues in seq order after the cursor, a superset).
    """
    if redeliveries_max is None:
        redeliveries_max = limits.consumer_redeliveries_on_load_max
    floor = ack_floor
    done = {seq for seq in acked if seq > floor}
    while floor + 1 in done:  # as the state machine keeps it; also mends a state that did not
        floor += 1
        done.discard(floor)
    cursor = max(delivered_seq, floor, max(done, default=0))
    deliveries: dict[int, int] = {}
    seq = floor + 1
    while seq <= cursor and len(deliveries) < redeliveries_max:
        if seq not in done:
            deliveries[seq] = 1
        seq += 1
    if seq <= cursor:
        log.warning("consumer %r: %d+ unacked seqs above ack floor %d; only the lowest %d are "
                    "redelivered after this failover", config.name, len(deliveries) + 1,
                    floor, redeliveries_max)
    return storage_pb2.ConsumerRecord(config=config, created_ms=created_ms,
                                      delivered_seq=cursor, ack_floor=floor,
                                      acked=sorted(done), deliveries=deliveries)


def _copy_config(config: consumers_pb2.ConsumerConfig) -> consumers_pb2.ConsumerConfig:
    copy = consumers_pb2.ConsumerConfig()
    copy.CopyFrom(config)
    return copy
