"""One stream on one node: its messages in RocksDB, its counters in memory, and the
`StreamLog` view consumers read through.

Everything here runs on the event loop thread. A publish assigns seqs and writes an unsynced
WriteBatch at once, then awaits the group commit; `commit_seq` (the high-water mark, G4) moves
only after the fsync that covers the write. Readers never see a seq above `commit_seq`.
Retention by count, bytes and per-subject count is applied in the publishing batch; age by the
engine's sweep.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from rocksdict import WriteBatch

from raftlog.base import limits, subjects
from raftlog.base.clock import Clock
from raftlog.base.errors import InvariantViolation, RaftlogError, Reason
from raftlog.internal import replication_pb2, storage_pb2
from raftlog.node.engine import keys
from raftlog.node.engine.log import LogEntry
from raftlog.node.engine.storage import (
    CF_DEDUPE,
    CF_MESSAGES,
    CF_STREAM_STATE,
    CF_SUBJECTS,
    GroupCommitter,
    Storage,
)
from raftlog.node.replication import replica as stream_replica
from raftlog.node.replication.replica import ROLE_PRIMARY, ROLE_REPLICA
from raftlog.v1 import streams_pb2, types_pb2

__all__ = ["ROLE_PRIMARY", "ROLE_REPLICA", "Appended", "Draft", "Stream"]

known_subjects_max = 10_000  # validated subjects remembered per stream
scan_examined_max = 100_000  # messages one filtered scan looks at before it stops


commit_wait_s_max = 10.0  # a publish waits this long for a quorum before UNAVAILABLE
commit_check_s = 0.1  # a waiting publish checks this often that a majority still answers
removed_log_max = 100_000  # removals kept for replicas before they must be re-seeded


class Replicator(Protocol):
    """What a primary's stream asks of its replication (node/replication/primary.py)."""

    def kick(self) -> None: ...
    def on_local_durable(self) -> None: ...
    def check_lease(self) -> None: ...
    def check_writable(self) -> None: ...


@dataclass(slots=True)
class SubjectStat:
    count: int
    last_seq: int


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


@dataclass(frozen=True, slots=True)
class Appended:
    seq: int
    duplicate: bool = False


def stored_size(stored: storage_pb2.StoredMessage | streams_pb2.PublishEntry) -> int:
    """Bytes a message counts for in limits: subject, payload and headers."""
    size = len(stored.payload) + len(stored.subject.encode())
    for header in stored.headers:
        size += len(header.key.encode()) + len(header.value.encode())
    return size


def to_message(stream: str, seq: int, stored: storage_pb2.StoredMessage) -> types_pb2.Message:
    return types_pb2.Message(
        stream=stream,
        seq=seq,
        subject=stored.subject,
        ts_ms=stored.ts_ms,
        headers=stored.headers,
        payload=stored.payload,
        msg_id=stored.msg_id,
    )


def to_entry(seq: int, stored: storage_pb2.StoredMessage) -> LogEntry:
    return LogEntry(
        seq=seq,
        subject=stored.subject,
        ts_ms=stored.ts_ms,
        payload=stored.payload,
        headers=tuple((h.key, h.value) for h in stored.headers),
        msg_id=stored.msg_id,
    )


