"""The state one stream keeps on one node, and what every concern of it shares.

`StreamCore` owns the stream's record and counters (per-subject counts, the dedupe window),
the commit seq with its waiters, and the stream's role here (primary or replica, deposed,
primacy). It loads them back from RocksDB and holds the storage primitives that publishing,
retention, reads and the replica side all use: reading a stored message, scanning committed
seqs, writing the counters and the record with a batch, deleting one seq, moving the head.

The concerns are mixins over it: `stream_reads`, `stream_retention`, `stream_publish`; `Stream`
(stream.py) puts them together. Everything here runs on the event loop thread. `commit_seq`
(the high-water mark, G4) moves only after the fsync that covers the write; readers never see
a seq above it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from rocksdict import WriteBatch

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import InvariantViolation, RaftlogError, Reason
from raftlog.base.waiters import settle
from raftlog.internal import storage_pb2
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
from raftlog.node.replication.replica import ROLE_PRIMARY, ROLE_REPLICA
from raftlog.v1 import streams_pb2, types_pb2

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



class StreamCore:
    """The state of one stream here and the primitives its concerns share."""

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

    # ----------------------------------------------------------------- storage primitives

    def _read_stored(self, seq: int) -> storage_pb2.StoredMessage | None:
        raw = self._storage.get(CF_MESSAGES, keys.message_key(self.stream_id, seq))
        if raw is None:
            return None
        return storage_pb2.StoredMessage.FromString(raw)

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

    def _remember(self, batch: WriteBatch, msg_id: str, *, seq: int, now_ms: int) -> None:
        self.dedupe[msg_id] = (seq, now_ms)
        self.dedupe.move_to_end(msg_id)
        batch.put(keys.dedupe_key(self.stream_id, msg_id), keys.pair(seq, now_ms),
                  self._storage.handle(CF_DEDUPE))

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
        """Follows a primary: refuses writes and reads; takes batches (accept_replicated).
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
