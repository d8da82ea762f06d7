"""The Raft journal on RocksDB: pysyncobj's Journal interface over two column families of the
node's one database (the caller opens it, raw mode, and owns it).

Layout:
- log CF: key = big-endian u64 Raft index, value = big-endian u64 term + command bytes;
- meta CF: `current_term` (u64be), `voted_for` (utf-8 node id; absent = no vote),
  `commit_index` (u64be).

Durability contract (what pysyncobj needs and does not do itself, DEPENDENCIES.md §1.3, §5.1):
- `setCurrentTerm` is durable before it returns: pysyncobj sends the vote or vote request right
  after, and a node that forgot its vote could vote twice in one term.
- `add` writes without fsync and marks the journal dirty; `sync()` makes everything written so
  far durable with one `flush_wal(True)` (which releases the GIL), and only when dirty. The
  transport calls it before a follower acknowledges entries and after every tick (the leader's
  own appends), which is group commit: one fsync per append_entries message, not per entry.
- A NO_OP (a new leader's first entry) is synced at once: in a one-member group the leader
  commits it on the next tick, before the end-of-tick sync would have run.
- The commit index is stored lazily (once a second, unsynced): pysyncobj only needs it to
  re-apply committed entries at start, and it is clamped to the journal's end on load.

Positions, not indexes: `deleteEntriesFrom/To(pos)` and `__getitem__` take positions in the
retained entries (0 = the first retained one), exactly like pysyncobj's FileJournal. All
retained entries are also kept in a list, as FileJournal does: pysyncobj slices the tail on
every append_entries and pickles the slices, so slices are lists of `(command, index, term)`.

pysyncobj's followers truncate and rewrite entries they already hold under pipelining
(DEPENDENCIES.md §1.11); `counters` measures that churn: truncations, truncated entries, and
re-added entries that were identical or different from what was truncated at that index.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, overload

from rocksdict import Rdict, WriteBatch

from raftlog.base import limits
from raftlog.base.errors import InvariantViolation
from raftlog.base.fatal import fatal_on_disk_failure

Entry = tuple[bytes, int, int]  # (command, raft index, term), pysyncobj's entry shape

_U64 = struct.Struct(">Q")
_KEY_END = b"\xff" * 9  # sorts above every 8-byte key
_META_TERM = b"current_term"
_META_VOTE = b"voted_for"
_META_COMMIT = b"commit_index"
NO_OP_COMMAND = b"\x01"  # pysyncobj's _COMMAND_TYPE.NO_OP entry


def _key(index: int) -> bytes:
    return _U64.pack(index)


def _entry(key: bytes, value: bytes) -> Entry:
    if len(key) != _U64.size or len(value) < _U64.size:
        raise InvariantViolation(f"raft journal: malformed record at key {key!r}")
    return (bytes(value[_U64.size:]), _U64.unpack(key)[0], _U64.unpack(value[:_U64.size])[0])


def stored_commit_index(meta: Any) -> int:
    """The commit index a journal's meta column family holds, read as `RocksJournal` reads it
    at start (1 when none is stored). It is stored lazily: up to a second behind the group's."""
    raw = meta.get(_META_COMMIT)
    return 1 if raw is None else int(_U64.unpack(raw)[0])


def stored_entries(log: Any, *, lower: int) -> Iterator[Entry]:
    """The entries of a journal's log column family with index >= `lower`, ascending, one at a
    time (for readers that leave the journal alone, e.g. raft/replay.py)."""
    it = log.iter()
    it.seek(_key(lower))
    while it.valid():
        yield _entry(it.key(), it.value())
        it.next()