class Stream:
    def __init__(
        self,
        *,
        storage: Storage,
        committer: GroupCommitter,
        clock: Clock,
        record: storage_pb2.StreamRecord,
    ) -> None:
        self._storage = storage
        self._committer = committer
        self._clock = clock
        self.record = record
        self.stream_id = record.stream_id
        self.subject_stats: dict[str, SubjectStat] = {}
        self.dedupe: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._commit_seq = record.last_seq
        self.durable_seq = record.last_seq  # highest seq fsynced here
        self._waiters: list[asyncio.Future[None]] = []
        # Replication (cluster mode): the primary's replicator decides commit_seq; a replica
        # only appends what its primary sends. None = this node alone decides (R1, standalone).
        self.replicator: Replicator | None = None
        self.role = ROLE_PRIMARY
        self.deposed: RaftlogError | None = None  # set when this node stopped being primary
        self.primacy = 0  # changes with every role change; a commit wait spans one value
        self.removed_log: list[int] = []  # seqs removed here, for the replicator to pass on
        self.replicated_by = ""  # as a replica: the node whose batches it took last
        self._known_subjects: dict[str, tuple[bytes, int]] = {}
        self.closed = False

    # ----------------------------------------------------------------- loading

    def load(self) -> None:
        """Reads subject counters and the dedupe window back from RocksDB."""
        prefix = keys.summary_prefix(self.stream_id)
        for key, value in self._storage.scan(
            CF_SUBJECTS, lower=prefix, upper=keys.prefix_end(prefix)
        ):
            count, last_seq = keys.read_pair(value)
            self.subject_stats[keys.summary_subject(key)] = SubjectStat(count, last_seq)
        cutoff = self._clock.wall_ms() - self.dedupe_window_ms
        entries = []
        start = keys.stream_prefix(self.stream_id)
        for key, value in self._storage.scan(
            CF_DEDUPE, lower=start, upper=keys.stream_end(self.stream_id)
        ):
            seq, ts_ms = keys.read_pair(value)
            if ts_ms >= cutoff:
                entries.append((ts_ms, seq, key[8:].decode()))
        for ts_ms, seq, msg_id in sorted(entries):
            self.dedupe[msg_id] = (seq, ts_ms)
        self._advance_head()

    # ----------------------------------------------------------------- properties

    @property
    def name(self) -> str:
        return self.record.config.name

    @property
    def config(self) -> types_pb2.StreamConfig:
        return self.record.config

    @property
    def first_seq(self) -> int:
        return self.record.first_seq

    @property
    def last_seq(self) -> int:
        return self.record.last_seq

    @property
    def commit_seq(self) -> int:
        return self._commit_seq

    @property
    def dedupe_window_ms(self) -> int:
        return self.config.dedupe_window_ms or limits.dedupe_window_ms_default

    @property
    def max_message_bytes(self) -> int:
        configured = self.config.max_msg_bytes
        return min(configured, limits.message_bytes_max) if configured else \
            limits.message_bytes_max

    def state(self, *, consumers: int) -> types_pb2.StreamState:
        first = self._read_stored(self.first_seq) if self.record.messages else None
        last = self._read_stored(self._commit_seq) if self.record.messages else None
        return types_pb2.StreamState(
            first_seq=self.first_seq,
            last_seq=self._commit_seq,
            messages=self.record.messages,
            bytes=self.record.bytes,
            first_ts_ms=first.ts_ms if first else 0,
            last_ts_ms=last.ts_ms if last else 0,
            num_subjects=len(self.subject_stats),
            consumers=consumers,
            commit_seq=self._commit_seq,
        )

    # ----------------------------------------------------------------- reads

    def _read_stored(self, seq: int) -> storage_pb2.StoredMessage | None:
        raw = self._storage.get(CF_MESSAGES, keys.message_key(self.stream_id, seq))
        if raw is None:
            return None
        return storage_pb2.StoredMessage.FromString(raw)

    def check_readable(self) -> None:
        """Reads are served by the primary, and by it only under its lease."""
        if self.deposed is not None:
            raise self.deposed
        if self.role != ROLE_PRIMARY:
            raise RaftlogError(Reason.NOT_PRIMARY, f"this node holds a replica of "
                               f"{self.name!r}, not its primary", stream=self.name)
        if self.replicator is not None:
            self.replicator.check_lease()

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

    def _committed_items(self, from_seq: int) -> Iterator[tuple[int, bytes]]:
        lower = keys.message_key(self.stream_id, max(from_seq, self.first_seq))
        upper = keys.message_key(self.stream_id, self._commit_seq + 1)
        for key, value in self._storage.scan(CF_MESSAGES, lower=lower, upper=upper):
            yield keys.message_seq(key), value

    def _subject_seqs(self, subject: str, *, from_seq: int, to_seq: int) -> Iterator[int]:
        """Seqs of one literal subject in [from_seq, to_seq], ascending."""
        lower = keys.index_key(self.stream_id, subject, from_seq)
        upper = keys.index_key(self.stream_id, subject, to_seq + 1)
        for key in self._storage.scan_keys(CF_SUBJECTS, lower=lower, upper=upper):
            yield keys.index_seq(key)

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
        produced = 0
        for examined, (seq, raw) in enumerate(self._committed_items(from_seq), start=1):
            stored = storage_pb2.StoredMessage.FromString(raw)
            if not filter_subject or subjects.matches(filter_subject, stored.subject):
                yield to_entry(seq, stored)
                produced += 1
                if produced >= limit:
                    return
            if examined >= scan_examined_max:
                return

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
                lower = keys.index_prefix(self.stream_id, subject)
                key = self._storage.last_key(
                    CF_SUBJECTS, lower=lower,
                    upper=keys.index_key(self.stream_id, subject, self._commit_seq + 1),
                )
                seq = keys.index_seq(key) if key else None
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
        start = keys.summary_prefix(self.stream_id, prefix)
        found: list[streams_pb2.SubjectSummary] = []
        for key, value in self._storage.scan(
            CF_SUBJECTS, lower=start, upper=keys.prefix_end(start)
        ):
            if len(found) >= limit:
                return found, True
            count, last_seq = keys.read_pair(value)
            found.append(streams_pb2.SubjectSummary(
                subject=keys.summary_subject(key), messages=count, last_seq=last_seq
            ))
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
            key = self._storage.last_key(
                CF_SUBJECTS, lower=keys.index_prefix(self.stream_id, subject),
                upper=keys.index_key(self.stream_id, subject, self._commit_seq + 1),
            )
            if key is not None:
                found.append(keys.index_seq(key))
        return sorted(found)

    def count_matching(self, *, from_seq: int, filter_subject: str) -> int:
        if not filter_subject:
            if from_seq <= self.first_seq:
                return self.record.messages
            below = sum(1 for _ in self._storage.scan_keys(
                CF_MESSAGES, lower=keys.message_key(self.stream_id, self.first_seq),
                upper=keys.message_key(self.stream_id, from_seq),
            ))
            return max(self.record.messages - below, 0)
        total = 0
        for subject in self.subject_stats:
            if subjects.matches(filter_subject, subject):
                total += sum(1 for _ in self._subject_seqs(
                    subject, from_seq=max(from_seq, 1), to_seq=self._commit_seq))
        return total

    # ----------------------------------------------------------------- commit visibility

    async def wait_for_commit(self, *, above_seq: int, timeout_s: float) -> bool:
        if self._commit_seq > above_seq:
            return True
        if self.closed or timeout_s <= 0:
            return False
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            pass
        finally:
            if future in self._waiters:
                self._waiters.remove(future)
        return self._commit_seq > above_seq

    def _advance_commit(self, seq: int) -> None:
        if seq <= self._commit_seq:
            return
        self._commit_seq = seq
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    def _wake_all(self) -> None:
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    def close(self) -> None:
        self.closed = True
        self._wake_all()

    def reset_commit_seq(self) -> None:
        """Nothing stored here counts as committed until a primary says so."""
        self._commit_seq = 0

    def set_commit_seq(self, seq: int) -> None:
        """The replicator (primary) or the primary's word (replica) moves the high-water mark;
        never above what is stored here."""
        self._advance_commit(min(seq, self.record.last_seq))

    def depose(self, error: RaftlogError) -> None:
        """This node is no longer the primary: pending publishes fail, writes are refused."""
        self.deposed = error
        self.primacy += 1
        self._wake_all()

    def become_primary(self, *, epoch: int) -> None:
        """Leads the stream at a fence epoch (from the committed assignment): new messages
        carry that epoch."""
        if self.role != ROLE_PRIMARY or self.record.epoch != epoch or self.deposed is not None:
            self.primacy += 1
        self.role = ROLE_PRIMARY
        self.deposed = None
        self.record.epoch = max(self.record.epoch, epoch)
        self._wake_all()

    def become_replica(self) -> None:
        """Follows a primary: refuses writes and reads; takes batches (accept_replicated).
        The epoch is left alone so that the next batch still truncates an old tail."""
        if self.role != ROLE_REPLICA:
            self.primacy += 1
        self.role = ROLE_REPLICA
        self.deposed = None
        self.removed_log.clear()
        self._wake_all()

    # ----------------------------------------------------------------- publishing

    def _subject_key(self, subject: str) -> tuple[bytes, int]:
        """The subject's index key prefix and byte length, once the subject is known to be
        acceptable to this stream."""
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
        if len(self._known_subjects) >= known_subjects_max:
            self._known_subjects.clear()
        known = (keys.index_prefix(self.stream_id, subject), len(subject.encode()))
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

    def _duplicate_of(self, msg_id: str, now_ms: int) -> int | None:
        found = self.dedupe.get(msg_id)
        if found is None:
            return None
        seq, ts_ms = found
        return seq if ts_ms >= now_ms - self.dedupe_window_ms else None

    def _expire_dedupe(self, batch: WriteBatch, now_ms: int) -> None:
        cutoff = now_ms - self.dedupe_window_ms
        handle = self._storage.handle(CF_DEDUPE)
        while self.dedupe:
            msg_id, (_, ts_ms) = next(iter(self.dedupe.items()))
            if ts_ms >= cutoff and len(self.dedupe) <= limits.dedupe_entries_max:
                return
            self.dedupe.popitem(last=False)
            batch.delete(keys.dedupe_key(self.stream_id, msg_id), handle)

    def _has_limits(self) -> bool:
        config = self.config
        return bool(config.max_msgs or config.max_bytes or config.max_msgs_per_subject)

    def _over_limits(self, subject: str) -> bool:
        config = self.config
        stat = self.subject_stats.get(subject)
        return bool(
            (config.max_msgs and self.record.messages > config.max_msgs)
            or (config.max_bytes and self.record.bytes > config.max_bytes)
            or (config.max_msgs_per_subject and stat and stat.count > config.max_msgs_per_subject)
        )

    def publish_staged(self, entries: Sequence[Draft]) -> tuple[
        list[Appended | RaftlogError], int
    ]:
        """Checks, assigns seqs and writes (unsynced) a batch; returns per-entry results and
        the seq that must be committed before any of them is acknowledged (0: none).

        The hot path of the node: per message one subject lookup, one size check, the entry's
        own bytes plus a shared tail (ts_ms, epoch) as the stored value, and two puts."""
        if self.closed:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"stream {self.name!r} was deleted")
        self._check_writable()
        now_ms = self._clock.wall_ms()
        tail = storage_pb2.StoredMessage(ts_ms=now_ms, epoch=self.record.epoch) \
            .SerializeToString()
        size_max = self.max_message_bytes
        check_limits = self._has_limits()
        record, stats = self.record, self.subject_stats
        message_prefix = keys.stream_prefix(self.stream_id)
        messages_cf = self._storage.handle(CF_MESSAGES)
        subjects_cf = self._storage.handle(CF_SUBJECTS)
        pack = keys.u64
        results: list[Appended | RaftlogError] = []
        wait_seq = 0
        batch = self._storage.batch()
        touched: set[str] = set()
        for entry in entries:
            subject, msg_id = entry.subject, entry.msg_id
            expects = entry.HasField("expected_last_seq") or \
                entry.HasField("expected_last_subject_seq")
            try:
                index_prefix, size = self._subject_key(subject)
                headers = entry.headers
                size += len(entry.payload) + (self._headers_size(headers) if headers else 0)
                if size > size_max or msg_id:
                    self._check_size(entry, size, size_max)
                if msg_id:
                    duplicate = self._duplicate_of(msg_id, now_ms)
                    if duplicate is not None:
                        results.append(Appended(duplicate, duplicate=True))
                        wait_seq = max(wait_seq, duplicate)
                        continue
                if expects:
                    self._check_expectations(entry)
            except RaftlogError as err:
                results.append(err)
                continue
            seq = record.last_seq + 1
            if expects or isinstance(entry, streams_pb2.PublishRequest):
                entry = self._stored_form(entry)
            seq_key = pack(seq)
            batch.put(message_prefix + seq_key, entry.SerializeToString() + tail, messages_cf)
            batch.put(index_prefix + seq_key, b"", subjects_cf)
            stat = stats.get(subject)
            if stat is None:
                stats[subject] = SubjectStat(1, seq)
            else:
                stat.count += 1
                stat.last_seq = seq
            if msg_id:
                self._remember(batch, msg_id, seq=seq, now_ms=now_ms)
            record.last_seq = seq
            record.last_epoch = record.epoch
            record.messages += 1
            record.bytes += size
            if record.messages == 1:
                record.first_seq = seq
            touched.add(subject)
            results.append(Appended(seq))
            wait_seq = seq
            if check_limits and self._over_limits(subject):
                batch = self._write(batch, touched)
                touched = set()
                self._enforce_limits(subject)
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

    def _remember(self, batch: WriteBatch, msg_id: str, *, seq: int, now_ms: int) -> None:
        self.dedupe[msg_id] = (seq, now_ms)
        self.dedupe.move_to_end(msg_id)
        batch.put(keys.dedupe_key(self.stream_id, msg_id), keys.pair(seq, now_ms),
                  self._storage.handle(CF_DEDUPE))

    def _check_primacy(self, primacy: int) -> None:
        """A publish is answered only by the primacy that staged it: after a role change its
        seq may hold another message."""
        if self.deposed is not None:
            raise self.deposed
        if self.primacy != primacy or self.role != ROLE_PRIMARY:
            raise RaftlogError(Reason.NOT_PRIMARY, f"this node stopped being the primary of "
                               f"{self.name!r}; retry with the same msg_id",
                               stream=self.name)

    def _check_writable(self) -> None:
        if self.deposed is not None:
            raise self.deposed
        if self.role != ROLE_PRIMARY:
            raise RaftlogError(Reason.NOT_PRIMARY, f"this node holds a replica of "
                               f"{self.name!r}, not its primary", stream=self.name)

    async def commit(self, wait_seq: int) -> None:
        """Waits until `wait_seq` is committed: durable here and, when replicated, on a
        majority of the stream's replicas. NO_QUORUM after commit_wait_s_max; NOT_PRIMARY
        when this node is deposed meanwhile."""
        if wait_seq <= self._commit_seq:
            return
        primacy = self.primacy
        target = self.record.last_seq
        if self.replicator is not None:
            self.replicator.kick()
        await self._committer.durable()
        self.durable_seq = max(self.durable_seq, target)
        self._check_primacy(primacy)
        if self.replicator is None:
            self._advance_commit(target)
            return
        self.replicator.on_local_durable()
        deadline = asyncio.get_running_loop().time() + commit_wait_s_max
        while self._commit_seq < wait_seq:
            self._check_primacy(primacy)
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0 or self.closed:
                raise RaftlogError(Reason.NO_QUORUM, f"seq {wait_seq} of {self.name!r} is not "
                                   "on a majority of its replicas yet; retry with the same "
                                   "msg_id", stream=self.name, seq=wait_seq)
            await self.wait_for_commit(above_seq=self._commit_seq,
                                       timeout_s=min(remaining, commit_check_s))
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

    # ----------------------------------------------------------------- removal

    def _write(self, batch: WriteBatch, touched: set[str]) -> WriteBatch:
        """Writes counters of touched subjects and the stream record with `batch`."""
        handle = self._storage.handle(CF_SUBJECTS)
        for subject in touched:
            stat = self.subject_stats.get(subject)
            key = keys.summary_key(self.stream_id, subject)
            if stat is None:
                batch.delete(key, handle)
            else:
                batch.put(key, keys.pair(stat.count, stat.last_seq), handle)
        batch.put(self.name.encode(), self.record.SerializeToString(),
                  self._storage.handle(CF_STREAM_STATE))
        self._storage.write(batch)
        return self._storage.batch()

    def _delete_seq(self, batch: WriteBatch, seq: int, touched: set[str]) -> bool:
        stored = self._read_stored(seq)
        if stored is None:
            return False
        size = stored_size(stored)
        batch.delete(keys.message_key(self.stream_id, seq), self._storage.handle(CF_MESSAGES))
        if self.replicator is not None and len(self.removed_log) < removed_log_max:
            self.removed_log.append(seq)
        batch.delete(keys.index_key(self.stream_id, stored.subject, seq),
                     self._storage.handle(CF_SUBJECTS))
        stat = self.subject_stats[stored.subject]
        stat.count -= 1
        if stat.count <= 0:
            del self.subject_stats[stored.subject]
        elif stat.last_seq == seq:
            key = self._storage.last_key(
                CF_SUBJECTS, lower=keys.index_prefix(self.stream_id, stored.subject),
                upper=keys.index_key(self.stream_id, stored.subject, seq),
            )
            stat.last_seq = keys.index_seq(key) if key else 0
        touched.add(stored.subject)
        self.record.messages -= 1
        self.record.bytes -= size
        if self.record.messages < 0:
            raise InvariantViolation(f"stream {self.name}: message count went negative")
        return True

    def _advance_head(self) -> None:
        """Moves first_seq to the first stored message (last_seq + 1 when empty)."""
        lower = keys.message_key(self.stream_id, max(self.record.first_seq, 1))
        upper = keys.message_key(self.stream_id, self.record.last_seq + 1)
        for key in self._storage.scan_keys(CF_MESSAGES, lower=lower, upper=upper):
            self.record.first_seq = keys.message_seq(key)
            return
        self.record.first_seq = self.record.last_seq + 1

    def _enforce_limits(self, subject: str) -> int:
        """Removes the oldest messages until the stream is within its limits; written, not
        yet durable (the caller's commit covers it)."""
        config = self.config
        removed = 0
        touched: set[str] = set()
        batch = self._storage.batch()
        stat = self.subject_stats.get(subject)
        if config.max_msgs_per_subject and stat and stat.count > config.max_msgs_per_subject:
            excess = stat.count - config.max_msgs_per_subject
            oldest = list(self._subject_seqs(subject, from_seq=1, to_seq=self.last_seq))[:excess]
            for seq in oldest:
                removed += self._delete_seq(batch, seq, touched)
            batch = self._write(batch, touched)
            self._advance_head()
        while (config.max_msgs and self.record.messages > config.max_msgs) or (
            config.max_bytes and self.record.bytes > config.max_bytes
        ):
            head = self.record.first_seq
            if not self._delete_seq(batch, head, touched):
                raise InvariantViolation(f"stream {self.name}: head seq {head} is missing")
            removed += 1
            batch = self._write(batch, touched)
            touched = set()
            self._advance_head()
        self._write(batch, touched)
        self._advance_head()
        return removed

    async def enforce_limits(self) -> int:
        """After a config change: prunes to the (new) limits, durably."""
        removed = 0
        for subject in list(self.subject_stats):
            removed += self._enforce_limits(subject)
        removed += self._enforce_limits("")
        if removed:
            await self._committer.durable()
        return removed

    async def remove(self, seqs: list[int]) -> int:
        batch = self._storage.batch()
        touched: set[str] = set()
        removed = sum(self._delete_seq(batch, seq, touched) for seq in sorted(set(seqs))
                      if 0 < seq <= self._commit_seq)
        self._write(batch, touched)
        self._advance_head()
        if removed:
            await self._committer.durable()
        return removed

    async def expire(self, *, now_ms: int) -> int:
        """Removes messages older than max_age (at most retention_sweep_deletes_max)."""
        if not self.config.max_age_ms or not self.record.messages:
            return 0
        cutoff = now_ms - self.config.max_age_ms
        expired: list[int] = []
        for seq, raw in self._committed_items(self.first_seq):
            if len(expired) >= limits.retention_sweep_deletes_max or \
                    storage_pb2.StoredMessage.FromString(raw).ts_ms >= cutoff:
                break
            expired.append(seq)
        return await self.remove(expired) if expired else 0

    async def purge(self, *, subject: str, below_seq: int, keep: int) -> int:
        if not subject and not below_seq and not keep:
            return await self._purge_all()
        candidates = self._purge_candidates(subject, below_seq=below_seq)
        if keep:
            candidates = candidates[: max(len(candidates) - keep, 0)]
        return await self.remove(candidates)

    def _purge_candidates(self, subject: str, *, below_seq: int) -> list[int]:
        upper = min(below_seq - 1, self.last_seq) if below_seq else self.last_seq
        if not subject:
            return [keys.message_seq(key) for key in self._storage.scan_keys(
                CF_MESSAGES, lower=keys.message_key(self.stream_id, self.first_seq),
                upper=keys.message_key(self.stream_id, upper + 1))]
        found: list[int] = []
        for name in list(self.subject_stats):
            if subjects.matches(subject, name):
                found.extend(self._subject_seqs(name, from_seq=1, to_seq=upper))
        return sorted(found)

    async def _purge_all(self) -> int:
        purged = self.record.messages
        batch = self._storage.batch()
        batch.delete_range(keys.stream_prefix(self.stream_id), keys.stream_end(self.stream_id),
                           self._storage.handle(CF_MESSAGES))
        batch.delete_range(keys.stream_prefix(self.stream_id), keys.stream_end(self.stream_id),
                           self._storage.handle(CF_SUBJECTS))
        self.subject_stats.clear()
        self.record.messages = 0
        self.record.bytes = 0
        self.record.first_seq = self.record.last_seq + 1
        self._write(batch, set())
        await self._committer.durable()
        return purged

    # ----------------------------------------------------------------- primary side

    def stored_values(self, *, from_seq: int, to_seq: int, bytes_max: int) -> list[bytes]:
        """Stored bytes of seqs from_seq..to_seq (fewer once bytes_max is reached); a seq
        removed here (work queue, purge) is an empty value, so the replica still moves on."""
        values: list[bytes] = []
        size = 0
        expected = from_seq
        for key, value in self._storage.scan(
                CF_MESSAGES, lower=keys.message_key(self.stream_id, from_seq),
                upper=keys.message_key(self.stream_id, to_seq + 1)):
            seq = keys.message_seq(key)
            if values and size + len(value) > bytes_max:
                return values
            values.extend([b""] * (seq - expected))
            values.append(value)
            size += len(value)
            expected = seq + 1
        values.extend([b""] * (to_seq + 1 - expected))
        return values

    # ----------------------------------------------------------------- replica side

    def accept_replicated(self, request: replication_pb2.ReplicateRequest) -> int:
        """Applies a primary's batch; see `stream_replica.accept_replicated`."""
        return stream_replica.accept_replicated(self, request)

    async def fence(self, epoch: int) -> None:
        """Refuses batches below `epoch` from now on (durable on return)."""
        if self.fence_unsynced(epoch):
            await self._committer.durable()

    def fence_unsynced(self, epoch: int) -> bool:
        """Refuses batches below `epoch` from now on; written, durable with the next group
        commit. True when the fence moved."""
        return stream_replica.fence_unsynced(self, epoch)

    def replica_state(self) -> tuple[int, int, int, int]:
        """(epoch, first_seq, last_seq, commit_seq) of the local copy."""
        return self.record.epoch, self.record.first_seq, self.record.last_seq, self._commit_seq
