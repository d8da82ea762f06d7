"""Durable pull consumers of a node: `ConsumerManager`, the public face of the consumer
engine. This module owns the registry (streams attached through the engine hooks, consumers
restored from the store, adopted, detached) and the consumer lifecycle (create, delete, info,
list, the checks of new stream subjects); `start_state` places a new consumer's cursor.

One `ConsumerManager` per node, used only on the event loop thread (no threads, no blocking
calls; one asyncio.Lock per stream serialises consumer create and delete). It is built in
layers, each a subclass of the one before, each in its own module:
- `serving.py`    `ManagerBase`: the served streams and consumers, lookup, wake-ups, closing,
                  coalesced saves (`Flusher`), `ConsumerInfo`; `Settled` and `DLQ_HEADERS`.
- `retention.py`  `RetentionManager`: interest retention trims.
- `settlement.py` `SettlementManager`: Ack, Term, Nak, InProgress, dead letters.
- `delivery.py`   `DeliveryManager`: fetch, redelivery, waiting for work.
The rules that change one consumer's state live in `state.py`, config validation in
`config.py`, persistence behind the `ConsumerStore` protocol (`store.py`): no layer knows how
records are kept.

Ordering rules:
- Ack and Term return only after a `store.save` that includes them has completed, and on a
  work-queue stream only after the messages were removed. Removal comes first, then the save:
  a crash between them leaves a pending seq whose message is gone, which is skipped.
- Saves of one consumer are coalesced (`Flusher`): at most `consumer_saves_inflight_max` in
  flight at a time, and every caller waits for a save whose snapshot was taken after its
  change.
- Fetch, Nak and InProgress do not save: deliveries lost in a crash are redelivered
  (at-least-once). Dead-lettering does save, like a Term.
- A closed consumer (deleted, its stream detached, or held out of service while an audit's
  repair replaces its committed state) starts no new save and fails every caller still waiting
  for one: a save racing a delete cannot bring the record back, an ack whose save raced a
  detach is never reported durable, and no save of the old state lands after a repair.
- Nothing above the log's commit_seq is ever handed out (G4).
- Ack, Term, Nak and InProgress answer per seq (`Settled`): the valid seqs of a call take
  effect (and Ack and Term are durable on return) even when others are refused; which seqs may
  be settled is decided in `state.py`.

- Interest retention removes a message once every consumer whose filter matches it is done
  with it, and at once when no consumer wants it (the rules: retention.py).
"""

from __future__ import annotations

import builtins
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from raftlog.base import limits
from raftlog.base import subjects as subject_rules
from raftlog.base.errors import InvariantViolation, RaftlogError, Reason
from raftlog.internal import storage_pb2
from raftlog.node.consumers.config import check_work_queue_filter, validate_config
from raftlog.node.consumers.delivery import DeliveryManager
from raftlog.node.consumers.serving import (
    DLQ_HEADERS,
    ServedConsumer,
    ServedStream,
    Settled,
    present_in,
)
from raftlog.node.consumers.state import DeliveryState
from raftlog.node.engine.log import StreamLog
from raftlog.v1 import consumers_pb2, types_pb2

__all__ = ["DLQ_HEADERS", "ConsumerManager", "Settled", "start_state"]

T = TypeVar("T")

_POLICY = consumers_pb2.DeliverPolicy


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


def _resetting(stream: str, name: str) -> RaftlogError:
    """What callers of a consumer whose committed state an operator replaces are told."""
    return RaftlogError(Reason.CATCHING_UP, f"consumer {name!r} of {stream!r} is being reset "
                        "from the cluster's metadata; retry", stream=stream, consumer=name,
                        retry_after_ms=limits.catching_up_retry_after_ms)


class ConsumerManager(DeliveryManager):
    """Every consumer of every stream attached to this node."""

    # ----------------------------------------------------------------- streams (engine hooks)

    def attach_stream(self, log: StreamLog, *, retention: int, subjects: Sequence[str]) -> None:
        """Starts serving a stream's consumers from their saved records."""
        if log.name in self._streams:
            raise InvariantViolation(f"stream {log.name} attached twice")
        stream = ServedStream(log=log, retention=retention, subjects=tuple(subjects))
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

    def _restore(self, found: ServedStream, record: storage_pb2.ConsumerRecord) -> None:
        log = found.log
        state = DeliveryState.from_record(record, now_s=self._clock.monotonic_s())
        state.forget_removed(first_seq=log.first_seq,
                             exists=present_in(log, state.config.filter_subject))
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
                                          exists=present_in(found.log))
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

    async def replace_committed(self, stream: str, name: str,
                                change: Callable[[], Awaitable[T]]) -> T:
        """Runs `change`, which replaces the consumer's committed state in the store (an
        audit's repair), with the consumer out of service, then serves it again from what the
        store holds, whether `change` succeeded or not. Out of service: it stays listed but
        closed (every call on it, and every caller waiting on it, fails with CATCHING_UP:
        retry), no save starts, and the save in flight is waited for, so no save of the old
        state lands after the change. A consumer the store holds and this manager lacks is
        adopted first; CONSUMER_NOT_FOUND when the store has none."""
        found = self._stream(stream)
        async with found.admin:
            if not self.adopt(stream, name):
                raise self._not_found(stream, name)
            found, consumer = self._lookup(stream, name)
            self._close(consumer, _resetting(stream, name))
            await consumer.flusher.idle()
            try:
                return await change()
            finally:
                if found.consumers.get(name) is consumer:
                    del found.consumers[name]
                if self._streams.get(stream) is found:  # not detached meanwhile
                    self.adopt(stream, name)

    def refresh(self, stream: str, name: str) -> bool:
        """Serves the consumer again from what the store holds now: its committed state was
        replaced (a ConsumerStateSet applied) other than through `replace_committed`, e.g. by
        a set whose proposer gave up waiting. Its callers get CATCHING_UP (retry). False when
        this manager does not serve it, or holds it out of service (`replace_committed`
        serves it again itself)."""
        found = self._streams.get(stream)
        consumer = found.consumers.get(name) if found is not None else None
        if found is None or consumer is None or consumer.closed is not None:
            return False
        del found.consumers[name]
        self._close(consumer, _resetting(stream, name))
        return self.adopt(stream, name)

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

    async def _recreate(self, found: ServedStream, existing: ServedConsumer,
                        config: consumers_pb2.ConsumerConfig) -> consumers_pb2.ConsumerInfo:
        if existing.state.config != config:
            raise RaftlogError(
                Reason.CONSUMER_EXISTS,
                f"consumer {config.name!r} exists on stream {found.log.name!r} with a "
                "different config", stream=found.log.name, consumer=config.name)
        await existing.flusher.flush()  # its creation may still be on its way to the store
        return self._info(found, existing)

    def _check_room(self, found: ServedStream, config: consumers_pb2.ConsumerConfig) -> None:
        if len(found.consumers) >= limits.consumers_per_stream_max:
            raise RaftlogError(
                Reason.TOO_MANY_CONSUMERS,
                f"stream {found.log.name!r} has {limits.consumers_per_stream_max} consumers, "
                "the most it may have", limit=limits.consumers_per_stream_max)
        if found.retention == types_pb2.RETENTION_POLICY_WORK_QUEUE:
            check_work_queue_filter(config.name, config.filter_subject,
                                    others=(c.state.config for c in found.consumers.values()))

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
