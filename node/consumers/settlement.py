"""Settling deliveries: `SettlementManager` answers Ack, Term, Nak and InProgress per seq
(`Settled`), dead-letters a message out of deliveries (republishing it with `DLQ_HEADERS` when
the consumer names a dead-letter subject), and makes what became done durable.

Ack and Term return only after a save that includes them has completed, and on a work-queue
stream only after the messages were removed; Nak and InProgress do not save; dead-lettering
does, like a Term. `ack_behind` (the acks a Fetch carries) takes effect the same way at once
and saves behind the caller, who is not told when. Which seqs may be settled is decided in
state.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from raftlog.base import limits
from raftlog.base.errors import RaftlogError
from raftlog.node.consumers.retention import RetentionManager
from raftlog.node.consumers.serving import (
    DLQ_HEADERS,
    ServedConsumer,
    ServedStream,
    Settled,
    check_range,
    may_hold,
)
from raftlog.node.consumers.state import DeliveryState
from raftlog.node.engine.log import LogEntry, StreamLog
from raftlog.v1 import types_pb2

log = logging.getLogger(__name__)


class SettlementManager(RetentionManager):
    """`RetentionManager` plus acknowledgements and dead letters."""

    async def ack(self, stream: str, name: str, seqs: Sequence[int]) -> Settled:
        """Per seq; the seqs that took effect are durable (and removed from a work queue) on
        return."""
        found, consumer, done, refused = self._take_acks(stream, name, seqs)
        if len(refused) < len(set(seqs)):  # an accepted seq waits for its (or an earlier) save
            await self._make_durable(found, consumer, done)
        return Settled(applied=len(done), refused=refused)

    def ack_behind(self, stream: str, name: str, seqs: Sequence[int]) -> Settled:
        """Ack's rules and state change, now; the save (and a work queue's removals, an
        interest stream's trim) runs behind the caller, who does not wait for it. A save that
        fails leaves the acks in the consumer's state, and the next save carries them."""
        found, consumer, done, refused = self._take_acks(stream, name, seqs)
        if done:
            self._mark_done(found, consumer, done)
            consumer.done_behind.extend(done)
            if consumer.saving_behind is None:
                task = asyncio.create_task(self._save_behind(found, consumer))
                consumer.saving_behind = task
                self._behind.add(task)
                task.add_done_callback(self._behind.discard)
        return Settled(applied=len(done), refused=refused)

    def _take_acks(self, stream: str, name: str, seqs: Sequence[int]
                   ) -> tuple[ServedStream, ServedConsumer, list[int], dict[int, RaftlogError]]:
        """Ack's rules and state change: the consumer, the seqs that became done and the
        refused ones with why."""
        found, consumer = self._lookup(stream, name)
        state = consumer.state
        done, refused = state.ack(seqs, commit_seq=found.log.commit_seq,
                                  may_hold=may_hold(found.log, state.config.filter_subject))
        if done:
            _skip_acked_ahead(found.log, state)
        return found, consumer, done, refused

    async def _save_behind(self, found: ServedStream, consumer: ServedConsumer) -> None:
        """Saves a consumer's carried acks, one save at a time: the acks carried while a save
        is in flight all go in the next, which gathers them for `consumer_save_gather_ms`
        first (nobody waits for them, so they may as well share). A failed save leaves them in
        the state, and the next save carries them."""
        try:
            while consumer.done_behind and consumer.closed is None:
                done, consumer.done_behind = consumer.done_behind, []
                await consumer.flusher.flush()
                await self._maybe_trim(found, done)
                if consumer.done_behind:  # carried meanwhile: gather more before saving
                    await asyncio.sleep(limits.consumer_save_gather_ms / 1000)
        except RaftlogError as err:
            log.info("stream %s consumer %s: a save of acks carried by fetches failed (the "
                     "next save carries them): %s", found.log.name, consumer.state.name,
                     err.message)
        except Exception:  # a bug: the acks stay in the state, and the next save carries them
            log.exception("stream %s consumer %s: saving acks carried by fetches failed",
                          found.log.name, consumer.state.name)
        finally:
            consumer.saving_behind = None

    async def term(self, stream: str, name: str, seqs: Sequence[int]) -> Settled:
        """Never redeliver: counts as acked, durable on return."""
        return await self.ack(stream, name, seqs)

    async def nak(self, stream: str, name: str, seqs: Sequence[int], *,
                  delay_ms: int) -> Settled:
        """Redeliver after `delay_ms`; a seq out of deliveries is dead-lettered instead."""
        check_range("delay_ms", delay_ms, low=0, high=limits.nak_delay_ms_max)
        found, consumer = self._lookup(stream, name)
        state = consumer.state
        changed, exhausted, refused = state.nak(
            seqs, delay_s=delay_ms / 1000, now_s=self._clock.monotonic_s(),
            commit_seq=found.log.commit_seq,
            may_hold=may_hold(found.log, state.config.filter_subject))
        self._notify(consumer)
        dead: list[int] = []
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
            may_hold=may_hold(found.log, state.config.filter_subject))
        return Settled(applied=changed, refused=refused)

    async def _dead_letter(self, found: ServedStream, consumer: ServedConsumer,
                           entry: LogEntry) -> bool:
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

    def _mark_done(self, found: ServedStream, consumer: ServedConsumer,
                   done: Sequence[int]) -> None:
        """Seqs just became done: a work queue removes them with the next save (before it);
        waiting fetchers wake."""
        if found.retention == types_pb2.RETENTION_POLICY_WORK_QUEUE:
            consumer.removals.extend(done)
        self._notify(consumer)

    async def _make_durable(self, found: ServedStream, consumer: ServedConsumer,
                            done: Sequence[int]) -> None:
        """After seqs became done: wake fetchers, save (removing work-queue messages first),
        then trim an interest stream."""
        if done:
            self._mark_done(found, consumer, done)
        # Also when nothing changed: a repeated ack must not return before the first one's save.
        await consumer.flusher.flush()
        if done:
            await self._maybe_trim(found, done)


def dead_letter_headers(stream: str, consumer: str, entry: LogEntry, *,
                        deliveries: int) -> tuple[tuple[str, str], ...]:
    values = (stream, consumer, str(entry.seq), entry.subject, str(deliveries))
    return entry.headers + tuple(zip(DLQ_HEADERS, values, strict=True))


def _skip_acked_ahead(log: StreamLog, state: DeliveryState) -> None:
    """After acks ahead of the cursor: moves the cursor (and so the floor) over the ones that
    are next in line, so that the floor does not wait for a fetch to pass them."""
    if state.start_seqs or not state.acked_ahead():
        return
    for entry in log.scan(from_seq=state.delivered_seq + 1,
                          filter_subject=state.config.filter_subject, limit=len(state.acked)):
        if not state.skip_acked_ahead(entry.seq):
            return
