"""The `MessageStore` contract (node/engine/store.py): the same tests against the RocksDB store
(a real RocksDB in tmp_path) and its in-memory twin; a seeded run that applies the same random
batches to both and compares every read; and the RocksDB layout, byte for byte."""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest

from raftlog.base.errors import InvariantViolation
from raftlog.node.engine.memory_store import MemoryMessageStore
from raftlog.node.engine.rocks_store import RocksMessageStore
from raftlog.node.engine.storage import (
    CF_DEDUPE,
    CF_MESSAGES,
    CF_STREAM_STATE,
    CF_SUBJECTS,
    GroupCommitter,
    Storage,
)
from raftlog.node.engine.store import MessageStore, StoreBatch

SID, OTHER = 7, 8  # stream ids


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[Storage]:
    opened = Storage(tmp_path)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture(params=["rocks", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MessageStore]:
    if request.param == "memory":
        yield MemoryMessageStore()
        return
    storage = Storage(tmp_path)
    committer = GroupCommitter(storage)
    try:
        yield RocksMessageStore(storage, committer)
    finally:
        committer.stop()
        storage.close()


def write(store: MessageStore, fill: Callable[[StoreBatch], object]) -> None:
    batch = store.batch()
    fill(batch)
    store.write(batch)


def append(store: MessageStore, stream_id: int, first_seq: int, *subjects: str) -> None:
    """Messages of the given subjects from first_seq on; the value of seq n is b"v<n>"."""
    write(store, lambda batch: batch.append(
        stream_id, first_seq=first_seq,
        values=[f"v{first_seq + i}".encode() for i in range(len(subjects))],
        subject_refs=[store.subject_ref(stream_id, s) for s in subjects]))


def test_nothing_of_a_batch_is_visible_before_it_is_written(store: MessageStore) -> None:
    batch = store.batch()
    assert batch.is_empty()
    batch.append(SID, first_seq=1, values=[b"v1"], subject_refs=[store.subject_ref(SID, "a")])
    batch.put_record("s", b"record")
    assert not batch.is_empty()
    assert store.get_message(SID, 1) is None
    assert list(store.records()) == []
    store.write(batch)
    assert store.get_message(SID, 1) == b"v1"
    assert list(store.records()) == [("s", b"record")]


def test_appended_runs_read_back_by_seq_range_and_by_subject(store: MessageStore) -> None:
    append(store, SID, 1, "a", "b", "a")
    append(store, SID, 4, "c.d", "a")
    append(store, OTHER, 1, "a")
    assert list(store.message_seqs(SID, lower=1, upper=6)) == [1, 2, 3, 4, 5]
    assert list(store.messages(SID, lower=2, upper=4)) == [(2, b"v2"), (3, b"v3")]
    assert list(store.subject_seqs(SID, "a", lower=1, upper=6)) == [1, 3, 5]
    assert list(store.subject_seqs(SID, "a", lower=2, upper=5)) == [3]
    assert store.last_subject_seq(SID, "a", upper=5) == 3
    assert store.last_subject_seq(SID, "a", upper=1) is None
    assert store.last_subject_seq(SID, "zz", upper=9) is None
    assert list(store.messages(OTHER, lower=1, upper=9)) == [(1, b"v1")]


@pytest.mark.parametrize(("lower", "upper"), [(3, 3), (4, 2), (9, 20)])
def test_empty_and_inverted_ranges_yield_nothing(store: MessageStore, lower: int,
                                                 upper: int) -> None:
    append(store, SID, 1, "a", "a", "a", "a")
    assert list(store.messages(SID, lower=lower, upper=upper)) == []
    assert list(store.message_seqs(SID, lower=lower, upper=upper)) == []
    assert list(store.subject_seqs(SID, "a", lower=lower, upper=upper)) == []


def test_deleting_a_message_removes_it_and_its_index_entry(store: MessageStore) -> None:
    append(store, SID, 1, "a", "b", "a")
    write(store, lambda batch: batch.delete_message(SID, 3, subject="a"))
    write(store, lambda batch: batch.delete_message(SID, 9, subject="a"))  # missing: no error
    assert store.get_message(SID, 3) is None
    assert list(store.message_seqs(SID, lower=1, upper=9)) == [1, 2]
    assert list(store.subject_seqs(SID, "a", lower=1, upper=9)) == [1]
    assert store.last_subject_seq(SID, "a", upper=9) == 1


def test_subject_summaries_by_prefix_in_byte_order(store: MessageStore) -> None:
    def fill(batch: StoreBatch) -> None:
        for subject, count in (("k.b", 2), ("z", 1), ("k.a", 3), ("k", 4)):
            batch.put_subject(SID, subject, count=count, last_seq=10 * count)
        batch.put_subject(OTHER, "k.c", count=1, last_seq=1)

    write(store, fill)
    assert list(store.subjects(SID, "k.")) == [("k.a", 3, 30), ("k.b", 2, 20)]
    assert [s for s, _, _ in store.subjects(SID)] == ["k", "k.a", "k.b", "z"]
    write(store, lambda batch: batch.delete_subject(SID, "k.a"))
    write(store, lambda batch: batch.delete_subject(SID, "never"))
    assert list(store.subjects(SID, "k.")) == [("k.b", 2, 20)]


def test_the_dedupe_window_is_put_deleted_and_dropped(store: MessageStore) -> None:
    def fill(batch: StoreBatch) -> None:
        batch.put_dedupe(SID, "m2", seq=2, ts_ms=20)
        batch.put_dedupe(SID, "m1", seq=1, ts_ms=10)
        batch.put_dedupe(OTHER, "m1", seq=5, ts_ms=50)

    write(store, fill)
    assert list(store.dedupe_entries(SID)) == [("m1", 1, 10), ("m2", 2, 20)]
    write(store, lambda batch: batch.delete_dedupe(SID, "m1"))
    assert list(store.dedupe_entries(SID)) == [("m2", 2, 20)]
    write(store, lambda batch: batch.drop_dedupe(SID))
    assert list(store.dedupe_entries(SID)) == []
    assert list(store.dedupe_entries(OTHER)) == [("m1", 5, 50)]


def test_dropping_messages_keeps_the_dedupe_window_and_the_record(store: MessageStore) -> None:
    append(store, SID, 1, "a", "b")
    append(store, OTHER, 1, "a")

    def fill(batch: StoreBatch) -> None:
        batch.put_subject(SID, "a", count=1, last_seq=1)
        batch.put_dedupe(SID, "m", seq=1, ts_ms=1)
        batch.put_record("s", b"r")

    write(store, fill)
    write(store, lambda batch: batch.drop_messages(SID))
    assert list(store.messages(SID, lower=0, upper=99)) == []
    assert list(store.subject_seqs(SID, "a", lower=0, upper=99)) == []
    assert list(store.subjects(SID)) == []
    assert list(store.dedupe_entries(SID)) == [("m", 1, 1)]
    assert list(store.records()) == [("s", b"r")]
    assert list(store.message_seqs(OTHER, lower=0, upper=99)) == [1]


def test_deleting_a_stream_removes_everything_of_it_only(store: MessageStore) -> None:
    for stream_id, name in ((SID, "s"), (OTHER, "t")):
        append(store, stream_id, 1, "a")

        def fill(batch: StoreBatch, stream_id: int = stream_id, name: str = name) -> None:
            batch.put_subject(stream_id, "a", count=1, last_seq=1)
            batch.put_dedupe(stream_id, "m", seq=1, ts_ms=1)
            batch.put_record(name, name.encode())

        write(store, fill)
    write(store, lambda batch: batch.delete_stream(SID, "s"))
    assert (store.get_message(SID, 1), list(store.subjects(SID)),
            list(store.dedupe_entries(SID))) == (None, [], [])
    assert list(store.subject_seqs(SID, "a", lower=0, upper=9)) == []
    assert list(store.records()) == [("t", b"t")]
    assert store.get_message(OTHER, 1) == b"v1"
    assert list(store.dedupe_entries(OTHER)) == [("m", 1, 1)]


def test_records_and_the_next_stream_id(store: MessageStore) -> None:
    assert store.next_stream_id() == 1

    def fill(batch: StoreBatch) -> None:
        batch.put_record("orders", b"2")
        batch.put_record("audit", b"1")
        batch.put_next_stream_id(3)

    write(store, fill)
    write(store, lambda batch: batch.put_record("orders", b"2'"))
    assert list(store.records()) == [("audit", b"1"), ("orders", b"2'")]
    assert store.next_stream_id() == 3


def test_operations_apply_in_the_order_they_were_added(store: MessageStore) -> None:
    ref = store.subject_ref(SID, "a")

    def drop_then_append(batch: StoreBatch) -> None:
        batch.drop_messages(SID)
        batch.append(SID, first_seq=1, values=[b"kept"], subject_refs=[ref])

    def append_then_drop(batch: StoreBatch) -> None:
        batch.append(SID, first_seq=2, values=[b"gone"], subject_refs=[ref])
        batch.drop_messages(SID)

    write(store, drop_then_append)
    assert list(store.messages(SID, lower=0, upper=9)) == [(1, b"kept")]
    write(store, append_then_drop)
    assert list(store.messages(SID, lower=0, upper=9)) == []


def test_a_batch_is_written_once_and_only_by_its_own_store(store: MessageStore) -> None:
    batch = store.batch()
    store.write(batch)
    with pytest.raises(InvariantViolation):
        store.write(batch)
    with pytest.raises(InvariantViolation):
        store.write(cast(StoreBatch, object()))  # a batch this store did not make


def test_append_takes_one_subject_ref_per_value(store: MessageStore) -> None:
    batch = store.batch()
    with pytest.raises((InvariantViolation, ValueError)):
        batch.append(SID, first_seq=1, values=[b"a", b"b"],
                     subject_refs=[store.subject_ref(SID, "a")])
        store.write(batch)


def test_durable_returns_once_the_writes_before_it_are_durable(tmp_path: Path) -> None:
    async def main() -> None:
        storage = Storage(tmp_path)
        committer = GroupCommitter(storage)
        committer.start(asyncio.get_running_loop())
        rocks = RocksMessageStore(storage, committer)
        try:
            append(rocks, SID, 1, "a")
            await asyncio.wait_for(rocks.durable(), 10)
            assert committer.fsyncs >= 1
        finally:
            committer.stop()
            storage.close()
        memory = MemoryMessageStore()
        append(memory, SID, 1, "a")
        await memory.durable()
        assert (memory.writes, memory.durables) == (1, 1)

    asyncio.run(main())


def test_each_fsync_reports_its_writers_and_the_bytes_it_made_durable(tmp_path: Path) -> None:
    """The group commit's metrics hook: per fsync, the durable() callers it released and the
    bytes of the write batches since the previous fsync; over several fsyncs the bytes add up
    to everything written."""
    reports: list[tuple[int, int]] = []

    async def main() -> None:
        storage = Storage(tmp_path)
        committer = GroupCommitter(storage)
        committer.on_batch = lambda waiters, synced_bytes: reports.append((waiters, synced_bytes))
        committer.start(asyncio.get_running_loop())
        rocks = RocksMessageStore(storage, committer)
        try:
            append(rocks, SID, 1, "a")
            first = storage.written_bytes
            await asyncio.wait_for(rocks.durable(), 10)
            append(rocks, SID, 2, "b", "c")
            await asyncio.wait_for(asyncio.gather(rocks.durable(), rocks.durable()), 10)
            assert first > len(b"v1") and storage.written_bytes > first
            assert sum(synced for _, synced in reports) == storage.written_bytes
            assert reports[0] == (1, first)
            assert sum(waiters for waiters, _ in reports) == 3
        finally:
            committer.stop()
            storage.close()

    asyncio.run(main())


# ----------------------------------------------------------------- the twin against RocksDB

SUBJECTS = ("a", "b", "c.d")
NAMES = ("s1", "s2")
STREAMS = (1, 2)
SEQ_LIMIT = 40


def random_operation(rng: random.Random) -> Callable[[MessageStore, StoreBatch], None]:
    """One random batch operation (the same for whichever store it is applied to)."""
    sid, subject, seq = rng.choice(STREAMS), rng.choice(SUBJECTS), rng.randint(1, SEQ_LIMIT)
    kind = rng.randrange(10)
    if kind < 4:
        subjects = [rng.choice(SUBJECTS) for _ in range(rng.randint(1, 4))]
        values = [rng.randbytes(rng.randint(1, 6)) for _ in subjects]
        return lambda store, batch: batch.append(
            sid, first_seq=seq, values=values,
            subject_refs=[store.subject_ref(sid, s) for s in subjects])
    count, number, name = rng.randint(1, 9), rng.randint(1, 99), rng.choice(NAMES)
    choices: list[Callable[[MessageStore, StoreBatch], None]] = [
        lambda store, batch: batch.delete_message(sid, seq, subject=subject),
        lambda store, batch: batch.put_subject(sid, subject, count=count, last_seq=seq),
        lambda store, batch: batch.delete_subject(sid, subject),
        lambda store, batch: batch.put_dedupe(sid, f"m{count}", seq=seq, ts_ms=number),
        lambda store, batch: batch.delete_dedupe(sid, f"m{count}"),
        lambda store, batch: batch.drop_messages(sid),
        lambda store, batch: batch.drop_dedupe(sid),
        lambda store, batch: batch.put_record(name, bytes([number])),
        lambda store, batch: batch.put_next_stream_id(number),
        lambda store, batch: batch.delete_stream(sid, name),
    ]
    return rng.choice(choices[:1] * 3 + choices)


def everything(store: MessageStore) -> object:
    """Every read of the store, over the ids, subjects and seqs the random run uses."""
    per_stream = []
    for sid in STREAMS:
        per_stream.append((
            list(store.messages(sid, lower=0, upper=SEQ_LIMIT + 8)),
            list(store.message_seqs(sid, lower=5, upper=20)),
            [list(store.subject_seqs(sid, s, lower=3, upper=30)) for s in SUBJECTS],
            [store.last_subject_seq(sid, s, upper=u) for s in SUBJECTS for u in (1, 10, 99)],
            list(store.subjects(sid)), list(store.subjects(sid, "c")),
            list(store.dedupe_entries(sid)),
            [store.get_message(sid, seq) for seq in range(SEQ_LIMIT + 5)],
        ))
    return per_stream, list(store.records()), store.next_stream_id()


@pytest.mark.parametrize("seed", range(12))
def test_the_twin_reads_what_rocksdb_reads(storage: Storage, seed: int) -> None:
    rocks = RocksMessageStore(storage, GroupCommitter(storage))
    memory = MemoryMessageStore()
    rng = random.Random(seed)
    for step in range(60):
        operations = [random_operation(rng) for _ in range(rng.randint(1, 5))]
        for store in (rocks, memory):
            batch = store.batch()
            for operation in operations:
                operation(store, batch)
            store.write(batch)
        assert everything(memory) == everything(rocks), f"reproduce with seed={seed}, step={step}"


# ----------------------------------------------------------------- the RocksDB layout

def u64(*values: int) -> bytes:
    return struct.pack(f">{len(values)}Q", *values)


def test_rocksdb_keys_and_values_are_the_documented_layout(storage: Storage) -> None:
    """keys.py's layouts, written out here so that a change of the on-disk format fails."""
    rocks = RocksMessageStore(storage, GroupCommitter(storage))
    append(rocks, SID, 3, "a.b")

    def fill(batch: StoreBatch) -> None:
        batch.put_subject(SID, "a.b", count=1, last_seq=3)
        batch.put_dedupe(SID, "m1", seq=3, ts_ms=1234)
        batch.put_record("orders", b"record")
        batch.put_next_stream_id(9)

    write(rocks, fill)

    def dump(cf: str) -> list[tuple[bytes, bytes]]:
        return list(storage.scan(cf, lower=b"", upper=b"\xff" * 20))

    assert dump(CF_MESSAGES) == [(u64(SID, 3), b"v3")]
    assert dump(CF_SUBJECTS) == [(u64(SID) + b"ia.b\x00" + u64(3), b""),
                                 (u64(SID) + b"sa.b", u64(1, 3))]
    assert dump(CF_DEDUPE) == [(u64(SID) + b"m1", u64(3, 1234))]
    assert dump(CF_STREAM_STATE) == [(b"\x00next_stream_id", u64(9)), (b"orders", b"record")]
