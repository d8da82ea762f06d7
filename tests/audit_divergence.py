"""TEST-ONLY: divergences injected into a STOPPED node's RocksDB, for the audit's tests (issue
13: "injects each kind of divergence into stopped nodes' RocksDB through a test-only tool").
Not shipped in the package; never point it at a node that runs (RocksDB's lock refuses it).

Each function opens DATA/db read-write with the engine's own storage, changes one stream (or
one consumer) as little as its kind of divergence needs, keeps what the node itself keeps
consistent with it (the stream record's counters, the per-subject index and summaries), and
closes the database. What each one changes, row by row in an export (audit/schema.py):

- `make_hole`: seq k's message row goes; the streams row's messages, bytes.
- `append_tail`: rows for seqs last+1.. (the current epoch); last_seq, messages, bytes,
  last_epoch.
- `cut_tail`: the rows above a seq go (and their dedupe entries); last_seq, messages, bytes,
  last_epoch. Done on every replica, committed records are lost: a consumer's state can then
  point past the log.
- `change_content`: seq k's payload (its digest, size); bytes.
- `change_epoch`: seq k's epoch (not its digest); epochs (last_epoch when k is the last seq).
- `rewrite_epochs`: the epochs of seqs [lower, upper]; epochs (and last_epoch).
- `move_head`: the rows below the new head go; first_seq, messages, bytes, epochs.
- `set_store_consumer`: the consumer's "store" row in consumers; no message or stream row.
- `add_unknown_stream`: a new streams row and its messages (the metadata has no such stream).

The consumer state the metadata holds lives in the Raft journal and is not changed here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from raftlog.internal import storage_pb2
from raftlog.node.engine import keys
from raftlog.node.engine.rocks_store import RocksBatch, RocksMessageStore
from raftlog.node.engine.storage import CF_CONSUMERS, GroupCommitter, Storage
from raftlog.node.engine.stream_core import stored_size
from raftlog.v1 import consumers_pb2, types_pb2


class _Db:
    """The stopped node's database, read-write, with the engine's message store over it."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.store = RocksMessageStore(storage, GroupCommitter(storage))

    def record(self, stream: str) -> storage_pb2.StreamRecord:
        raw = self.storage.get("stream_state", stream.encode())
        if raw is None:
            raise KeyError(f"no stream {stream!r} in {self.storage.path}")
        return storage_pb2.StreamRecord.FromString(raw)

    def message(self, stream_id: int, seq: int) -> storage_pb2.StoredMessage:
        raw = self.store.get_message(stream_id, seq)
        if raw is None:
            raise KeyError(f"no message at seq {seq} of stream id {stream_id}")
        return storage_pb2.StoredMessage.FromString(raw)

    def put(self, batch: RocksBatch, stream_id: int, seq: int,
            message: storage_pb2.StoredMessage) -> None:
        batch.append(stream_id, first_seq=seq, values=[message.SerializeToString()],
                     subject_refs=[self.store.subject_ref(stream_id, message.subject)])

    def commit(self, batch: RocksBatch, *, stream: str, record: storage_pb2.StreamRecord,
               subjects: Iterable[str]) -> None:
        """Writes `batch`, then the summaries of `subjects` and the record, and fsyncs."""
        self.store.write(batch)
        summaries = self.store.batch()
        for subject in set(subjects):
            seqs = list(self.store.subject_seqs(record.stream_id, subject, lower=0,
                                                upper=keys.SEQ_MAX))
            if seqs:
                summaries.put_subject(record.stream_id, subject, count=len(seqs),
                                      last_seq=seqs[-1])
            else:
                summaries.delete_subject(record.stream_id, subject)
        summaries.put_record(stream, record.SerializeToString())
        self.store.write(summaries)
        self.storage.sync()


@contextlib.contextmanager
def _opened(data_dir: Path) -> Iterator[_Db]:
    if not (data_dir / "db").is_dir():
        raise FileNotFoundError(f"{data_dir}: no node database (db/) here")
    storage = Storage(data_dir)
    try:
        yield _Db(storage)
    finally:
        storage.close()


def make_hole(data_dir: Path, stream: str, *, seq: int) -> None:
    """Deletes the message at `seq` (the head and last seq stay)."""
    with _opened(data_dir) as db:
        record = db.record(stream)
        message = db.message(record.stream_id, seq)
        batch = db.store.batch()
        batch.delete_message(record.stream_id, seq, subject=message.subject)
        record.messages -= 1
        record.bytes -= stored_size(message)
        db.commit(batch, stream=stream, record=record, subjects=[message.subject])


def append_tail(data_dir: Path, stream: str, *, count: int, payload: bytes = b"tail"
                ) -> list[int]:
    """Appends `count` messages after last_seq under the stream's current epoch (the subject
    and time of the last message); returns their seqs. An uncommitted tail, as a primary that
    wrote and lost its lease would leave."""
    with _opened(data_dir) as db:
        record = db.record(stream)
        last = db.message(record.stream_id, record.last_seq)
        batch = db.store.batch()
        seqs = list(range(record.last_seq + 1, record.last_seq + 1 + count))
        for seq in seqs:
            message = storage_pb2.StoredMessage(subject=last.subject, payload=payload,
                                                ts_ms=last.ts_ms, epoch=record.epoch)
            db.put(batch, record.stream_id, seq, message)
            record.messages += 1
            record.bytes += stored_size(message)
        record.last_seq, record.last_epoch = seqs[-1], record.epoch
        db.commit(batch, stream=stream, record=record, subjects=[last.subject])
        return seqs


