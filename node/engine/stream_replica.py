"""The replica side of one stream: applying a primary's batch to the local copy (append,
remove, truncate an uncommitted tail, move the head, re-seed), and fencing.

`accept_replicated` first refuses what `check_batch` (replica_batch.py) refuses, then what
depends on the copy (STALE_EPOCH, SEQ_GAP), before changing anything; only then does it write:
a refused request leaves memory and the store exactly as they were.

Deletions are range operations: a drop of the stream's range in the store, or a scan of the
seqs that exist in a range (so the work is bounded by what is stored, never by the width of a
range), and a head that moves far is moved at most `limits.head_removals_max` messages per
request (the primary repeats its head in every request, so the rest follows).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import replication_pb2
from raftlog.node.engine.replica_batch import Checked, check_batch, epoch_of
from raftlog.node.engine.store import StoreBatch
from raftlog.node.engine.stream_core import ROLE_PRIMARY, StreamCore, SubjectStat, stored_size


class StreamReplica(StreamCore):
    """The replica side of `Stream` (stream.py): a primary's batches, fencing."""

    def accept_replicated(self, request: replication_pb2.ReplicateRequest) -> int:
        """Applies a primary's batch (written, not yet durable); returns the last seq held.

        Refuses (RaftlogError, nothing changed) what `check_batch` refuses, an older epoch
        (STALE_EPOCH) and a batch that does not start at or below the next seq (SEQ_GAP,
        metadata last_seq: where the copy would stand after this epoch's truncation).
        A newer epoch first truncates what this node holds from the start of the first epoch
        (in the primary's history of (epoch, start_seq)) after the last epoch this node
        wrote in: those messages came from an older primary and were never committed (G7)."""
        messages = check_batch(request)
        epoch, first_seq = request.epoch, request.first_seq
        record = self.record
        floor = max(record.epoch, record.fenced_epoch)
        if epoch < floor:
            raise RaftlogError(Reason.STALE_EPOCH, f"{self.name!r} is at fence epoch "
                               f"{floor}; refusing epoch {epoch}",
                               replica_epoch=floor, last_seq=record.last_seq)
        if self.role == ROLE_PRIMARY and self.deposed is None and self.replicator is not None:
            raise RaftlogError(Reason.STALE_EPOCH, f"this node is the primary of {self.name!r}",
                               replica_epoch=record.epoch, last_seq=record.last_seq)
        truncate_at = record.last_seq + 1
        if epoch > record.epoch:
            later = [e.start_seq for e in request.history if e.fence_epoch > record.epoch]
            truncate_at = min(min(later, default=truncate_at), truncate_at)
        if not request.reseed and messages and first_seq > truncate_at:
            raise RaftlogError(Reason.SEQ_GAP, f"{self.name!r} holds up to seq "
                               f"{truncate_at - 1}; batch starts at {first_seq}",
                               last_seq=truncate_at - 1, replica_epoch=max(record.epoch, epoch))
        # Every check passed: from here on the request changes the copy.
        history = [(e.fence_epoch, e.start_seq) for e in request.history]
        if epoch > record.epoch:
            self._truncate_from(truncate_at, history=history)
            record.epoch = epoch
        if request.reseed:
            self._reset_to(first_seq, history=history)
        batch = self._store.batch()
        touched: set[str] = set()
        for span in request.removed:
            self._delete_stored_in(batch, max(span.first, record.first_seq),
                                   min(span.last, record.last_seq) + 1, touched)
        skip = max(record.last_seq + 1 - first_seq, 0)
        self._append_replicated(batch, first_seq + skip, messages[skip:], history=history,
                                touched=touched)
        self._write(batch, touched)
        if request.head_seq > record.first_seq:
            self._remove_below(min(request.head_seq, record.last_seq + 1))
        self._advance_head()
        return record.last_seq

    def _append_replicated(self, batch: StoreBatch, first_seq: int, messages: Sequence[Checked],
                           *, history: Sequence[tuple[int, int]], touched: set[str]) -> None:
        """Stores the primary's messages from `first_seq` on, as runs of seqs; an empty value
        was removed on the primary before it was sent and is a hole here."""
        record, stats = self.record, self.subject_stats
        refs: dict[str, tuple[bytes, int]] = {}  # subject: its ref and encoded length
        run_first = first_seq
        run_values: list[bytes] = []
        run_refs: list[bytes] = []
        # The record's counters in locals while the loop runs (a field of the protobuf record
        # costs more to touch than the rest of a message's work); written back at the end.
        last_seq, last_epoch = record.last_seq, record.last_epoch
        count, size = record.messages, record.bytes
        try:
            for seq, (value, stored) in enumerate(messages, start=first_seq):
                if stored is None:
                    if run_values:
                        batch.append(self.stream_id, first_seq=run_first, values=run_values,
                                     subject_refs=run_refs)
                        run_values, run_refs = [], []
                    last_seq = seq
                    last_epoch = epoch_of(seq, history, default=last_epoch)
                    continue
                subject = stored.subject
                known = refs.get(subject)
                if known is None:
                    known = refs[subject] = (self._store.subject_ref(self.stream_id, subject),
                                             len(subject.encode()))
                ref, subject_bytes = known
                if not run_values:
                    run_first = seq
                run_values.append(value)
                run_refs.append(ref)
                stat = stats.get(subject)
                if stat is None:
                    stats[subject] = SubjectStat(1, seq)
                else:
                    stat.count += 1
                    stat.last_seq = seq
                if stored.msg_id:
                    self._remember(batch, stored.msg_id, seq=seq, now_ms=stored.ts_ms)
                touched.add(subject)
                last_seq = seq
                last_epoch = stored.epoch
                if not count:
                    record.first_seq = seq
                count += 1
                size += stored_size(stored, subject_bytes)
        finally:
            record.last_seq, record.last_epoch = last_seq, last_epoch
            record.messages, record.bytes = count, size
        if run_values:
            batch.append(self.stream_id, first_seq=run_first, values=run_values,
                         subject_refs=run_refs)

    def _delete_stored_in(self, batch: StoreBatch, lower: int, upper: int, touched: set[str],
                          *, limit: int | None = None) -> int:
        """Deletes the stored messages with seqs in [lower, upper) (at most `limit`); the work
        is bounded by what exists there, not by the width of the range."""
        if lower >= upper:
            return 0
        found = list(itertools.islice(
            self._store.message_seqs(self.stream_id, lower=lower, upper=upper), limit))
        for seq in found:
            self._delete_seq(batch, seq, touched)
        return len(found)

    def _truncate_from(self, seq: int, *, history: Sequence[tuple[int, int]]) -> None:
        """Removes every message at or above `seq` (an uncommitted tail of an older epoch);
        what stays is the prefix the new lineage (`history`) shares."""
        if seq > self.record.last_seq:
            return
        self.record.last_epoch = epoch_of(seq - 1, history, default=self.record.last_epoch)
        batch = self._store.batch()
        touched: set[str] = set()
        self._delete_stored_in(batch, seq, self.record.last_seq + 1, touched)
        for msg_id, (dedupe_seq, _) in list(self.dedupe.items()):
            if dedupe_seq >= seq:
                del self.dedupe[msg_id]
                batch.delete_dedupe(self.stream_id, msg_id)
        self.record.last_seq = seq - 1
        self._commit_seq = min(self._commit_seq, seq - 1)
        self.durable_seq = min(self.durable_seq, seq - 1)
        self._write(batch, touched)
        self._advance_head()

    def _remove_below(self, seq: int) -> None:
        """Removes messages below `seq`, at most limits.head_removals_max of them."""
        batch = self._store.batch()
        touched: set[str] = set()
        self._delete_stored_in(batch, self.record.first_seq, seq, touched,
                               limit=limits.head_removals_max)
        self._write(batch, touched)

    def _reset_to(self, first_seq: int, *, history: Sequence[tuple[int, int]]) -> None:
        """Drops the whole local copy; the next message stored will be `first_seq`."""
        self.record.last_epoch = epoch_of(first_seq - 1, history, default=0)
        batch = self._store.batch()
        batch.drop_messages(self.stream_id)
        batch.drop_dedupe(self.stream_id)
        self.subject_stats.clear()
        self.dedupe.clear()
        self.record.messages = 0
        self.record.bytes = 0
        self.record.first_seq = first_seq
        self.record.last_seq = first_seq - 1
        self._commit_seq = min(self._commit_seq, first_seq - 1)
        self.durable_seq = first_seq - 1
        self._write(batch, set())

    # ----------------------------------------------------------------- fencing

    async def fence(self, epoch: int) -> None:
        """Refuses batches below `epoch` from now on (durable on return)."""
        if self.fence_unsynced(epoch):
            await self._store.durable()

    def fence_unsynced(self, epoch: int) -> bool:
        """Refuses batches below `epoch` from now on; written, durable with the next group
        commit. True when the fence moved."""
        if epoch <= self.record.fenced_epoch:
            return False
        self.record.fenced_epoch = epoch
        self._write(self._store.batch(), set())
        return True

    def replica_state(self) -> tuple[int, int, int, int]:
        """(epoch, first_seq, last_seq, commit_seq) of the local copy."""
        return self.record.epoch, self.record.first_seq, self.record.last_seq, self._commit_seq
