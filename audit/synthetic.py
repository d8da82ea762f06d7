"""Synthetic exports in the layout of `schema.py`, for the audit's tests and its benchmark.

`write_node` writes one node's export: the four tables (messages streamed in record batches, so
a 10M-row export never sits in memory) and the manifest, with row counts. `digests` makes
deterministic SHA-256-shaped hex digests for a run of seqs without hashing in Python, so every
replica of a generated stream gets the same digest for the same (stream, seq).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raftlog.audit import schema
from raftlog.audit.export_writer import TableWriter
from raftlog.audit.schema import Manifest

digest_bytes = 32

_NIBBLE = np.zeros(256, dtype=np.uint8)
_NIBBLE[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16, dtype=np.uint8)
_HEX_PAIRS = np.array([f"{value:02x}".encode() for value in range(256)], dtype="S2")


def digests(*, stream_index: int, first_seq: int, count: int) -> pa.Array:
    """`count` lower-case 64-hex-character digests, a function of (stream_index, first_seq)."""
    rng = np.random.default_rng([stream_index, first_seq])
    raw = rng.integers(0, 256, size=(count, digest_bytes), dtype=np.uint8)
    hex_bytes = np.ascontiguousarray(_HEX_PAIRS[raw])
    # Straight from buffers: one array whatever `count` (pa.array on a long numpy bytes
    # array answers with a chunked array).
    offsets = np.arange(0, (count + 1) * 2 * digest_bytes, 2 * digest_bytes, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), count, [None, pa.py_buffer(offsets),
                                                      pa.py_buffer(hex_bytes)])


def digest_keys(digest: pa.Array) -> pa.Array:
    """MESSAGES.digest_key of each hex digest (vectorised for 64-character digests)."""
    width = 2 * digest_bytes
    offsets = np.frombuffer(digest.buffers()[1], dtype=np.int32)[
        digest.offset:digest.offset + len(digest) + 1]
    if digest.null_count or not np.all(np.diff(offsets) == width):
        return pa.array([None if value is None else schema.digest_key(value)
                         for value in digest.to_pylist()], type=pa.int64())
    text = np.frombuffer(digest.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
    nibbles = _NIBBLE[text.reshape(len(digest), width)[:, :2 * schema.DIGEST_KEY_BYTES]]
    key_bytes = np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2])
    return pa.array(key_bytes.view(">i8").ravel().astype(np.int64))


def message_batch(*, node: str, stream: str, stream_id: int, seqs: np.ndarray,
                  epochs: np.ndarray, digest: pa.Array, ts_ms_base: int = 1_700_000_000_000
                  ) -> pa.RecordBatch:
    count = len(seqs)
    return pa.RecordBatch.from_arrays([
        pa.array(np.full(count, node, dtype=object), type=pa.string()),
        pa.array(np.full(count, stream, dtype=object), type=pa.string()),
        pa.array(np.full(count, stream_id, dtype=np.int64)),
        pa.array(seqs.astype(np.int64)),
        pa.array(epochs.astype(np.int64)),
        pa.array(np.full(count, f"{stream}.events", dtype=object), type=pa.string()),
        pa.array(ts_ms_base + seqs.astype(np.int64)),
        pa.array(np.full(count, 128, dtype=np.int64)),
        pa.array(np.full(count, "", dtype=object), type=pa.string()),
        digest,
        digest_keys(digest),
    ], schema=schema.MESSAGES)


def table(rows: Sequence[Mapping[str, Any]], arrow_schema: pa.Schema) -> pa.Table:
    """Rows as dicts, missing columns null (a message's `digest_key` from its digest)."""
    records = [dict(row) for row in rows]
    if arrow_schema is schema.MESSAGES:
        for record in records:
            if record.get("digest_key") is None and record.get("digest"):
                record["digest_key"] = schema.digest_key(record["digest"])
    return pa.Table.from_pylist(records, schema=arrow_schema)


def write_node(directory: Path, *, manifest: Manifest,
               messages: Iterable[pa.RecordBatch] | Sequence[Mapping[str, Any]] = (),
               streams: Sequence[Mapping[str, Any]] = (),
               consumers: Sequence[Mapping[str, Any]] = (),
               meta: Sequence[Mapping[str, Any]] = ()) -> Manifest:
    """Writes one node's export under `directory` (created); returns the manifest written,
    its `rows` filled in."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = {schema.MESSAGES_FILE: _write_messages(directory / schema.MESSAGES_FILE, messages)}
    for name, records in ((schema.STREAMS_FILE, streams), (schema.CONSUMERS_FILE, consumers),
                          (schema.META_FILE, meta)):
        data = table(records, schema.SCHEMAS[name])
        pq.write_table(data, directory / name)
        rows[name] = data.num_rows
    manifest.rows = rows
    manifest.write(directory)
    return manifest


def _write_messages(path: Path,
                    messages: Iterable[pa.RecordBatch] | Sequence[Mapping[str, Any]]) -> int:
    with TableWriter(path, schema.MESSAGES) as writer:  # as the exporter writes them
        for item in _batches(messages):
            writer.write(item)
    return writer.rows


def _batches(messages: Iterable[pa.RecordBatch] | Sequence[Mapping[str, Any]]
             ) -> Iterable[pa.RecordBatch]:
    if isinstance(messages, Sequence) and messages and isinstance(messages[0], Mapping):
        yield from table(messages, schema.MESSAGES).to_batches()
        return
    for item in messages:
        if not isinstance(item, pa.RecordBatch):
            raise TypeError("messages: record batches or rows as dicts, not a mix")
        yield item
