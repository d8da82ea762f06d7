"""Stored records to export rows, pure: no database, no files.

- `message_digest`: schema.py's digest of a stored message (epoch left out);
- `message_batch`: a batch of stored messages (the exporter bounds its size) as one Arrow record
  batch of MESSAGES, and where the epochs change along it;
- `EpochStarts`: the first seq stored under each epoch of one stream (the STREAMS `epochs`);
- `stream_row`, `store_consumer_row`: one row of STREAMS and of CONSUMERS (holder "store").
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from raftlog.audit import schema
from raftlog.internal import storage_pb2

HOLDER_STORE = "store"
HOLDER_RAFT = "raft"

_StoredMessage = storage_pb2.StoredMessage


def message_digest(message: storage_pb2.StoredMessage) -> str:
    """SHA-256 hex of the deterministic encoding of the message with `epoch` cleared."""
    copy = _StoredMessage()
    copy.CopyFrom(message)
    copy.ClearField("epoch")
    return _digest_cleared(copy)


def _digest_cleared(message: storage_pb2.StoredMessage) -> str:
    return hashlib.sha256(message.SerializeToString(deterministic=True)).hexdigest()


def message_batch(*, node: str, names: Mapping[int, str], keys: Sequence[bytes],
                  values: Sequence[bytes]) -> tuple[pa.RecordBatch, list[EpochSeen]]:
    """The MESSAGES rows of messages stored under `keys` (stream id, seq; node/engine/keys.py)
    as `values`, in key order; and where the epoch changes along them: (stream id, epoch, seq)
    of each message whose stream id or epoch differs from the one before (the first included).
    A stream id `names` does not hold gets a null stream."""
    count = len(keys)
    unpacked = struct.unpack(f">{2 * count}Q", b"".join(keys))
    stream_ids, seqs = unpacked[0::2], unpacked[1::2]
    epochs: list[int] = []
    subjects: list[str] = []
    ts_ms: list[int] = []
    sizes: list[int] = []
    msg_ids: list[str] = []
    digests: list[str] = []
    digest_keys: list[int] = []
    parse, sha256 = _StoredMessage.FromString, hashlib.sha256
    from_bytes, key_bytes = int.from_bytes, schema.DIGEST_KEY_BYTES
    for value in values:  # the hot loop: one parse, five fields, one digest per message
        message = parse(value)
        epochs.append(message.epoch)
        subjects.append(message.subject)
        ts_ms.append(message.ts_ms)
        sizes.append(len(message.payload))
        msg_ids.append(message.msg_id)
        message.ClearField("epoch")
        digest = sha256(message.SerializeToString(deterministic=True)).digest()
        digests.append(digest.hex())
        digest_keys.append(from_bytes(digest[:key_bytes], "big", signed=True))
    streams: list[str | None] = []
    for stream_id, run in itertools.groupby(stream_ids):
        streams.extend(itertools.repeat(names.get(stream_id), sum(1 for _ in run)))
    columns: list[Any] = [[node] * count, streams, stream_ids, seqs, epochs, subjects, ts_ms,
                          sizes, msg_ids, digests, digest_keys]
    batch = pa.RecordBatch.from_arrays(
        [pa.array(values, type=column.type) for values, column in
         zip(columns, schema.MESSAGES, strict=True)], schema=schema.MESSAGES)
    return batch, _epoch_changes(stream_ids, seqs, epochs)


def _epoch_changes(stream_ids: Sequence[int], seqs: Sequence[int],
                   epochs: Sequence[int]) -> list[EpochSeen]:
    changes: list[EpochSeen] = []
    last: tuple[int, int] | None = None
    for stream_id, seq, epoch in zip(stream_ids, seqs, epochs, strict=True):
        if (stream_id, epoch) != last:
            last = (stream_id, epoch)
            changes.append(EpochSeen(stream_id=stream_id, epoch=epoch, seq=seq))
    return changes


@dataclass(frozen=True, slots=True)
class EpochSeen:
    stream_id: int
    epoch: int
    seq: int


class EpochStarts:
    """The first seq stored under each epoch, for one stream's messages seen in seq order."""

    def __init__(self) -> None:
        self._first: dict[int, int] = {}
        self._last_epoch: int | None = None

    def see(self, *, epoch: int, seq: int) -> None:
        if epoch != self._last_epoch:
            self._last_epoch = epoch
            self._first.setdefault(epoch, seq)

    def starts(self) -> list[dict[str, int]]:
        """[{epoch, start_seq}], by epoch ascending."""
        return [{"epoch": epoch, "start_seq": seq} for epoch, seq in sorted(self._first.items())]


def stream_row(*, node: str, name: str, record: storage_pb2.StreamRecord,
               commit_seq: int | None, epochs: list[dict[str, int]]) -> dict[str, Any]:
    return {
        "node": node, "stream": name, "stream_id": record.stream_id,
        "first_seq": record.first_seq, "last_seq": record.last_seq, "commit_seq": commit_seq,
        "epoch": record.epoch, "fenced_epoch": record.fenced_epoch,
        "last_epoch": record.last_epoch, "messages": record.messages, "bytes": record.bytes,
        "created_ms": record.created_ms, "epochs": epochs,
    }


def store_consumer_row(*, node: str, stream: str | None,
                       record: storage_pb2.ConsumerRecord) -> dict[str, Any]:
    return {
        "node": node, "stream": stream, "consumer": record.config.name, "holder": HOLDER_STORE,
        "delivered_seq": record.delivered_seq, "ack_floor": record.ack_floor,
        "acked": sorted(record.acked), "dead_lettered": record.num_dead_lettered,
    }


def rows_batch(rows: list[dict[str, Any]], table: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=table)
