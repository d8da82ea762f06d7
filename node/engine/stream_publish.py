"""Publishing to one stream: drafts, the checks on each (subject, size, headers, msg_id
dedupe, expected seqs), seq assignment into one unsynced store batch, and the wait for the
commit (durable here and, when replicated, on a majority of the stream's replicas).

A publish assigns seqs and writes at once, then awaits the group commit; it is answered only
by the primacy that staged it. Retention by count, bytes and per-subject count is applied in
the publishing batch (`stream_retention`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import storage_pb2
from raftlog.node.engine.store import StoreBatch
from raftlog.node.engine.stream_core import SubjectStat
from raftlog.node.engine.stream_retention import StreamRetention
from raftlog.v1 import streams_pb2, types_pb2

# One message to publish, as the API hands it over: a batch entry or a request (their field
# numbers agree, and a stored message is the draft's own bytes plus ts_ms and epoch).
Draft = streams_pb2.PublishEntry | streams_pb2.PublishRequest


def draft(subject: str, payload: bytes = b"", *, headers: Sequence[tuple[str, str]] = (),
          msg_id: str = "", expected_last_seq: int | None = None,
          expected_last_subject_seq: int | None = None) -> Draft:
    entry: Draft = streams_pb2.PublishEntry(
        subject=subject, payload=payload, msg_id=msg_id,
        headers=[types_pb2.Header(key=k, value=v) for k, v in headers],
    )
    if expected_last_seq is not None:
        entry.expected_last_seq = expected_last_seq
    if expected_last_subject_seq is not None:
        entry.expected_last_subject_seq = expected_last_subject_seq
    return entry


# Not frozen: a frozen dataclass is built in three times the time (every stored message makes
# one); hashable all the same, and nothing changes one once made.
@dataclass(slots=True, unsafe_hash=True)
class Appended:
    seq: int
    duplicate: bool = False
    # The stream's fencing epoch here when it was acknowledged (what it says of the message,
    # not part of it: outcomes compare by seq and duplicate).
    epoch: int = field(default=0, compare=False)


class StreamPublishing(StreamRetention):
    """Publishing: the checks, seq assignment and commit wait of `Stream` (stream.py)."""

    def _subject_key(self, subject: str) -> tuple[bytes, int]:
        """The subject's ref in the store (`MessageStore.subject_ref`) and byte length, once the
        subject is known to be acceptable to this stream."""
        known = self._known_subjects.get(subject)
        if known is not None:
            return known
        subjects.validate_subject(subject)
        if not subjects.matches_any(list(self.config.subjects), subject):
            raise RaftlogError(
                Reason.SUBJECT_NOT_IN_STREAM,
                f"subject {subject!r} is not accepted by stream {self.name!r}",
                subject=subject,
            )
        if len(self._known_subjects) >= limits.known_subjects_max:
            self._known_subjects.clear()
        known = (self._store.subject_ref(self.stream_id, subject), len(subject.encode()))
        self._known_subjects[subject] = known
        return known

    @staticmethod
    def _headers_size(headers: Sequence[types_pb2.Header]) -> int:
        if len(headers) > limits.headers_count_max:
            raise RaftlogError(
                Reason.MESSAGE_TOO_LARGE, f"more than {limits.headers_count_max} headers",
                limit=limits.headers_count_max,
            )
        size = 0
        for header in headers:
            header_size = len(header.key.encode()) + len(header.value.encode())
            if not header.key:
                raise RaftlogError(Reason.INVALID_ARGUMENT, "a header has an empty key")
            if header_size > limits.header_bytes_max:
                raise RaftlogError(
                    Reason.MESSAGE_TOO_LARGE,
                    f"header {header.key[:64]!r} is longer than {limits.header_bytes_max} bytes",
                    limit=limits.header_bytes_max,
                )
            size += header_size
        return size

    def _check_size(self, entry: Draft, size: int, size_max: int) -> None:
        if size > size_max:
            raise RaftlogError(
                Reason.MESSAGE_TOO_LARGE,
                f"message of {size} bytes exceeds the limit of {size_max}",
                size=size, limit=size_max,
            )
        if len(entry.msg_id) > limits.msg_id_bytes_max:
            raise RaftlogError(
                Reason.INVALID_ARGUMENT, f"msg_id is longer than {limits.msg_id_bytes_max} bytes"
            )

    def _check_expectations(self, entry: Draft) -> None:
        if entry.HasField("expected_last_seq") and entry.expected_last_seq != self.last_seq:
            raise RaftlogError(
                Reason.WRONG_LAST_SEQ,
                f"expected last seq {entry.expected_last_seq}, stream is at {self.last_seq}",
                last_seq=self.last_seq,
            )
        if entry.HasField("expected_last_subject_seq"):
            stat = self.subject_stats.get(entry.subject)
            current = stat.last_seq if stat else 0
            if current != entry.expected_last_subject_seq:
                raise RaftlogError(
                    Reason.WRONG_LAST_SUBJECT_SEQ,
                    f"expected last seq {entry.expected_last_subject_seq} at "
                    f"{entry.subject!r}, it is {current}",
                    last_subject_seq=current,
                )

    def _check_room(self, size: int) -> None:
        """DISCARD_NEW: STREAM_FULL for a message that would take the stream past max_msgs or
        max_bytes (nothing of the stream is removed for it)."""
        config, record = self.config, self.record
        if config.max_msgs and record.messages + 1 > config.max_msgs:
            what = f"{config.max_msgs} messages"
        elif config.max_bytes and record.bytes + size > config.max_bytes:
            what = f"{config.max_bytes} bytes"
        else:
            return
        raise RaftlogError(
            Reason.STREAM_FULL, f"stream {self.name!r} holds {what}, its limit, and refuses "
            "new messages (discard new) until some expire, are acknowledged or purged",
            stream=self.name, retry_after_ms=limits.stream_full_retry_after_ms)

    def _duplicate_of(self, msg_id: str, now_ms: int) -> int | None:
        found = self.dedupe.get(msg_id)
        if found is None:
            return None
        seq, ts_ms = found
        return seq if ts_ms >= now_ms - self.dedupe_window_ms else None

    def _expire_dedupe(self, batch: StoreBatch, now_ms: int) -> None:
        cutoff = now_ms - self.dedupe_window_ms
        while self.dedupe:
            msg_id, (_, ts_ms) = next(iter(self.dedupe.items()))
            if ts_ms >= cutoff and len(self.dedupe) <= limits.dedupe_entries_max:
                return
            self.dedupe.popitem(last=False)
            batch.delete_dedupe(self.stream_id, msg_id)

    def publish_staged(self, entries: Sequence[Draft]) -> tuple[
        list[Appended | RaftlogError], int
    ]:
        """Checks, assigns seqs and writes (unsynced) a batch; returns per-entry results and
        the seq that must be committed before any of them is acknowledged (0: none).

        The hot path of the node: per message one subject lookup, one size check, and the
        entry's own bytes plus a shared tail (ts_ms, epoch) as the stored value; the messages
        go to the store as runs (`StoreBatch.append`), one call per run."""
        if self.closed:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"stream {self.name!r} was deleted")
        self._check_writable()
        now_ms = self._clock.wall_ms()
        tail = storage_pb2.StoredMessage(ts_ms=now_ms, epoch=self.record.epoch) \
            .SerializeToString()
        size_max = self.max_message_bytes
        check_limits = self._has_limits()
        refuse_full = check_limits and self.config.discard == types_pb2.DISCARD_NEW
        record, stats, known_subjects = self.record, self.subject_stats, self._known_subjects
        results: list[Appended | RaftlogError] = []
        wait_seq = 0
        batch = self._store.batch()
        touched: set[str] = set()
        # The run of messages not yet handed to the batch: seqs run_first.. in order.
        run_first = record.last_seq + 1
        values: list[bytes] = []
        refs: list[bytes] = []
        # The record's counters in locals while the loop runs (a field of the protobuf record
        # costs more to touch than the rest of a message's work): written back before every
        # call that reads the record, and at the end.
        last_seq, count, size_sum = record.last_seq, record.messages, record.bytes
        epoch, last_seq_before = record.epoch, last_seq
        try:
            for entry in entries:
                subject, msg_id = entry.subject, entry.msg_id
                expects = entry.HasField("expected_last_seq") or \
                    entry.HasField("expected_last_subject_seq")
                try:
                    known = known_subjects.get(subject)  # the usual case, without the call
                    ref, size = known if known is not None else self._subject_key(subject)
                    headers = entry.headers
                    size += len(entry.payload) + (self._headers_size(headers) if headers else 0)
                    if size > size_max or msg_id:
                        self._check_size(entry, size, size_max)
                    if msg_id:
                        duplicate = self._duplicate_of(msg_id, now_ms)
                        if duplicate is not None:
                            results.append(Appended(duplicate, duplicate=True, epoch=epoch))
                            wait_seq = max(wait_seq, duplicate)
                            continue
                    if expects:
                        record.last_seq = last_seq
                        self._check_expectations(entry)
                    if refuse_full:
                        record.messages, record.bytes = count, size_sum
                        self._check_room(size)
                except RaftlogError as err:
                    results.append(err)
                    continue
                seq = last_seq + 1
                if expects or isinstance(entry, streams_pb2.PublishRequest):
                    entry = self._stored_form(entry)
                values.append(entry.SerializeToString() + tail)
                refs.append(ref)
                stat = stats.get(subject)
                if stat is None:
                    stats[subject] = SubjectStat(1, seq)
                else:
                    stat.count += 1
                    stat.last_seq = seq
                if msg_id:
                    self._remember(batch, msg_id, seq=seq, now_ms=now_ms)
                last_seq = seq
                count += 1
                size_sum += size
                if count == 1:
                    record.first_seq = seq
                touched.add(subject)
                results.append(Appended(seq, epoch=epoch))
                wait_seq = seq
                if check_limits:
                    record.last_seq, record.messages, record.bytes = last_seq, count, size_sum
                    if self._over_limits(subject):
                        batch.append(self.stream_id, first_seq=run_first, values=values,
                                     subject_refs=refs)
                        run_first, values, refs = seq + 1, [], []
                        batch = self._write(batch, touched)
                        touched = set()
                        self._enforce_limits(subject)
                        last_seq, count, size_sum = (record.last_seq, record.messages,
                                                     record.bytes)
        finally:
            record.last_seq, record.messages, record.bytes = last_seq, count, size_sum
            if last_seq != last_seq_before:
                record.last_epoch = epoch
        if values:
            batch.append(self.stream_id, first_seq=run_first, values=values, subject_refs=refs)
        if self.dedupe:
            self._expire_dedupe(batch, now_ms)
        self._write(batch, touched)
        return results, wait_seq

    @staticmethod
    def _stored_form(entry: Draft) -> streams_pb2.PublishEntry:
        """The entry without the fields that are not stored (expectations, stream)."""
        stripped = streams_pb2.PublishEntry(subject=entry.subject, payload=entry.payload,
                                            headers=entry.headers, msg_id=entry.msg_id)
        return stripped

    async def commit(self, wait_seq: int) -> None:
        """Waits until `wait_seq` is committed: durable here and, when replicated, on a
        majority of the stream's replicas. NO_QUORUM after limits.publish_commit_wait_s_max;
        NOT_PRIMARY when this node is deposed meanwhile."""
        if wait_seq <= self._commit_seq:
            return
        primacy = self.primacy
        target = self.record.last_seq
        if self.replicator is not None:
            self.replicator.kick()
        await self._store.durable()
        self.durable_seq = max(self.durable_seq, target)
        self._check_primacy(primacy)
        if self.replicator is None:
            self._advance_commit(target)
            return
        self.replicator.on_local_durable()
        deadline = asyncio.get_running_loop().time() + limits.publish_commit_wait_s_max
        while self._commit_seq < wait_seq:
            self._check_primacy(primacy)
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0 or self.closed:
                raise RaftlogError(Reason.NO_QUORUM, f"seq {wait_seq} of {self.name!r} is not "
                                   "on a majority of its replicas yet; retry with the same "
                                   "msg_id", stream=self.name, seq=wait_seq)
            await self.wait_for_commit(above_seq=self._commit_seq,
                                       timeout_s=min(remaining, limits.publish_commit_check_s))
            if self._commit_seq < wait_seq and self.replicator is not None:
                self.replicator.check_writable()  # cut off meanwhile: NO_QUORUM at once

    async def publish(self, drafts: Sequence[Draft]) -> list[Appended | RaftlogError]:
        results, wait_seq = self.publish_staged(drafts)
        await self.commit(wait_seq)
        return results

    async def publish_internal(
        self, *, subject: str, payload: bytes, headers: tuple[tuple[str, str], ...]
    ) -> int:
        (result,) = await self.publish([draft(subject, payload, headers=headers)])
        if isinstance(result, RaftlogError):
            raise result
        return result.seq
