"""An audit's repair of one stream's local copy (`raftlog audit repair`, the peer `Repair` call):
remove a tail, store the authoritative bytes at seqs that are missing or differ, or drop the
copy so the primary re-sends it.

Only a copy this node does not serve as primary is repaired (COPY_IS_PRIMARY otherwise): the
primary's copy is what replication makes the others equal to, and it changes under its writers.
A plan names where it saw the copy (last seq, epoch); a copy that moved since refuses
(COPY_CHANGED) and the operator audits again. Every change is checked before the first write,
so a refused repair changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import storage_pb2
from raftlog.node.engine.stream_core import ROLE_PRIMARY, SubjectStat, stored_size
from raftlog.node.engine.stream_replica import StreamReplica


class StreamRepair(StreamReplica):
    """The repair side of `Stream` (stream.py), on the replica side's primitives."""

    def check_repairable(self, *, expect_last_seq: int | None, expect_epoch: int | None) -> None:
        if self.role == ROLE_PRIMARY and self.deposed is None:
            raise RaftlogError(Reason.COPY_IS_PRIMARY, f"this node serves {self.name!r} as its "
                               "primary; move the primary away before repairing this copy",
                               stream=self.name)
        record = self.record
        if expect_last_seq is not None and expect_last_seq != record.last_seq:
            raise RaftlogError(Reason.COPY_CHANGED, f"the copy of {self.name!r} ends at seq "
                               f"{record.last_seq}, the plan saw {expect_last_seq}; audit again",
                               stream=self.name, last_seq=record.last_seq)
        if expect_epoch is not None and expect_epoch != record.epoch:
            raise RaftlogError(Reason.COPY_CHANGED, f"the copy of {self.name!r} is at epoch "
                               f"{record.epoch}, the plan saw {expect_epoch}; audit again",
                               stream=self.name, epoch=record.epoch)

    def repair_truncate(self, after_seq: int) -> int:
        """Removes every message above `after_seq`; returns how many were removed."""
        record = self.record
        if after_seq >= record.last_seq:
            return 0
        before = record.messages
        self._truncate_from(after_seq + 1, history=())
        kept = self._read_stored(record.last_seq) if record.last_seq >= record.first_seq else None
        record.last_epoch = kept.epoch if kept is not None else record.last_epoch
        self._write(self._store.batch(), set())
        return before - record.messages

    def repair_put(self, messages: Sequence[tuple[int, bytes]]) -> int:
        """Stores each (seq, StoredMessage bytes) where the copy lacks it or holds other bytes:
        holes, differing records, and records below the head (a copy whose head moved past
        records the others keep gets them back; the head moves down). No seq may lie past the
        copy's last seq: replication extends a copy, a repair only mends it. Returns how many
        changed."""
        record = self.record
        decoded: list[tuple[int, bytes, storage_pb2.StoredMessage]] = []
        for seq, value in messages:
            if not 1 <= seq <= record.last_seq:
                raise RaftlogError(Reason.INVALID_ARGUMENT, f"seq {seq} is past the end "
                                   f"({record.last_seq}) of the copy of {self.name!r}; "
                                   "replication extends a copy, a repair only mends it",
                                   stream=self.name)
            try:
                stored = storage_pb2.StoredMessage.FromString(value)
            except Exception:
                raise RaftlogError(Reason.CORRUPT_RECORD, f"seq {seq}: not a stored message",
                                   stream=self.name) from None
            if not value:
                raise RaftlogError(Reason.INVALID_ARGUMENT, f"seq {seq}: empty message",
                                   stream=self.name)
            decoded.append((seq, value, stored))
        batch = self._store.batch()
        touched: set[str] = set()
        changed = 0
        for seq, value, stored in decoded:
            if self._store.get_message(self.stream_id, seq) == value:
                continue
            self._delete_seq(batch, seq, touched)
            subject = stored.subject
            batch.append(self.stream_id, first_seq=seq, values=[value],
                         subject_refs=[self._store.subject_ref(self.stream_id, subject)])
            stat = self.subject_stats.get(subject)
            if stat is None:
                self.subject_stats[subject] = SubjectStat(1, seq)
            else:
                stat.count += 1
                stat.last_seq = max(stat.last_seq, seq)
            if stored.msg_id and stored.msg_id not in self.dedupe:
                self._remember(batch, stored.msg_id, seq=seq, now_ms=stored.ts_ms)
            touched.add(subject)
            record.messages += 1
            record.bytes += stored_size(stored)
            if seq == record.last_seq:
                record.last_epoch = stored.epoch
            record.first_seq = min(record.first_seq, seq)
            changed += 1
        self._write(batch, touched)
        return changed

    def repair_reset(self, first_seq: int) -> int:
        """Drops the copy; the next message stored is `first_seq`. Returns the messages dropped."""
        if first_seq < 1:
            raise RaftlogError(Reason.INVALID_ARGUMENT, "a copy restarts at seq 1 or later",
                               stream=self.name)
        dropped = self.record.messages
        self._reset_to(first_seq, history=())
        return dropped