class RocksJournal:
    """pysyncobj Journal over RocksDB. Called from pysyncobj's tick thread only (`counters`
    and `dirty` may be read from anywhere)."""

    def __init__(self, db: Rdict, *, log_cf: str, meta_cf: str) -> None:
        self._db = db
        self._log_name = log_cf
        self._log: Any = db.get_column_family(log_cf)
        self._log_handle: Any = db.get_column_family_handle(log_cf)
        self._meta: Any = db.get_column_family(meta_cf)
        self._meta_handle: Any = db.get_column_family_handle(meta_cf)
        self._entries: list[Entry] = self._load_entries()
        self._term = self._get_u64(_META_TERM, default=0)
        vote = self._meta.get(_META_VOTE)
        self._voted_for: str | None = None if vote is None else bytes(vote).decode()
        last = self._entries[-1][1] if self._entries else 1
        self._commit_index = min(self._get_u64(_META_COMMIT, default=1), last)
        self._commit_saved = True
        self._dirty = False
        self._truncated: dict[int, tuple[int, bytes]] = {}
        # Set by the group as it applies: tells a rewrite of an applied entry (divergence) from
        # the routine rewrite of an unapplied tail.
        self.applied_index = 0
        self.counters: dict[str, int] = dict.fromkeys(
            ("adds", "syncs", "term_writes", "truncations", "truncated_entries",
             "readds_identical", "readds_conflicting", "readds_conflicting_applied",
             "compactions", "compacted_entries", "clears", "acks_after_sync"), 0)

    # -- loading ---------------------------------------------------------------------------

    def _load_entries(self) -> list[Entry]:
        entries: list[Entry] = []
        for key, value in self._log.items():
            entry = _entry(key, value)
            if entries and entry[1] != entries[-1][1] + 1:
                raise InvariantViolation(
                    f"raft journal: index {entry[1]} follows {entries[-1][1]} (a hole)")
            entries.append(entry)
        return entries

    def _get_u64(self, key: bytes, *, default: int) -> int:
        raw = self._meta.get(key)
        return default if raw is None else int(_U64.unpack(raw)[0])

    # -- the Journal interface -------------------------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        if not isinstance(command, bytes) or not isinstance(idx, int) or not isinstance(term, int):
            raise InvariantViolation(f"raft journal: malformed entry at index {idx!r}")
        if self._entries and idx != self._entries[-1][1] + 1:
            raise InvariantViolation(
                f"raft journal: add of index {idx} after {self._entries[-1][1]}")
        with fatal_on_disk_failure("a write to the Raft journal"):
            self._log.put(_key(idx), _U64.pack(term) + command)
        self._entries.append((command, idx, term))
        self._dirty = True
        self.counters["adds"] += 1
        self._count_readd(command, idx, term)
        if command == NO_OP_COMMAND:
            self.sync()

    def _count_readd(self, command: bytes, idx: int, term: int) -> None:
        if not self._truncated:
            return
        before = self._truncated.pop(idx, None)
        if before is not None:
            identical = before == (term, command)
            self.counters["readds_identical" if identical else "readds_conflicting"] += 1
            if not identical and idx <= self.applied_index:
                self.counters["readds_conflicting_applied"] += 1

    def clear(self) -> None:
        self._delete_range(_key(0), _KEY_END)
        self._entries = []
        self._truncated.clear()
        self.counters["clears"] += 1

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        removed = self._entries[entryFrom:]
        if not removed:
            return
        self._delete_range(_key(removed[0][1]), _KEY_END)
        del self._entries[entryFrom:]
        self.counters["truncations"] += 1
        self.counters["truncated_entries"] += len(removed)
        # Truncated entries are remembered to tell identical re-adds from conflicting ones.
        remembered_max = limits.raft_truncated_memory_entries_max
        if len(self._truncated) + len(removed) > remembered_max:
            self._truncated.clear()
        for command, idx, term in removed[:remembered_max]:
            self._truncated[idx] = (term, command)

    def deleteEntriesTo(self, entryTo: int) -> None:
        removed = self._entries[:entryTo]
        if not removed:
            return
        self._delete_range(_key(removed[0][1]), _key(removed[-1][1] + 1))
        self._entries = self._entries[entryTo:]
        self.counters["compactions"] += 1
        self.counters["compacted_entries"] += len(removed)

    @overload
    def __getitem__(self, item: int) -> Entry: ...

    @overload
    def __getitem__(self, item: slice) -> list[Entry]: ...

    def __getitem__(self, item: int | slice) -> Entry | list[Entry]:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        if raftCommitIndex != self._commit_index:
            self._commit_index = raftCommitIndex
            self._commit_saved = False

    def getRaftCommitIndex(self) -> int:
        return self._commit_index

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:
        """Durable on return: the caller sends a vote or a vote request right after."""
        if term == self._term and votedForNodeId == self._voted_for:
            return
        batch = WriteBatch(raw_mode=True)
        batch.put(_META_TERM, _U64.pack(term), self._meta_handle)
        if votedForNodeId is None:
            batch.delete(_META_VOTE, self._meta_handle)
        else:
            batch.put(_META_VOTE, str(votedForNodeId).encode(), self._meta_handle)
        with fatal_on_disk_failure("a write of the Raft term and vote"):
            self._db.write(batch)
            self._db.flush_wal(True)
        self._term, self._voted_for = term, votedForNodeId
        self._dirty = False
        self.counters["term_writes"] += 1

    def getCurrentTerm(self) -> int:
        return self._term

    def getVotedForNodeId(self) -> str | None:
        return self._voted_for

    def onOneSecondTimer(self) -> None:
        if not self._commit_saved:
            with fatal_on_disk_failure("a write to the Raft journal"):
                self._meta.put(_META_COMMIT, _U64.pack(self._commit_index))
            self._commit_saved = True
            self._dirty = True

    def _destroy(self) -> None:
        """pysyncobj's close: saves the commit index, syncs, and lets go of the column families
        (the database stays open while anything refers to them)."""
        if self._log is None:
            return
        self.onOneSecondTimer()
        self.sync()
        self._log = self._log_handle = self._meta = self._meta_handle = None

    def flush(self) -> None:
        self.sync()

    # -- durability ------------------------------------------------------------------------

    @property
    def dirty(self) -> bool:
        """True while something written is not yet fsynced."""
        return self._dirty

    def sync(self) -> None:
        """Makes every write so far durable (one WAL fsync), if anything is pending."""
        if not self._dirty:
            return
        with fatal_on_disk_failure("fsync of the Raft journal"):
            self._db.flush_wal(True)
        self._dirty = False
        self.counters["syncs"] += 1

    def close(self) -> None:
        self._destroy()

    def _delete_range(self, begin: bytes, end: bytes) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.delete_range(begin, end, self._log_handle)
        with fatal_on_disk_failure("a write to the Raft journal"):
            self._db.write(batch)
        self._dirty = True
