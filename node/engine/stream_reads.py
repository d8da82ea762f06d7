"""Reads of one stream: by seq, scans (filtered, by subject), the latest message at a
subject, subject summaries, the seqs a consumer's delivery policy starts from, counts, and the
stored values a primary sends its replicas.

Reads see nothing above `commit_seq` (but `peek_stored` and `stored_values`, for bookkeeping and
replication); the public ones are served by the primary only, under its lease
(`check_readable`); `peek`, `peek_stored`, `subjects_with_prefix`, the delivery-policy helpers
and `stored_values` do not check the role.
"""

from __future__ import annotations

from collections.abc import Iterator

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import storage_pb2
from raftlog.node.engine.log import Answer, LogEntry, NewRun
from raftlog.node.engine.stream_core import StreamCore, to_entry, to_message
from raftlog.v1 import streams_pb2, types_pb2


class StreamReads(StreamCore):
    """Reads of `Stream` (stream.py), none above `commit_seq`."""

    def get_message(self, seq: int) -> types_pb2.Message:
        self.check_readable()
        stored = self._read_stored(seq) if 0 < seq <= self._commit_seq else None
        if stored is None:
            raise RaftlogError(
                Reason.MESSAGE_NOT_FOUND, f"stream {self.name!r} has no message at seq {seq}",
                seq=seq,
            )
        return to_message(self.name, seq, stored)

    def read(self, seq: int) -> LogEntry | None:
        self.check_readable()
        return self.peek(seq)

    def peek(self, seq: int) -> LogEntry | None:
        stored = self._read_stored(seq) if 0 < seq <= self._commit_seq else None
        return None if stored is None else to_entry(seq, stored)

    def peek_stored(self, seq: int) -> LogEntry | None:
        """What is stored at seq, above `commit_seq` too (bookkeeping only, see StreamLog)."""
        stored = self._read_stored(seq) if 0 < seq <= self.record.last_seq else None
        return None if stored is None else to_entry(seq, stored)

    def scan(self, *, from_seq: int, filter_subject: str = "", limit: int) -> Iterator[LogEntry]:
        self.check_readable()
        if limit <= 0:
            return
        if filter_subject and subjects.is_literal(filter_subject):
            produced = 0
            for seq in self._subject_seqs(filter_subject, from_seq=max(from_seq, 1),
                                          to_seq=self._commit_seq):
                entry = self.read(seq)
                if entry is not None:
                    yield entry
                    produced += 1
                    if produced >= limit:
                        return
            return
        decode = storage_pb2.StoredMessage.FromString
        if not filter_subject:  # every message matches: a hot path (a fetch reads each one)
            stop = min(limit, limits.scan_examined_max)
            for examined, (seq, raw) in enumerate(self._committed_items(from_seq), start=1):
                yield to_entry(seq, decode(raw))
                if examined >= stop:
                    return
            return
        produced = 0
        for examined, (seq, raw) in enumerate(self._committed_items(from_seq), start=1):
            stored = decode(raw)
            if subjects.matches(filter_subject, stored.subject):
                yield to_entry(seq, stored)
                produced += 1
                if produced >= limit:
                    return
            if examined >= limits.scan_examined_max:
                return

    def fill_new(self, messages: Answer, *, from_seq: int, limit: int,
                 payload_room: int) -> NewRun:
        """See StreamLog.fill_new. Each message goes from its stored value to the answer's
        message with no LogEntry between (half a fetch's time per message went to that)."""
        self.check_readable()
        seqs: list[int] = []
        taken_bytes, had = 0, len(messages)
        stop = min(limit, limits.scan_examined_max)
        if stop <= 0:
            return NewRun(seqs, taken_bytes, full=False)
        decode, add, stream = storage_pb2.StoredMessage.FromString, messages.add, self.name
        for seq, raw in self._committed_items(from_seq):
            stored = decode(raw)
            payload = stored.payload
            if taken_bytes + len(payload) > payload_room and (had or seqs):
                return NewRun(seqs, taken_bytes, full=True)
            taken_bytes += len(payload)
            message = add()  # the fields as fill_message sets them, in place (a hot path)
            message.seq = seq
            message.subject = stored.subject
            message.ts_ms = stored.ts_ms
            message.payload = payload
            msg_id = stored.msg_id
            if msg_id:
                message.msg_id = msg_id
            message.deliver_count = 1
            message.stream = stream
            headers = stored.headers
            if headers:
                message.headers.extend(headers)
            seqs.append(seq)
            if len(seqs) >= stop:
                break
        return NewRun(seqs, taken_bytes, full=False)

    def scan_subject(self, subject: str, *, from_seq: int, limit: int) -> tuple[
        list[types_pb2.Message], int
    ]:
        """Messages of one literal subject from `from_seq`; returns them and the next seq."""
        self.check_readable()
        found: list[types_pb2.Message] = []
        for seq in self._subject_seqs(subject, from_seq=max(from_seq, 1),
                                      to_seq=self._commit_seq):
            if len(found) >= limit:
                return found, seq
            stored = self._read_stored(seq)
            if stored is not None:
                found.append(to_message(self.name, seq, stored))
        return found, 0

    def latest_at_subject(self, subject: str) -> types_pb2.Message:
        self.check_readable()
        stat = self.subject_stats.get(subject)
        if stat is not None:
            if stat.last_seq <= self._commit_seq:
                seq: int | None = stat.last_seq
            else:
                seq = self._store.last_subject_seq(self.stream_id, subject,
                                                   upper=self._commit_seq + 1)
            stored = self._read_stored(seq) if seq else None
            if seq and stored is not None:
                return to_message(self.name, seq, stored)
        raise RaftlogError(
            Reason.MESSAGE_NOT_FOUND, f"stream {self.name!r} has no message at {subject!r}",
            subject=subject,
        )

    def subjects_with_prefix(self, prefix: str, *, limit: int) -> tuple[
        list[streams_pb2.SubjectSummary], bool
    ]:
        found: list[streams_pb2.SubjectSummary] = []
        for subject, count, last_seq in self._store.subjects(self.stream_id, prefix):
            if len(found) >= limit:
                return found, True
            found.append(streams_pb2.SubjectSummary(subject=subject, messages=count,
                                                    last_seq=last_seq))
        return found, False

    def first_seq_at_or_after_time(self, ts_ms: int) -> int:
        for seq, raw in self._committed_items(self.first_seq):
            if storage_pb2.StoredMessage.FromString(raw).ts_ms >= ts_ms:
                return seq
        return self._commit_seq + 1

    def last_seqs_per_subject(self, filter_subject: str) -> list[int]:
        found = []
        for subject in self.subject_stats:
            if filter_subject and not subjects.matches(filter_subject, subject):
                continue
            seq = self._store.last_subject_seq(self.stream_id, subject,
                                               upper=self._commit_seq + 1)
            if seq is not None:
                found.append(seq)
        return sorted(found)

    def count_matching(self, *, from_seq: int, filter_subject: str) -> int:
        if not filter_subject:
            if from_seq <= self.first_seq:
                return self.record.messages
            below = sum(1 for _ in self._store.message_seqs(
                self.stream_id, lower=self.first_seq, upper=from_seq))
            return max(self.record.messages - below, 0)
        total = 0
        for subject in self.subject_stats:
            if subjects.matches(filter_subject, subject):
                total += sum(1 for _ in self._subject_seqs(
                    subject, from_seq=max(from_seq, 1), to_seq=self._commit_seq))
        return total

    def stored_values(self, *, from_seq: int, to_seq: int, bytes_max: int) -> list[bytes]:
        """Stored bytes of seqs from_seq..to_seq (fewer once bytes_max is reached); a seq
        removed here (work queue, purge) is an empty value, so the replica still moves on."""
        values: list[bytes] = []
        size = 0
        expected = from_seq
        for seq, value in self._store.messages(self.stream_id, lower=from_seq,
                                               upper=to_seq + 1):
            if values and size + len(value) > bytes_max:
                return values
            if seq > expected:
                values.extend([b""] * (seq - expected))
            values.append(value)
            size += len(value)
            expected = seq + 1
        values.extend([b""] * (to_seq + 1 - expected))
        return values
