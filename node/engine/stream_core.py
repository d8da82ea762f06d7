"""The state one stream keeps on one node, and what every concern of it shares.

`StreamCore` owns the stream's record and counters (per-subject counts, the dedupe window),
the commit seq with its waiters, and the stream's role here (primary or replica, deposed,
primacy). It loads them back from its `MessageStore` (store.py) and holds the storage
primitives that publishing, retention, reads and the replica side all use: reading a stored
message, scanning committed seqs, writing the counters and the record with a batch, deleting
one seq, moving the head.

The concerns are mixins over it: `stream_reads`, `stream_retention`, `stream_publish`,
`stream_replica`; `Stream` (stream.py) puts them together. Everything here runs on the event
loop thread. `commit_seq` (the high-water mark, G4) moves only after the fsync that covers the
write; readers never see a seq above it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import InvariantViolation, RaftlogError, Reason
from raftlog.base.waiters import settle
from raftlog.internal import storage_pb2
from raftlog.node.engine.log import LogEntry
from raftlog.node.engine.store import MessageStore, StoreBatch
from raftlog.v1 import streams_pb2, types_pb2

# The role of this node for a stream: the primary takes writes and serves reads; a replica only
# takes its primary's batches (stream_replica.py).
ROLE_PRIMARY = "primary"
ROLE_REPLICA = "replica"


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


def stored_size(stored: storage_pb2.StoredMessage | streams_pb2.PublishEntry,
                subject_bytes: int | None = None) -> int:
    """Bytes a message counts for in limits: subject, payload and headers. `subject_bytes`:
    the subject's encoded length, when the caller knows it already."""
    if subject_bytes is None:
        subject_bytes = len(stored.subject.encode())
    size = len(stored.payload) + subject_bytes
    headers = stored.headers
    if headers:  # most messages have none; iterating an empty one costs as much (hot path)
        for header in headers:
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
    headers = stored.headers
    # Positional: binding keywords costs a third of the build (every read makes one).
    return LogEntry(seq, stored.subject, stored.ts_ms, stored.payload,
                    tuple((h.key, h.value) for h in headers) if headers else (),
                    stored.msg_id)


