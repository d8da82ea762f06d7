"""`MemoryMessageStore`, the in-memory twin of `MessageStore` (store.py), for tests: the same
contract, no disk. A write is durable at once; a batch is a list of operations applied in order
when written, so reads see nothing of a batch before `write`, as with RocksDB.

Not for production: ranges are found by bisecting sorted lists, deletions cost O(n).
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raftlog.base.errors import InvariantViolation
from raftlog.node.engine.store import MessageStore, StoreBatch

_STREAM_ID = struct.Struct(">Q")


@dataclass
class _Stream:
    """Everything one stream keeps in the store."""

    messages: dict[int, bytes] = field(default_factory=dict)
    seqs: list[int] = field(default_factory=list)  # the keys of `messages`, ascending
    index: dict[str, list[int]] = field(default_factory=dict)  # subject -> seqs, ascending
    summaries: dict[str, tuple[int, int]] = field(default_factory=dict)  # (count, last seq)
    dedupe: dict[str, tuple[int, int]] = field(default_factory=dict)  # (seq, ts_ms)


def _insert(seqs: list[int], seq: int) -> None:
    at = bisect.bisect_left(seqs, seq)
    if at == len(seqs) or seqs[at] != seq:
        seqs.insert(at, seq)


def _remove(seqs: list[int], seq: int) -> None:
    at = bisect.bisect_left(seqs, seq)
    if at < len(seqs) and seqs[at] == seq:
        del seqs[at]


def _between(seqs: list[int], lower: int, upper: int) -> list[int]:
    """A copy of the seqs in [lower, upper)."""
    return seqs[bisect.bisect_left(seqs, lower):bisect.bisect_left(seqs, upper)]


Operation = Callable[["MemoryMessageStore"], object]


class MemoryBatch:
    """A `StoreBatch` as a list of operations on a `MemoryMessageStore`."""

    def __init__(self) -> None:
        self.operations: list[Operation] = []
        self.written = False

    def is_empty(self) -> bool:
        return not self.operations

    def append(self, stream_id: int, *, first_seq: int, values: Sequence[bytes],
               subject_refs: Sequence[bytes]) -> None:
        if len(values) != len(subject_refs):
            raise InvariantViolation("append takes one subject ref per value")
        values, refs = list(values), list(subject_refs)
        self.operations.append(lambda store: store.apply_append(stream_id, first_seq, values, refs))

    def delete_message(self, stream_id: int, seq: int, *, subject: str) -> None:
        self.operations.append(lambda store: store.apply_delete_message(stream_id, seq, subject))

    def put_subject(self, stream_id: int, subject: str, *, count: int, last_seq: int) -> None:
        def put(store: MemoryMessageStore) -> None:
            store.stream(stream_id).summaries[subject] = (count, last_seq)
        self.operations.append(put)

    def delete_subject(self, stream_id: int, subject: str) -> None:
        self.operations.append(lambda store: store.stream(stream_id).summaries.pop(subject, None))

    def put_dedupe(self, stream_id: int, msg_id: str, *, seq: int, ts_ms: int) -> None:
        def put(store: MemoryMessageStore) -> None:
            store.stream(stream_id).dedupe[msg_id] = (seq, ts_ms)
        self.operations.append(put)

    def delete_dedupe(self, stream_id: int, msg_id: str) -> None:
        self.operations.append(lambda store: store.stream(stream_id).dedupe.pop(msg_id, None))

    def drop_messages(self, stream_id: int) -> None:
        def drop(store: MemoryMessageStore) -> None:
            kept = store.stream(stream_id).dedupe
            store.streams[stream_id] = _Stream(dedupe=kept)
        self.operations.append(drop)

    def drop_dedupe(self, stream_id: int) -> None:
        self.operations.append(lambda store: store.stream(stream_id).dedupe.clear())

    def put_record(self, name: str, value: bytes) -> None:
        def put(store: MemoryMessageStore) -> None:
            store.stream_records[name] = value
        self.operations.append(put)

    def put_next_stream_id(self, stream_id: int) -> None:
        def put(store: MemoryMessageStore) -> None:
            store.last_next_stream_id = stream_id
        self.operations.append(put)

    def delete_stream(self, stream_id: int, name: str) -> None:
        def delete(store: MemoryMessageStore) -> None:
            store.streams.pop(stream_id, None)
            store.stream_records.pop(name, None)
        self.operations.append(delete)


class MemoryMessageStore:
    """In-memory twin of `MessageStore`. `writes` counts the batches written, `durables` the
    calls of `durable()`, for tests that check batching."""

    def __init__(self) -> None:
        self.streams: dict[int, _Stream] = {}
        self.stream_records: dict[str, bytes] = {}
        self.last_next_stream_id = 1
        self.writes = 0
        self.durables = 0

    def stream(self, stream_id: int) -> _Stream:
        """The stream's data, created when missing (for writes)."""
        return self.streams.setdefault(stream_id, _Stream())

    def _held(self, stream_id: int) -> _Stream:
        """The stream's data, or an empty one that is not kept (for reads)."""
        return self.streams.get(stream_id) or _Stream()

    # ----------------------------------------------------------------- reads

    def get_message(self, stream_id: int, seq: int) -> bytes | None:
        held = self.streams.get(stream_id)
        return None if held is None else held.messages.get(seq)

    def messages(self, stream_id: int, *, lower: int, upper: int) -> Iterator[tuple[int, bytes]]:
        held = self._held(stream_id)
        for seq in _between(held.seqs, lower, upper):
            value = held.messages.get(seq)
            if value is not None:
                yield seq, value

    def message_seqs(self, stream_id: int, *, lower: int, upper: int) -> Iterator[int]:
        yield from _between(self._held(stream_id).seqs, lower, upper)

    def subject_seqs(self, stream_id: int, subject: str, *, lower: int,
                     upper: int) -> Iterator[int]:
        yield from _between(self._held(stream_id).index.get(subject, []), lower, upper)

    def last_subject_seq(self, stream_id: int, subject: str, *, upper: int) -> int | None:
        seqs = self._held(stream_id).index.get(subject, [])
        at = bisect.bisect_left(seqs, upper)
        return seqs[at - 1] if at else None

    def subjects(self, stream_id: int, prefix: str = "") -> Iterator[tuple[str, int, int]]:
        summaries = self._held(stream_id).summaries
        for subject in sorted(s for s in summaries if s.startswith(prefix)):
            count, last_seq = summaries[subject]
            yield subject, count, last_seq

    def dedupe_entries(self, stream_id: int) -> Iterator[tuple[str, int, int]]:
        dedupe = self._held(stream_id).dedupe
        for msg_id in sorted(dedupe):
            seq, ts_ms = dedupe[msg_id]
            yield msg_id, seq, ts_ms

    def records(self) -> Iterator[tuple[str, bytes]]:
        yield from sorted(self.stream_records.items())

    def next_stream_id(self) -> int:
        return self.last_next_stream_id

    # ----------------------------------------------------------------- writes

    def subject_ref(self, stream_id: int, subject: str) -> bytes:
        return _STREAM_ID.pack(stream_id) + subject.encode()

    def batch(self) -> MemoryBatch:
        return MemoryBatch()

    def write(self, batch: StoreBatch) -> None:
        if not isinstance(batch, MemoryBatch) or batch.written:
            raise InvariantViolation("a batch is written once, by the store that made it")
        batch.written = True
        for operation in batch.operations:
            operation(self)
        self.writes += 1

    async def durable(self) -> None:
        self.durables += 1

    # ----------------------------------------------------------------- applying a batch

    def apply_append(self, stream_id: int, first_seq: int, values: list[bytes],
                     refs: list[bytes]) -> None:
        held = self.stream(stream_id)
        for seq, (value, ref) in enumerate(zip(values, refs, strict=True), start=first_seq):
            (owner,) = _STREAM_ID.unpack_from(ref)
            if owner != stream_id:
                raise InvariantViolation(f"a subject ref of stream {owner} used for {stream_id}")
            held.messages[seq] = value
            _insert(held.seqs, seq)
            _insert(held.index.setdefault(ref[_STREAM_ID.size:].decode(), []), seq)

    def apply_delete_message(self, stream_id: int, seq: int, subject: str) -> None:
        held = self.stream(stream_id)
        if held.messages.pop(seq, None) is not None:
            _remove(held.seqs, seq)
        seqs = held.index.get(subject)
        if seqs is not None:
            _remove(seqs, seq)
            if not seqs:
                del held.index[subject]


if TYPE_CHECKING:
    def _keeps_the_protocol(store: MemoryMessageStore) -> MessageStore:
        return store  # mypy checks here that the twin has the protocol's shape
