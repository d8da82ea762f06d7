"""What the consumer manager keeps while it serves consumers, and the plumbing every part of it
shares: `ServedStream` and `ServedConsumer` (one attached stream, one consumer of it), the
coalescing `Flusher` and the save it runs (work-queue removals first, then `store.save`), and
`ManagerBase`: lookup, wake-ups, closing a consumer, and `ConsumerInfo`.

The manager is built in layers, each a subclass of the one before, each in its own module:
`ManagerBase` (here) < `RetentionManager` (retention.py) < `SettlementManager` (settlement.py)
< `DeliveryManager` (delivery.py) < `ConsumerManager` (manager.py). The ordering rules they keep
together are written in manager.py's docstring.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from raftlog.base import limits
from raftlog.base import subjects as subject_rules
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.base.waiters import settle
from raftlog.internal import storage_pb2
from raftlog.node.consumers.state import DeliveryState
from raftlog.node.consumers.store import ConsumerStore
from raftlog.node.engine.log import StreamLog
from raftlog.v1 import consumers_pb2, types_pb2

DLQ_HEADERS = ("raftlog-dlq-stream", "raftlog-dlq-consumer", "raftlog-dlq-seq",
               "raftlog-dlq-subject", "raftlog-dlq-deliveries")


class Flusher:
    """Coalesces the saves of one consumer: `flush` returns once a save whose snapshot was taken
    after the call has completed (or raises what that save raised). The flushes of one
    event-loop turn share a save, started at the end of the turn when fewer than `inflight_max`
    are in flight; otherwise they wait for one to end, and the next save covers every flush
    that waited meanwhile. A flush that finds a save in flight gathers: the next save starts
    `gather_s` after it (or later, when `inflight_max` are in flight), so a consumer acked
    faster than its saves commit makes one save of several flushes, not one each; a flush
    that finds none in flight starts its save at once. Saves in flight may complete in any
    order: a save settles every flush its snapshot covers that is not settled yet (the store
    merges progress monotonically, so a later snapshot holds everything an earlier one did)."""

    def __init__(self, begin_save: Callable[[], Awaitable[None]], *,
                 inflight_max: int = limits.consumer_saves_inflight_max,
                 gather_s: float | None = None) -> None:
        """`gather_s`: None reads `limits.consumer_save_gather_ms`."""
        # begin_save() takes the snapshot synchronously and returns the awaitable that saves it.
        self._begin_save = begin_save
        self._inflight_max = inflight_max
        self._gather_s = (limits.consumer_save_gather_ms / 1000 if gather_s is None
                          else gather_s)
        self._requested = 0
        self._started_up_to = 0  # the last flush a started save covers
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._inflight: set[asyncio.Task[None]] = set()
        self._start_scheduled = False
        self._gather_until: float | None = None  # loop time the gathering flushes wait for
        self._gather_timer: asyncio.TimerHandle | None = None
        self._closed: RaftlogError | None = None

    async def flush(self) -> None:
        if self._closed is not None:
            raise self._closed
        self._requested += 1
        loop = asyncio.get_running_loop()
        if self._requested == self._started_up_to + 1 and self._inflight and self._gather_s > 0:
            self._gather_until = loop.time() + self._gather_s  # the first not started: gather
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append((self._requested, waiter))
        if not self._start_scheduled:  # after the other flushes of this turn
            self._start_scheduled = True
            loop.call_soon(self._start_saves)
        await waiter

    def close(self, error: RaftlogError) -> None:
        """No save starts after this; every waiter fails with `error`."""
        self._closed = error
        if self._gather_timer is not None:
            self._gather_timer.cancel()
            self._gather_timer = None
        self._settle(self._requested, error)

    async def idle(self) -> None:
        """Returns once no save is in flight (after `close`: none starts again). A save is
        bounded by the store's own wait; cancelling this call leaves the saves running."""
        while self._inflight:
            await asyncio.wait(set(self._inflight))

    def _start_saves(self) -> None:
        self._start_scheduled = False
        if self._gather_until is not None:
            loop = asyncio.get_running_loop()
            if loop.time() < self._gather_until:
                if self._gather_timer is None:
                    self._gather_timer = loop.call_at(self._gather_until, self._gathered)
                return
            self._gather_until = None
        while (self._closed is None and self._requested > self._started_up_to
               and len(self._inflight) < self._inflight_max):
            covered = self._started_up_to = self._requested
            try:
                saving = self._begin_save()  # the snapshot, taken now
            except Exception as exc:
                self._settle(covered, exc)
                continue
            task = asyncio.create_task(self._finish(saving, covered))
            self._inflight.add(task)

    def _gathered(self) -> None:
        self._gather_timer = None
        self._start_saves()

    async def _finish(self, saving: Awaitable[None], covered: int) -> None:
        try:
            await saving
        except Exception as exc:
            self._settle(covered, exc)
        else:
            self._settle(covered, self._closed)
        finally:
            current = asyncio.current_task()
            if current is not None:
                self._inflight.discard(current)
            self._start_saves()

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
class ServedConsumer:
    state: DeliveryState
    flusher: Flusher = field(init=False)
    # Replaced on every notify: a waiter holds the Event it saw before it looked for work.
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    removals: list[int] = field(default_factory=list)  # work queue: done, not yet removed
    closed: RaftlogError | None = None
    # Acks a fetch carried (settlement.py `ack_behind`): done, their save not started yet, and
    # the one task that saves them, one save at a time.
    done_behind: list[int] = field(default_factory=list)
    saving_behind: asyncio.Task[None] | None = None