def cut_tail(data_dir: Path, stream: str, *, after_seq: int) -> list[int]:
    """Removes the messages above `after_seq` (the stream's last seq goes down to it); returns
    their seqs."""
    with _opened(data_dir) as db:
        record = db.record(stream)
        batch = db.store.batch()
        removed, subjects = _delete_messages(db, batch, record, lower=after_seq + 1,
                                             upper=record.last_seq + 1)
        for msg_id, seq, _ in list(db.store.dedupe_entries(record.stream_id)):
            if seq > after_seq:  # as the engine's own truncation does
                batch.delete_dedupe(record.stream_id, msg_id)
        record.last_seq = after_seq
        record.last_epoch = db.message(record.stream_id, after_seq).epoch
        db.commit(batch, stream=stream, record=record, subjects=subjects)
        return removed


def _delete_messages(db: _Db, batch: RocksBatch, record: storage_pb2.StreamRecord, *,
                     lower: int, upper: int) -> tuple[list[int], set[str]]:
    """Deletes the stored messages in [lower, upper) into `batch`, the record's counts
    following; their seqs and subjects."""
    removed: list[int] = []
    subjects: set[str] = set()
    for seq, raw in list(db.store.messages(record.stream_id, lower=lower, upper=upper)):
        message = storage_pb2.StoredMessage.FromString(raw)
        batch.delete_message(record.stream_id, seq, subject=message.subject)
        record.messages -= 1
        record.bytes -= stored_size(message)
        removed.append(seq)
        subjects.add(message.subject)
    return removed, subjects


def change_content(data_dir: Path, stream: str, *, seq: int, payload: bytes) -> None:
    """The message at `seq` gets another payload; its epoch, subject and time stay."""
    with _opened(data_dir) as db:
        record = db.record(stream)
        message = db.message(record.stream_id, seq)
        record.bytes -= stored_size(message)
        message.payload = payload
        record.bytes += stored_size(message)
        batch = db.store.batch()
        db.put(batch, record.stream_id, seq, message)
        db.commit(batch, stream=stream, record=record, subjects=[message.subject])


def change_epoch(data_dir: Path, stream: str, *, seq: int, epoch: int) -> None:
    """The message at `seq` claims another epoch; its content stays."""
    rewrite_epochs(data_dir, stream, lower=seq, upper=seq, epoch=epoch)


def rewrite_epochs(data_dir: Path, stream: str, *, lower: int, upper: int, epoch: int) -> None:
    """Every message stored in [lower, upper] claims `epoch` (a rewritten epoch history)."""
    with _opened(data_dir) as db:
        record = db.record(stream)
        batch = db.store.batch()
        for seq, raw in list(db.store.messages(record.stream_id, lower=lower, upper=upper + 1)):
            message = storage_pb2.StoredMessage.FromString(raw)
            message.epoch = epoch
            db.put(batch, record.stream_id, seq, message)
        if lower <= record.last_seq <= upper:
            record.last_epoch = epoch
        db.commit(batch, stream=stream, record=record, subjects=[])


def move_head(data_dir: Path, stream: str, *, first_seq: int) -> list[int]:
    """Raises the head to `first_seq`: the messages below it go (as retention would have
    dropped them on this copy only); returns their seqs."""
    with _opened(data_dir) as db:
        record = db.record(stream)
        batch = db.store.batch()
        removed, subjects = _delete_messages(db, batch, record, lower=record.first_seq,
                                             upper=first_seq)
        record.first_seq = first_seq
        db.commit(batch, stream=stream, record=record, subjects=subjects)
        return removed


def set_store_consumer(data_dir: Path, stream: str, consumer: str, *, delivered_seq: int,
                       ack_floor: int, acked: Iterable[int] = ()) -> None:
    """Writes the consumer's record in the node's own consumer store (the consumers column
    family), created when the node has none for it (a cluster member keeps consumers in the
    metadata: its store is empty)."""
    with _opened(data_dir) as db:
        record = db.record(stream)
        key = keys.consumer_key(record.stream_id, consumer)
        raw = db.storage.get(CF_CONSUMERS, key)
        value = (storage_pb2.ConsumerRecord() if raw is None
                 else storage_pb2.ConsumerRecord.FromString(raw))
        if raw is None:
            value.config.CopyFrom(consumers_pb2.ConsumerConfig(name=consumer))
        value.delivered_seq, value.ack_floor = delivered_seq, ack_floor
        del value.acked[:]
        value.acked.extend(sorted(acked))
        batch = db.storage.batch()
        batch.put(key, value.SerializeToString(), db.storage.handle(CF_CONSUMERS))
        db.storage.write(batch)
        db.storage.sync()


def add_unknown_stream(data_dir: Path, name: str, *, messages: int) -> int:
    """A stream copy the metadata does not know: a record under a stream id no record here
    holds and `messages` messages (seqs 1.., epoch 1); returns its stream id."""
    with _opened(data_dir) as db:
        # Above every id held here (a cluster member's ids come from the metadata, not from
        # the next stream id it keeps).
        held = [storage_pb2.StreamRecord.FromString(raw).stream_id
                for _, raw in db.store.records()]
        stream_id = max([db.store.next_stream_id(), *(i + 1 for i in held)])
        subject = f"{name}.orphan"
        record = storage_pb2.StreamRecord(
            stream_id=stream_id, config=types_pb2.StreamConfig(name=name, subjects=[f"{name}.>"]),
            first_seq=1, last_seq=messages, epoch=1, last_epoch=1)
        batch = db.store.batch()
        for seq in range(1, messages + 1):
            message = storage_pb2.StoredMessage(subject=subject, payload=b"%d" % seq, epoch=1)
            db.put(batch, stream_id, seq, message)
            record.messages += 1
            record.bytes += stored_size(message)
        batch.put_next_stream_id(stream_id + 1)
        db.commit(batch, stream=name, record=record, subjects=[subject])
        return stream_id
