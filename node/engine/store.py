"""Where the streams of a node are kept: the `MessageStore` protocol, with `StoreBatch`, the
atomic unit of writing to it.

Implementations: `RocksMessageStore` (rocks_store.py, the node's RocksDB; its key layouts in
keys.py) and `MemoryMessageStore` (memory_store.py, the in-memory twin for tests). Streams
(stream_*.py) and the engine (streams.py) see only this protocol.

What is stored, per stream (by its numeric `stream_id`):
- messages: seq -> value, the engine's encoding of a message (a `StoredMessage`);
- the subject index: the seqs of each subject (kept with the messages: `append` and
  `delete_message` change both);
- subject summaries: subject -> (count, last seq), written by the engine as it counts;
- the dedupe window: msg_id -> (seq, ts_ms);
and per node: stream records, name -> value (a `StreamRecord`), and the next stream id.

Contract every implementation keeps:
- Values are opaque bytes: the store never decodes one; a read returns the bytes written.
- Seq ranges are half-open, `[lower, upper)`; every iteration is in ascending order (seqs,
  or subjects and msg_ids in the byte order of their UTF-8 encoding).
- Writes go into a `StoreBatch` and nothing of it is visible until `write(batch)`, which applies
  the whole batch at once, its operations in the order they were added (a put after a drop of
  the same stream stays). A batch is written at most once.
- `write` does not wait for the disk: what it applied is durable once a `durable()` that started
  after it returns (RocksDB: one group-commit fsync shared by every write before it; in memory:
  at once). A crash may lose writes that no `durable()` covered, never part of a batch.
- Iterators are read on the event loop thread and may not outlive a write to the same stream.
- Nothing here checks the engine's rules (seqs without gaps, counts that agree with the index):
  the engine keeps them; the store keeps what it is told.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol


class StoreBatch(Protocol):
    """Writes to apply together (see `MessageStore.write`)."""

    def is_empty(self) -> bool:
        """True when nothing was added."""
        ...

    def append(self, stream_id: int, *, first_seq: int, values: Sequence[bytes],
               subject_refs: Sequence[bytes]) -> None:
        """Stores values[i] at seq first_seq + i and indexes it under subject_refs[i] (from
        `MessageStore.subject_ref` for the same stream); both sequences have one item per
        message. A run of messages in one call: the publishing path's batch stays a batch."""
        ...

    def delete_message(self, stream_id: int, seq: int, *, subject: str) -> None:
        """Removes the message at seq and its entry in the index of `subject`."""
        ...

    def put_subject(self, stream_id: int, subject: str, *, count: int, last_seq: int) -> None:
        """Sets the summary of `subject`."""
        ...

    def delete_subject(self, stream_id: int, subject: str) -> None:
        """Removes the summary of `subject` (a missing one is not an error)."""
        ...

    def put_dedupe(self, stream_id: int, msg_id: str, *, seq: int, ts_ms: int) -> None: ...

    def delete_dedupe(self, stream_id: int, msg_id: str) -> None: ...

    def drop_messages(self, stream_id: int) -> None:
        """Removes every message, index entry and subject summary of the stream."""
        ...

    def drop_dedupe(self, stream_id: int) -> None:
        """Removes the stream's whole dedupe window."""
        ...

    def put_record(self, name: str, value: bytes) -> None:
        """Sets the record of the stream called `name`."""
        ...

    def put_next_stream_id(self, stream_id: int) -> None: ...

    def delete_stream(self, stream_id: int, name: str) -> None:
        """Removes everything of the stream: messages, index, summaries, dedupe window, its
        record, and whatever else the node keeps under its id (RocksDB: consumer records)."""
        ...


class MessageStore(Protocol):
    """The streams of one node (see the module docstring for the contract)."""

    # ----------------------------------------------------------------- reads

    def get_message(self, stream_id: int, seq: int) -> bytes | None:
        """The value stored at seq, or None."""
        ...

    def messages(self, stream_id: int, *, lower: int, upper: int) -> Iterator[tuple[int, bytes]]:
        """(seq, value) of the messages stored in [lower, upper)."""
        ...

    def message_seqs(self, stream_id: int, *, lower: int, upper: int) -> Iterator[int]:
        """Seqs of the messages stored in [lower, upper) (values not read)."""
        ...

    def subject_seqs(self, stream_id: int, subject: str, *, lower: int,
                     upper: int) -> Iterator[int]:
        """Seqs in [lower, upper) indexed under the literal `subject`."""
        ...

    def last_subject_seq(self, stream_id: int, subject: str, *, upper: int) -> int | None:
        """The greatest seq below `upper` indexed under `subject`, or None."""
        ...

    def subjects(self, stream_id: int, prefix: str = "") -> Iterator[tuple[str, int, int]]:
        """(subject, count, last seq) of every summary whose subject starts with `prefix`."""
        ...

    def dedupe_entries(self, stream_id: int) -> Iterator[tuple[str, int, int]]:
        """(msg_id, seq, ts_ms) of the stream's dedupe window."""
        ...

    def records(self) -> Iterator[tuple[str, bytes]]:
        """(name, value) of every stream record, by name."""
        ...

    def next_stream_id(self) -> int:
        """The last id given to `put_next_stream_id`; 1 when none was."""
        ...

    # ----------------------------------------------------------------- writes

    def subject_ref(self, stream_id: int, subject: str) -> bytes:
        """What `StoreBatch.append` indexes a message of `subject` of this stream under. Made
        once per subject and reused (RocksDB: the index key prefix), so that the publishing
        path encodes nothing per message for it. Valid for this stream and store only."""
        ...

    def batch(self) -> StoreBatch:
        """An empty batch for `write`."""
        ...

    def write(self, batch: StoreBatch) -> None:
        """Applies the batch (made by this store's `batch()`) atomically; not yet durable."""
        ...

    async def durable(self) -> None:
        """Returns once every write made before the call is durable."""
        ...