@dataclass(eq=False)
class ServedStream:
    log: StreamLog
    retention: int
    subjects: tuple[str, ...]
    consumers: dict[str, ServedConsumer] = field(default_factory=dict)
    admin: asyncio.Lock = field(default_factory=asyncio.Lock)  # serialises create and delete
    trimming: bool = False
    interest_scanned: int = 0  # interest: seqs up to here were checked against the filters
    trim_due: set[int] = field(default_factory=set)  # interest: seqs a consumer just finished


def may_hold(log: StreamLog, filter_subject: str) -> Callable[[int], bool]:
    """Whether a seq above the cursor may have been handed to this consumer by an earlier
    primary: its message is gone, or the filter matches it."""
    def holds(seq: int) -> bool:
        entry = log.peek(seq)
        return entry is None or not filter_subject or subject_rules.matches(filter_subject,
                                                                            entry.subject)
    return holds


def present_in(log: StreamLog, filter_subject: str = "") -> Callable[[int], bool]:
    """Whether a seq still holds a message this consumer could be handed (after a failover
    the cluster's record cannot tell a delivered seq from one the filter skipped).

    Judged on what is stored, not on what is committed: a primary that just restarted or was
    promoted attaches its consumers before its commit seq is re-established, and a pending
    delivery above that commit seq is not gone (it was committed when it was handed out, so
    no later primary truncates it); forgetting it would break at-least-once delivery."""
    def present(seq: int) -> bool:
        entry = log.peek_stored(seq)
        return entry is not None and (
            not filter_subject or subject_rules.matches(filter_subject, entry.subject))
    return present


def check_range(name: str, value: int, *, low: int, high: int) -> None:
    if not low <= value <= high:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"{name} must be in {low}..{high}, "
                           f"not {value}", field=name, limit=high)


class ManagerBase:
    """The streams served, their consumers, and what every layer of the manager shares."""

    def __init__(self, *, store: ConsumerStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._streams: dict[str, ServedStream] = {}
        self._behind: set[asyncio.Task[None]] = set()  # saves nobody waits for (settlement.py)

    # ----------------------------------------------------------------- lookup

    def _stream(self, stream: str) -> ServedStream:
        found = self._streams.get(stream)
        if found is None:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"no stream named {stream!r}",
                               stream=stream)
        return found

    def _lookup(self, stream: str, name: str) -> tuple[ServedStream, ServedConsumer]:
        found = self._stream(stream)
        consumer = found.consumers.get(name)
        if consumer is None:
            raise self._not_found(stream, name)
        if consumer.closed is not None:  # held out of service (manager.replace_committed)
            raise consumer.closed
        return found, consumer

    @staticmethod
    def _not_found(stream: str, name: str) -> RaftlogError:
        return RaftlogError(Reason.CONSUMER_NOT_FOUND,
                            f"stream {stream!r} has no consumer named {name!r}",
                            stream=stream, consumer=name)

    # ----------------------------------------------------------------- wake-ups and closing

    @staticmethod
    def _notify(consumer: ServedConsumer) -> None:
        consumer.changed.set()
        consumer.changed = asyncio.Event()

    def _close(self, consumer: ServedConsumer, error: RaftlogError) -> None:
        consumer.closed = error
        consumer.flusher.close(error)
        self._notify(consumer)

    # ----------------------------------------------------------------- saving

    def _add(self, found: ServedStream, state: DeliveryState) -> ServedConsumer:
        consumer = ServedConsumer(state=state)
        # A save calls store.save in its first step, so saves started in snapshot order reach
        # the store in that order (its contract keeps call order). A work-queue save removes
        # messages first, and a later save must not overtake it: one at a time there.
        inflight_max = (1 if found.retention == types_pb2.RETENTION_POLICY_WORK_QUEUE
                        else limits.consumer_saves_inflight_max)
        consumer.flusher = Flusher(lambda: self._begin_save(found, consumer),
                                   inflight_max=inflight_max)
        found.consumers[state.name] = consumer
        return consumer

    def _begin_save(self, found: ServedStream, consumer: ServedConsumer) -> Awaitable[None]:
        record = consumer.state.to_record()
        removals, consumer.removals = consumer.removals, []
        return self._finish_save(found, consumer, record, removals)

    async def _finish_save(self, found: ServedStream, consumer: ServedConsumer,
                           record: storage_pb2.ConsumerRecord,
                           removals: list[int]) -> None:
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

    # ----------------------------------------------------------------- reporting

    def _num_pending(self, found: ServedStream, state: DeliveryState) -> int:
        log, from_seq = found.log, state.undelivered_from_seq
        # Acked ahead of the cursor (after a failover): counted by the log, never handed out.
        acked_ahead = sum(1 for seq in state.acked
                          if seq >= from_seq and log.peek(seq) is not None)
        return len(state.start_seqs) + max(0, log.count_matching(
            from_seq=from_seq, filter_subject=state.config.filter_subject) - acked_ahead)

    def _info(self, found: ServedStream,
              consumer: ServedConsumer) -> consumers_pb2.ConsumerInfo:
        state = consumer.state
        return consumers_pb2.ConsumerInfo(
            stream=found.log.name, config=state.config, created_ms=state.created_ms,
            state=state.snapshot(num_pending=self._num_pending(found, state)))
