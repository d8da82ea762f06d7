"""`MessageStore` (store.py) on the node's RocksDB (storage.py), in the key layouts of keys.py.

Column families: messages (values), subjects (the index and the summaries), dedupe,
stream_state (records, the next stream id); `delete_stream` also clears the stream's range of
consumers. `durable()` is the group commit's: one fsync covers every write made before it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from rocksdict import ColumnFamily, Rdict, WriteBatch

from raftlog.base.errors import InvariantViolation
from raftlog.node.engine import keys
from raftlog.node.engine.storage import (
    CF_CONSUMERS,
    CF_DEDUPE,
    CF_MESSAGES,
    CF_STREAM_STATE,
    CF_SUBJECTS,
    GroupCommitter,
    Storage,
)
from raftlog.node.engine.store import StoreBatch

_RECORDS_LOWER, _RECORDS_UPPER = b"\x01", b"\xff"  # stream names; below: the next stream id


@dataclass(frozen=True, slots=True)
class _Handles:
    messages: ColumnFamily
    subjects: ColumnFamily
    dedupe: ColumnFamily
    stream_state: ColumnFamily
    consumers: ColumnFamily


class RocksBatch:
    """A `StoreBatch` over one rocksdict WriteBatch."""

    __slots__ = ("_cf", "raw", "written")

    def __init__(self, raw: WriteBatch, handles: _Handles) -> None:
        self.raw = raw
        self._cf = handles
        self.written = False

    def is_empty(self) -> bool:
        empty: bool = self.raw.is_empty()
        return empty

    def append(self, stream_id: int, *, first_seq: int, values: Sequence[bytes],
               subject_refs: Sequence[bytes]) -> None:
        # The publishing hot path: per message one pack and two puts, nothing else.
        put, pack = self.raw.put, keys.pack_u64
        messages_cf, subjects_cf = self._cf.messages, self._cf.subjects
        prefix = keys.stream_prefix(stream_id)
        seq = first_seq
        for value, ref in zip(values, subject_refs, strict=True):
            seq_key = pack(seq)
            put(prefix + seq_key, value, messages_cf)
            put(ref + seq_key, b"", subjects_cf)
            seq += 1

    def delete_message(self, stream_id: int, seq: int, *, subject: str) -> None:
        self.raw.delete(keys.message_key(stream_id, seq), self._cf.messages)
        self.raw.delete(keys.index_key(stream_id, subject, seq), self._cf.subjects)

    def put_subject(self, stream_id: int, subject: str, *, count: int, last_seq: int) -> None:
        self.raw.put(keys.summary_key(stream_id, subject), keys.pair(count, last_seq),
                     self._cf.subjects)

    def delete_subject(self, stream_id: int, subject: str) -> None:
        self.raw.delete(keys.summary_key(stream_id, subject), self._cf.subjects)

    def put_dedupe(self, stream_id: int, msg_id: str, *, seq: int, ts_ms: int) -> None:
        self.raw.put(keys.dedupe_key(stream_id, msg_id), keys.pair(seq, ts_ms), self._cf.dedupe)

    def delete_dedupe(self, stream_id: int, msg_id: str) -> None:
        self.raw.delete(keys.dedupe_key(stream_id, msg_id), self._cf.dedupe)

    def _drop(self, stream_id: int, *cfs: ColumnFamily) -> None:
        lower, upper = keys.stream_prefix(stream_id), keys.stream_end(stream_id)
        for cf in cfs:
            self.raw.delete_range(lower, upper, cf)

    def drop_messages(self, stream_id: int) -> None:
        self._drop(stream_id, self._cf.messages, self._cf.subjects)

    def drop_dedupe(self, stream_id: int) -> None:
        self._drop(stream_id, self._cf.dedupe)

    def put_record(self, name: str, value: bytes) -> None:
        self.raw.put(name.encode(), value, self._cf.stream_state)

    def put_next_stream_id(self, stream_id: int) -> None:
        self.raw.put(keys.NEXT_STREAM_ID_KEY, keys.u64(stream_id), self._cf.stream_state)

    def delete_stream(self, stream_id: int, name: str) -> None:
        self._drop(stream_id, self._cf.messages, self._cf.subjects, self._cf.dedupe,
                   self._cf.consumers)
        self.raw.delete(name.encode(), self._cf.stream_state)


class RocksMessageStore:
    """The streams in the node's RocksDB; writes are unsynced until the group commit."""

    def __init__(self, storage: Storage, committer: GroupCommitter) -> None:
        self._storage = storage
        self._committer = committer
        self._handles = _Handles(
            messages=storage.handle(CF_MESSAGES), subjects=storage.handle(CF_SUBJECTS),
            dedupe=storage.handle(CF_DEDUPE), stream_state=storage.handle(CF_STREAM_STATE),
            consumers=storage.handle(CF_CONSUMERS))
        self._messages: Rdict = storage.view(CF_MESSAGES)

    # ----------------------------------------------------------------- reads

    def get_message(self, stream_id: int, seq: int) -> bytes | None:
        value: bytes | None = self._messages.get(keys.message_key(stream_id, seq))
        return value

    def messages(self, stream_id: int, *, lower: int, upper: int) -> Iterator[tuple[int, bytes]]:
        if lower >= upper:
            return
        seq_of = keys.message_seq
        for key, value in self._storage.scan(CF_MESSAGES, lower=keys.message_key(stream_id, lower),
                                             upper=keys.message_key(stream_id, upper)):
            yield seq_of(key), value

    def message_seqs(self, stream_id: int, *, lower: int, upper: int) -> Iterator[int]:
        if lower >= upper:
            return
        for key in self._storage.scan_keys(CF_MESSAGES, lower=keys.message_key(stream_id, lower),
                                           upper=keys.message_key(stream_id, upper)):
            yield keys.message_seq(key)

    def subject_seqs(self, stream_id: int, subject: str, *, lower: int,
                     upper: int) -> Iterator[int]:
        if lower >= upper:
            return
        for key in self._storage.scan_keys(
                CF_SUBJECTS, lower=keys.index_key(stream_id, subject, lower),
                upper=keys.index_key(stream_id, subject, upper)):
            yield keys.index_seq(key)

    def last_subject_seq(self, stream_id: int, subject: str, *, upper: int) -> int | None:
        key = self._storage.last_key(CF_SUBJECTS, lower=keys.index_prefix(stream_id, subject),
                                     upper=keys.index_key(stream_id, subject, upper))
        return keys.index_seq(key) if key else None

    def subjects(self, stream_id: int, prefix: str = "") -> Iterator[tuple[str, int, int]]:
        start = keys.summary_prefix(stream_id, prefix)
        for key, value in self._storage.scan(CF_SUBJECTS, lower=start,
                                             upper=keys.prefix_end(start)):
            count, last_seq = keys.read_pair(value)
            yield keys.summary_subject(key), count, last_seq

    def dedupe_entries(self, stream_id: int) -> Iterator[tuple[str, int, int]]:
        for key, value in self._storage.scan(CF_DEDUPE, lower=keys.stream_prefix(stream_id),
                                             upper=keys.stream_end(stream_id)):
            seq, ts_ms = keys.read_pair(value)
            yield keys.dedupe_msg_id(key), seq, ts_ms

    def records(self) -> Iterator[tuple[str, bytes]]:
        for key, value in self._storage.scan(CF_STREAM_STATE, lower=_RECORDS_LOWER,
                                             upper=_RECORDS_UPPER):
            yield key.decode(), value

    def next_stream_id(self) -> int:
        raw = self._storage.get(CF_STREAM_STATE, keys.NEXT_STREAM_ID_KEY)
        return keys.read_u64(raw) if raw else 1

    # ----------------------------------------------------------------- writes

    def subject_ref(self, stream_id: int, subject: str) -> bytes:
        return keys.index_prefix(stream_id, subject)

    def batch(self) -> RocksBatch:
        return RocksBatch(self._storage.batch(), self._handles)

    def write(self, batch: StoreBatch) -> None:
        if not isinstance(batch, RocksBatch) or batch.written:
            raise InvariantViolation("a batch is written once, by the store that made it")
        batch.written = True
        self._storage.write(batch.raw)

    async def durable(self) -> None:
        await self._committer.durable()