class StreamCore:
    """The state of one stream here and the primitives its concerns share."""

    def __init__(
        self,
        *,
        store: MessageStore,
        clock: Clock,
        record: storage_pb2.StreamRecord,
    ) -> None:
        self._store = store
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
        self._unwritten_deletes: set[int] = set()  # deleted in the batch not yet written
        self.replicated_by = ""  # as a replica: the node whose batches it took last
        self._known_subjects: dict[str, tuple[bytes, int]] = {}
        self.closed = False

    # ----------------------------------------------------------------- loading

    def load(self) -> None:
        """Reads subject counters and the dedupe window back from the store."""
        for subject, count, last_seq in self._store.subjects(self.stream_id):
            self.subject_stats[subject] = SubjectStat(count, last_seq)
        cutoff = self._clock.wall_ms() - self.dedupe_window_ms
        entries = []
        for msg_id, seq, ts_ms in self._store.dedupe_entries(self.stream_id):
            if ts_ms >= cutoff:
                entries.append((ts_ms, seq, msg_id))
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

    # ----------------------------------------------------------------- storage primitives

    def _read_stored(self, seq: int) -> storage_pb2.StoredMessage | None:
        raw = self._store.get_message(self.stream_id, seq)
        if raw is None:
            return None
        return storage_pb2.StoredMessage.FromString(raw)

    def _committed_items(self, from_seq: int) -> Iterator[tuple[int, bytes]]:
        return self._store.messages(self.stream_id, lower=max(from_seq, self.first_seq),
                                    upper=self._commit_seq + 1)

    def _subject_seqs(self, subject: str, *, from_seq: int, to_seq: int) -> Iterator[int]:
        """Seqs of one literal subject in [from_seq, to_seq], ascending."""
        return self._store.subject_seqs(self.stream_id, subject, lower=from_seq,
                                        upper=to_seq + 1)

    def _write(self, batch: StoreBatch, touched: set[str]) -> StoreBatch:
        """Writes counters of touched subjects and the stream record with `batch`; returns a
        new batch."""
        for subject in touched:
            stat = self.subject_stats.get(subject)
            if stat is None:
                batch.delete_subject(self.stream_id, subject)
            else:
                batch.put_subject(self.stream_id, subject, count=stat.count,
                                  last_seq=stat.last_seq)
        batch.put_record(self.name, self.record.SerializeToString())
        self._store.write(batch)
        self._unwritten_deletes.clear()
        return self._store.batch()

    def _delete_seq(self, batch: StoreBatch, seq: int, touched: set[str]) -> bool:
        stored = self._read_stored(seq)
        if stored is None:
            return False
        size = stored_size(stored)
        batch.delete_message(self.stream_id, seq, subject=stored.subject)
        self._unwritten_deletes.add(seq)
        if self.replicator is not None and len(self.removed_log) < limits.removed_log_max:
            self.removed_log.append(seq)
        stat = self.subject_stats[stored.subject]
        stat.count -= 1
        if stat.count <= 0:
            del self.subject_stats[stored.subject]
        elif stat.last_seq == seq:
            stat.last_seq = self._last_kept(stored.subject, below=seq)
        touched.add(stored.subject)
        self.record.messages -= 1
        self.record.bytes -= size
        if self.record.messages < 0:
            raise InvariantViolation(f"stream {self.name}: message count went negative")
        return True

    def _last_kept(self, subject: str, *, below: int) -> int:
        """The subject's highest seq under `below` that stays, skipping those deleted by the
        batch being built (the store still holds them until it is written); 0 when none."""
        found = self._store.last_subject_seq(self.stream_id, subject, upper=below)
        while found and found in self._unwritten_deletes:
            found = self._store.last_subject_seq(self.stream_id, subject, upper=found)
        return found or 0

    def _advance_head(self) -> None:
        """Moves first_seq to the first stored message (last_seq + 1 when empty)."""
        stored = self._store.message_seqs(self.stream_id, lower=max(self.record.first_seq, 1),
                                          upper=self.record.last_seq + 1)
        self.record.first_seq = next(stored, self.record.last_seq + 1)

    def _remember(self, batch: StoreBatch, msg_id: str, *, seq: int, now_ms: int) -> None:
        self.dedupe[msg_id] = (seq, now_ms)
        self.dedupe.move_to_end(msg_id)
        batch.put_dedupe(self.stream_id, msg_id, seq=seq, ts_ms=now_ms)

    # ----------------------------------------------------------------- role

    def check_readable(self) -> None:
        """Reads are served by the primary, and by it only under its lease."""
        if self.deposed is not None:
            raise self.deposed
        if self.role != ROLE_PRIMARY:
            raise RaftlogError(Reason.NOT_PRIMARY, f"this node holds a replica of "
                               f"{self.name!r}, not its primary", stream=self.name)
        if self.replicator is not None:
            self.replicator.check_lease()

    def _check_writable(self) -> None:
        if self.deposed is not None:
            raise self.deposed
        if self.role != ROLE_PRIMARY:
            raise RaftlogError(Reason.NOT_PRIMARY, f"this node holds a replica of "
                               f"{self.name!r}, not its primary", stream=self.name)

    def _check_primacy(self, primacy: int) -> None:
        """A publish is answered only by the primacy that staged it: after a role change its
        seq may hold another message."""
        if self.deposed is not None:
            raise self.deposed
        if self.primacy != primacy or self.role != ROLE_PRIMARY:
            raise RaftlogError(Reason.NOT_PRIMARY, f"this node stopped being the primary of "
                               f"{self.name!r}; retry with the same msg_id",
                               stream=self.name)

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
        """Follows a primary: refuses writes and reads; takes batches (stream_replica.py).
        The epoch is left alone so that the next batch still truncates an old tail."""
        if self.role != ROLE_REPLICA:
            self.primacy += 1
        self.role = ROLE_REPLICA
        self.deposed = None
        self.removed_log.clear()
        self._wake_all()

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
        self._wake_all()

    def _wake_all(self) -> None:
        waiters, self._waiters = self._waiters, []
        settle(waiters)

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
