"""Handing messages out: `DeliveryManager.fetch` collects due redeliveries first, then new
messages (the LAST_PER_SUBJECT start set, then the filtered scan), under the batch's caps
(`_Batch`), and waits for commits, consumer changes or the next redelivery deadline when there
is nothing to hand out. Nothing above the log's commit_seq is ever handed out (G4). Fetch does
not save: deliveries lost in a crash are redelivered (at-least-once); a message out of
deliveries is dead-lettered on the way (settlement.py).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from raftlog.base import limits
from raftlog.base.errors import InvariantViolation
from raftlog.node.consumers.serving import ServedConsumer, ServedStream, check_range
from raftlog.node.consumers.settlement import SettlementManager
from raftlog.node.consumers.state import DeliveryState
from raftlog.node.engine.log import Answer, LogEntry, StreamLog, fill_message
from raftlog.v1 import types_pb2


@dataclass
class _Batch:
    """One collect's messages and the caps they stay under. Dead letters count toward the
    batch, so one fetch does a bounded number of republishes."""

    stream: str
    size_max: int
    bytes_max: int | None = None  # of LogEntry.size_bytes, besides the payload cap
    # A list, or the repeated field of the answer the messages are built in (in place: a fetch
    # of 100 spends a third of its message-building time copying them into the answer).
    messages: list[types_pb2.Message] | Answer = field(default_factory=list)
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

    def add_new(self, entries: list[LogEntry]) -> int:
        """Adds first deliveries of `entries` (in order) while they fit; returns how many."""
        if self.bytes_max is not None or isinstance(self.messages, list):
            for taken, entry in enumerate(entries):
                if not self.fits(entry):
                    return taken
                self.add(entry, deliver_count=1)
            return len(entries)
        messages, stream, payload_bytes = self.messages, self.stream, self.payload_bytes
        payload_max = limits.fetch_bytes_max
        for taken, entry in enumerate(entries):
            payload = entry.payload
            payload_bytes += len(payload)
            if payload_bytes > payload_max and messages:
                self.full = True
                return taken
            self.payload_bytes = payload_bytes
            fill_message(messages.add(), stream, entry, deliver_count=1)
        return len(entries)

    def add_new_run(self, log: StreamLog, *, from_seq: int, limit: int) -> list[int]:
        """First deliveries of the committed messages from `from_seq` on (no filter), built
        straight into the answer (`StreamLog.fill_new`) while they fit; returns their seqs.
        Only for a batch that builds an answer with no bytes_max (`fills_answer`)."""
        if isinstance(self.messages, list):
            raise InvariantViolation("add_new_run needs an answer to build in")
        run = log.fill_new(self.messages, from_seq=from_seq, limit=limit,
                           payload_room=limits.fetch_bytes_max - self.payload_bytes)
        self.payload_bytes += run.payload_bytes
        self.full = self.full or run.full
        return run.seqs

    def fills_answer(self) -> bool:
        """Whether the batch builds an answer in place, under the payload cap alone."""
        return self.bytes_max is None and not isinstance(self.messages, list)

    def add(self, entry: LogEntry, *, deliver_count: int) -> None:
        messages = self.messages
        if isinstance(messages, list):
            messages.append(to_message(self.stream, entry, deliver_count=deliver_count))
        else:
            fill_message(messages.add(), self.stream, entry, deliver_count=deliver_count)
        self.payload_bytes += len(entry.payload)
        if self.bytes_max is not None:  # counted only for the cap (a hot path: fetch)
            self.message_bytes += entry.size_bytes


def to_message(stream: str, entry: LogEntry, *, deliver_count: int) -> types_pb2.Message:
    return fill_message(types_pb2.Message(), stream, entry, deliver_count=deliver_count)


class DeliveryManager(SettlementManager):
    """`SettlementManager` plus fetch."""

    async def fetch(self, stream: str, name: str, *, batch: int, max_wait_ms: int,
                    bytes_max: int | None = None,
                    into: Answer | None = None
                    ) -> list[types_pb2.Message] | Answer:
        """Up to `batch` messages (and, if given, at most `bytes_max` of LogEntry.size_bytes
        together, but at least one): due redeliveries first, then new ones. Waits up to
        `max_wait_ms` (real time) for the first one, woken by commits and consumer changes.
        `into`: an empty repeated field of an answer to build them in (and return); else a
        new list."""
        check_range("batch", batch, low=1, high=limits.fetch_batch_max)
        check_range("max_wait_ms", max_wait_ms, low=0, high=limits.fetch_wait_ms_max)
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + max_wait_ms / 1000
        while True:
            found, consumer = self._lookup(stream, name)
            changed, above_seq = consumer.changed, found.log.commit_seq
            messages = await self._collect(found, consumer, batch=batch, bytes_max=bytes_max,
                                           into=into)
            remaining_s = give_up_at - loop.time()
            if messages or remaining_s <= 0:
                return messages
            timeout_s = min(remaining_s, self._until_redelivery_s(consumer))
            await _wait_for_work(found.log, changed, above_seq=above_seq, timeout_s=timeout_s)

    async def _collect(self, found: ServedStream, consumer: ServedConsumer, *, batch: int,
                       bytes_max: int | None = None,
                       into: Answer | None = None
                       ) -> list[types_pb2.Message] | Answer:
        out = _Batch(stream=found.log.name, size_max=batch, bytes_max=bytes_max,
                     messages=[] if into is None else into)
        await self._redeliver_due(found, consumer, out)
        if consumer.closed is None:
            self._deliver_new(found, consumer, out)
        if out.dead_lettered:
            await self._make_durable(found, consumer, out.dead_lettered)
        return out.messages

    async def _redeliver_due(self, found: ServedStream, consumer: ServedConsumer,
                             out: _Batch) -> None:
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

    def _deliver_new(self, found: ServedStream, consumer: ServedConsumer, out: _Batch) -> None:
        state = consumer.state
        room = min(out.room(), state.config.max_ack_pending - len(state.pending))
        if room <= 0 or state.delivery_paused(acked_max=limits.acked_above_floor_max):
            return
        now_s, commit_seq = self._clock.monotonic_s(), found.log.commit_seq
        if not state.start_seqs and not state.acked_ahead():
            _deliver_run(found.log, state, out, limit=room, now_s=now_s)
            return
        for entry in _undelivered(found.log, state, limit=room):
            _check_committed(found.log, entry.seq, commit_seq)
            if not out.fits(entry):
                return
            out.add(entry, deliver_count=state.deliver(entry.seq, now_s=now_s))

    def _until_redelivery_s(self, consumer: ServedConsumer) -> float:
        deadline_s = consumer.state.pending.next_deadline_s()
        if deadline_s is None:
            return math.inf
        # A deadline that has just passed is handed out by the next collect; the floor only
        # keeps a wait from ever being zero, so no path can turn into a busy loop.
        return max(deadline_s - self._clock.monotonic_s(), limits.redelivery_wait_s_min)


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
    if produced == 0:
        _skip_unmatched(log, state, from_seq=from_seq)


def _deliver_run(log: StreamLog, state: DeliveryState, out: _Batch, *, limit: int,
                 now_s: float) -> None:
    """The common case of `_undelivered` (no start set, nothing acked ahead of the cursor, so
    nothing to pass over): the next `limit` matching entries are read at once, as many as fit
    are handed out together, and the state records them in one step."""
    from_seq = state.delivered_seq + 1
    filter_subject = state.config.filter_subject
    if not filter_subject and out.fills_answer():  # the hot path: a Fetch call's answer
        seqs = out.add_new_run(log, from_seq=from_seq, limit=limit)
        if not seqs:
            if not out.full:
                _skip_unmatched(log, state, from_seq=from_seq)
            return
        _check_committed(log, seqs[-1], log.commit_seq)
        state.deliver_new(seqs, now_s=now_s)
        return
    entries = list(log.scan(from_seq=from_seq, filter_subject=filter_subject, limit=limit))
    if not entries:
        _skip_unmatched(log, state, from_seq=from_seq)
        return
    _check_committed(log, entries[-1].seq, log.commit_seq)
    taken = out.add_new(entries)
    state.deliver_new([entry.seq for entry in entries[:taken]], now_s=now_s)


def _skip_unmatched(log: StreamLog, state: DeliveryState, *, from_seq: int) -> None:
    """After a scan from `from_seq` found nothing: when nothing up to the commit matches, the
    cursor (and so the ack floor) moves past it."""
    if from_seq <= log.commit_seq and not log.count_matching(
            from_seq=from_seq, filter_subject=state.config.filter_subject):
        state.skip_to(log.commit_seq)


def _check_committed(log: StreamLog, seq: int, commit_seq: int) -> None:
    if seq > commit_seq:
        raise InvariantViolation(f"stream {log.name}: seq {seq} above commit_seq "
                                 f"{commit_seq} offered to a consumer")


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
