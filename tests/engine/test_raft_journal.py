"""The RocksDB Raft journal (raftlog.raft.journal): pysyncobj's Journal contract (positions, not
indexes; slices are lists; deleteEntriesFrom/To; clear), what survives a reopen, and when it
fsyncs (a spy around the database records the calls)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pysyncobj.journal import MemoryJournal
from rocksdict import Options, Rdict

from raftlog.base.errors import InvariantViolation
from raftlog.raft.journal import NO_OP_COMMAND, RocksJournal

CFS = ("raft_log", "raft_meta")


def open_db(path: Path) -> Rdict:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    return Rdict(str(path), options,
                 column_families={name: Options(raw_mode=True) for name in CFS})


class Store:
    """A database directory with one open journal; `reopen` closes and opens both again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = open_db(path)
        self.spy = SpyDb(self.db)
        self.journal = RocksJournal(cast(Rdict, self.spy), log_cf=CFS[0], meta_cf=CFS[1])

    def reopen(self, *, sync: bool = True) -> RocksJournal:
        if sync:
            self.journal.sync()
        # Let go of the column families without saving anything more (a crash, as far as
        # this process can tell), or the database cannot be closed.
        for attribute in ("_log", "_log_handle", "_meta", "_meta_handle"):
            setattr(self.journal, attribute, None)
        self.journal = None  # type: ignore[assignment]
        self.db.close()
        self.db = open_db(self.path)
        self.spy = SpyDb(self.db)
        self.journal = RocksJournal(cast(Rdict, self.spy), log_cf=CFS[0], meta_cf=CFS[1])
        return self.journal

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()
        self.db.close()


class SpyDb:
    """Delegates to the Rdict and records writes and WAL flushes, in order."""

    def __init__(self, db: Rdict) -> None:
        self._db = db
        self.calls: list[str] = []

    def write(self, batch: Any, *args: Any) -> None:
        self.calls.append("write")
        self._db.write(batch, *args)

    def flush_wal(self, sync: bool) -> None:
        self.calls.append(f"flush_wal({sync})")
        self._db.flush_wal(sync)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "db")
    try:
        yield opened
    finally:
        opened.close()


def fill(journal: RocksJournal, first: int, last: int, *, term: int = 1) -> None:
    for index in range(first, last + 1):
        journal.add(b"cmd-%d" % index, index, term)


def test_a_new_journal_is_empty_with_term_zero_and_no_vote(store: Store) -> None:
    journal = store.journal
    assert len(journal) == 0
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId()) == (0, None)
    assert journal.getRaftCommitIndex() == 1


def test_entries_are_command_index_term_tuples_and_slices_are_lists(store: Store) -> None:
    journal = store.journal
    fill(journal, 1, 5, term=2)
    assert journal[0] == (b"cmd-1", 1, 2) and journal[-1] == (b"cmd-5", 5, 2)
    tail = journal[2:]
    assert isinstance(tail, list) and [entry[1] for entry in tail] == [3, 4, 5]
    assert journal[1:3] == [(b"cmd-2", 2, 2), (b"cmd-3", 3, 2)]
    assert journal[9:] == [] and not journal[9:]
    assert list(reversed(journal[3:])) == [journal[4], journal[3]]
    assert pickle.loads(pickle.dumps(journal[0:2], 5)) == journal[0:2]


def test_positions_are_not_indexes(store: Store) -> None:
    journal = store.journal
    fill(journal, 1, 10)
    journal.deleteEntriesTo(4)  # positions 0..3 = indexes 1..4
    assert journal[0][1] == 5 and len(journal) == 6
    journal.deleteEntriesFrom(2)  # positions 2.. = indexes 7..10
    assert [entry[1] for entry in journal[0:]] == [5, 6]


def test_delete_entries_from_truncates_the_suffix_durably(store: Store) -> None:
    fill(store.journal, 1, 8)
    store.journal.deleteEntriesFrom(5)
    store.journal.add(b"other", 6, 2)
    journal = store.reopen()
    assert [(entry[1], entry[2]) for entry in journal[0:]] == [
        (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 2)]


def test_delete_entries_to_drops_the_prefix_durably(store: Store) -> None:
    fill(store.journal, 1, 8)
    store.journal.deleteEntriesTo(6)
    journal = store.reopen()
    assert [entry[1] for entry in journal[0:]] == [7, 8]
    journal.add(b"next", 9, 1)
    assert journal[-1] == (b"next", 9, 1)


def test_clear_then_add_installs_a_snapshot_position(store: Store) -> None:
    fill(store.journal, 1, 8)
    store.journal.clear()
    assert len(store.journal) == 0
    store.journal.add(b"prev", 99, 3)
    store.journal.add(b"last", 100, 3)
    journal = store.reopen()
    assert journal[0:] == [(b"prev", 99, 3), (b"last", 100, 3)]


@pytest.mark.parametrize(("command", "index"), [(b"x", 7), ("text", 6), (b"x", "6")],
                         ids=["gap", "str-command", "str-index"])
def test_add_refuses_a_gap_or_a_malformed_entry(store: Store, command: Any, index: Any) -> None:
    fill(store.journal, 1, 5)
    with pytest.raises(InvariantViolation):
        store.journal.add(command, index, 1)
    assert len(store.journal) == 5


def test_entries_survive_reopen_after_sync(store: Store) -> None:
    fill(store.journal, 1, 100, term=4)
    journal = store.reopen(sync=True)
    assert len(journal) == 100 and journal[99] == (b"cmd-100", 100, 4)


def test_term_and_vote_survive_reopen(store: Store) -> None:
    store.journal.setCurrentTerm(7, "127.0.0.1:9001")
    journal = store.reopen(sync=False)
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId()) == (7, "127.0.0.1:9001")
    journal.setCurrentTerm(8, None)
    journal = store.reopen(sync=False)
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId()) == (8, None)


def test_set_current_term_is_durable_before_it_returns(store: Store) -> None:
    """pysyncobj sends the vote right after setCurrentTerm returns: the vote must be fsynced
    by then (a write followed by a WAL fsync), and nothing may be left dirty."""
    store.journal.setCurrentTerm(3, "a:1")
    assert store.spy.calls == ["write", "flush_wal(True)"]
    assert not store.journal.dirty
    store.journal.setCurrentTerm(3, "a:1")  # unchanged: no second fsync
    assert store.spy.calls == ["write", "flush_wal(True)"]


def test_sync_fsyncs_only_when_dirty(store: Store) -> None:
    store.journal.add(b"a", 1, 1)
    store.journal.add(b"b", 2, 1)
    assert store.journal.dirty and store.spy.calls == []  # adds are unsynced
    store.journal.sync()
    store.journal.sync()
    assert store.spy.calls == ["flush_wal(True)"] and not store.journal.dirty
    store.journal.deleteEntriesFrom(1)
    assert store.journal.dirty
    assert store.journal.counters["syncs"] == 1


def test_a_no_op_is_synced_at_once(store: Store) -> None:
    store.journal.add(NO_OP_COMMAND, 1, 1)
    assert store.spy.calls == ["flush_wal(True)"] and not store.journal.dirty


def test_commit_index_is_stored_lazily_and_clamped_to_the_log(store: Store) -> None:
    fill(store.journal, 1, 10)
    store.journal.setRaftCommitIndex(9)
    assert store.reopen().getRaftCommitIndex() == 1  # not saved yet: pysyncobj's default
    store.journal.setRaftCommitIndex(9)
    store.journal.onOneSecondTimer()
    assert store.reopen().getRaftCommitIndex() == 9
    store.journal.deleteEntriesFrom(5)  # indexes 6..10 gone
    assert store.reopen().getRaftCommitIndex() == 5


def test_truncations_and_readds_are_counted(store: Store) -> None:
    journal = store.journal
    fill(journal, 1, 6)
    journal.applied_index = 4
    journal.deleteEntriesFrom(2)  # indexes 3..6
    journal.add(b"cmd-3", 3, 1)  # identical
    journal.add(b"changed", 4, 2)  # conflicting, and index 4 was applied
    journal.add(b"changed", 5, 2)  # conflicting, not applied
    counters = journal.counters
    assert (counters["truncations"], counters["truncated_entries"]) == (1, 4)
    assert (counters["readds_identical"], counters["readds_conflicting"],
            counters["readds_conflicting_applied"]) == (1, 2, 1)


def test_a_hole_in_the_stored_log_is_refused(store: Store) -> None:
    fill(store.journal, 1, 5)
    store.journal.sync()
    store.db.get_column_family(CFS[0]).delete((3).to_bytes(8, "big"))
    with pytest.raises(InvariantViolation, match="hole"):
        store.reopen()
    store.journal = None  # type: ignore[assignment]


def test_close_lets_go_of_the_database(store: Store) -> None:
    fill(store.journal, 1, 3)
    store.journal.close()
    store.journal.close()  # idempotent
    store.journal = None  # type: ignore[assignment]
    store.db.close()
    store.db = open_db(store.path)  # would fail with "lock hold by current process"
    assert len(RocksJournal(store.db, log_cf=CFS[0], meta_cf=CFS[1])) == 3


operations = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(1, 4)),
    st.tuples(st.just("from"), st.integers(0, 12)),
    st.tuples(st.just("to"), st.integers(0, 12)),
    st.tuples(st.just("clear"), st.just(0)),
), max_size=25)


@settings(max_examples=40, deadline=None)
@given(ops=operations)
def test_behaves_like_pysyncobjs_memory_journal(tmp_path_factory: pytest.TempPathFactory,
                                                ops: list[tuple[str, int]]) -> None:
    """Differential test against pysyncobj's own MemoryJournal, then across a reopen."""
    store = Store(tmp_path_factory.mktemp("diff") / "db")
    reference = MemoryJournal()
    try:
        next_index = 1
        for op, arg in ops:
            journal = store.journal
            if op == "add":
                for _ in range(arg):
                    for target in (journal, reference):
                        target.add(b"c%d" % next_index, next_index, arg)
                    next_index += 1
            elif op == "from":
                journal.deleteEntriesFrom(arg)
                reference.deleteEntriesFrom(arg)
            elif op == "to":
                journal.deleteEntriesTo(arg)
                reference.deleteEntriesTo(arg)
            else:
                journal.clear()
                reference.clear()
            if len(reference):
                next_index = reference[-1][1] + 1
            assert journal[0:] == reference[0:] and len(journal) == len(reference)
        assert store.reopen()[0:] == reference[0:]
    finally:
        store.close()
