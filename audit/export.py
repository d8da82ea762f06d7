"""`export_node`: one node's RocksDB (read-only, export_source.py) to EXPORT/<node_id>/ in the
layout of schema.py.

The tables are written into EXPORT/.<node_id>.partial.<pid> and that directory is renamed to
EXPORT/<node_id> once the manifest is in it: a partial export never looks complete (readers
skip names starting with a dot). Memory stays near one record batch: messages are scanned in
key order (stream id, seq) and handed to Parquet every `export_writer.batch_rows_max` rows.

Messages whose stream id no stream record holds are exported with a null `stream` (they are
leftovers a divergence check must see, not drop).
"""

from __future__ import annotations

import itertools
import os
import shutil
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pyarrow as pa

from raftlog.audit import schema
from raftlog.audit.export_meta import (
    cluster_fingerprint,
    meta_rows,
    meta_view,
    raft_consumer_rows,
)
from raftlog.audit.export_rows import (
    EpochStarts,
    message_batch,
    rows_batch,
    store_consumer_row,
    stream_row,
)
from raftlog.audit.export_source import ReadOnlyDb, check_not_in_use, locate, open_read_only
from raftlog.audit.export_writer import TableWriter, batch_rows_max
from raftlog.base.clock import Clock
from raftlog.base.subjects import validate_name
from raftlog.internal import storage_pb2
from raftlog.node.engine.storage import CF_CONSUMERS, CF_MESSAGES, CF_STREAM_STATE
from raftlog.raft.replay import ReplayedView

SOURCE_ONLINE = "online"
SOURCE_OFFLINE = "offline"
PARTIAL_MARK = ".partial."
# CONSUMERS rows handed to Parquet at once: one row may hold raft/state_model.py's
# acked_above_floor_max (100,000) acked seqs.
consumer_batch_rows_max = 1_024

_U64 = struct.Struct(">Q")
_RECORDS_LOWER = b"\x01"  # stream_state: stream names; below them the next stream id

Progress = Callable[[str, int], None]  # (table file, rows written so far)


class ExportExists(Exception):
    """EXPORT/<node_id> already holds an export (replace it on purpose)."""


@dataclass
class _Streams:
    """The stream records by name, and the names by stream id."""

    records: dict[str, storage_pb2.StreamRecord] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)


def export_node(source_dir: Path, out_dir: Path, *, node_id: str, source: str, clock: Clock,
                commit_seqs: Mapping[str, int] | None = None, applied_index: int | None = None,
                skip_messages: bool = False, replace: bool = False,
                progress: Progress | None = None) -> schema.Manifest:
    """Exports the node whose data (or database, or checkpoint) directory is `source_dir`
    into `out_dir/<node_id>`. For a node that was running: `commit_seqs` (stream name ->
    commit seq) fill STREAMS' commit_seq, `applied_index` is where its Raft view is replayed to
    (both noted before the checkpoint). `skip_messages` writes MESSAGES without rows (and says
    so in the manifest). Raises SourceError, DatabaseInUse, ExportExists, RaftlogError (a bad
    node id, a corrupt record)."""
    validate_name(node_id, what="node")
    files = locate(source_dir)
    check_not_in_use(files.db_dir)
    final = out_dir / node_id
    check_free(final, replace=replace)
    work = partial_dir(out_dir, node_id)
    try:
        with open_read_only(files.db_dir) as db:
            view = meta_view(db, snapshot=files.snapshot, applied_index=applied_index)
            manifest = _export_tables(db, work, node=node_id, view=view,
                                      commit_seqs=commit_seqs or {}, skip_messages=skip_messages,
                                      progress=progress or _quiet)
        manifest.source = source
        manifest.exported_ms = clock.wall_ms()
        manifest.write(work)
        move_into_place(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return manifest


def _quiet(table: str, rows: int) -> None:
    pass


def check_free(final: Path, *, replace: bool) -> None:
    """Raises ExportExists when `final` holds something and it is not to be replaced."""
    if final.exists() and not replace:
        raise ExportExists(f"{final} already holds an export (--force replaces it)")


def partial_dir(out_dir: Path, node_id: str) -> Path:
    """A new, empty work directory for one node's export, beside where it will go."""
    work = out_dir / f".{node_id}{PARTIAL_MARK}{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return work


def move_into_place(work: Path, final: Path) -> None:
    """Renames the finished export into place (replacing what was there)."""
    old = final.with_name(f".{final.name}.old.{os.getpid()}")
    if final.exists():
        final.rename(old)
    work.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def _export_tables(db: ReadOnlyDb, work: Path, *, node: str, view: ReplayedView,
                   commit_seqs: Mapping[str, int], skip_messages: bool,
                   progress: Progress) -> schema.Manifest:
    streams = _read_streams(db)
    rows: dict[str, int] = {}
    with TableWriter(work / schema.MESSAGES_FILE, schema.MESSAGES) as writer:
        epochs = {} if skip_messages else _write_messages(db, writer, node=node,
                                                          names=streams.names, progress=progress)
        rows[schema.MESSAGES_FILE] = writer.rows
    stream_rows = (stream_row(node=node, name=name, record=record,
                              commit_seq=commit_seqs.get(name),
                              epochs=epochs[record.stream_id].starts()
                              if record.stream_id in epochs else [])
                   for name, record in sorted(streams.records.items()))
    rows[schema.STREAMS_FILE] = _write_rows(work / schema.STREAMS_FILE, schema.STREAMS,
                                            stream_rows, batch_rows=batch_rows_max)
    consumer_rows = itertools.chain(_store_consumer_rows(db, node=node, names=streams.names),
                                    raft_consumer_rows(view, node=node))
    rows[schema.CONSUMERS_FILE] = _write_rows(work / schema.CONSUMERS_FILE, schema.CONSUMERS,
                                              consumer_rows, batch_rows=consumer_batch_rows_max)
    rows[schema.META_FILE] = _write_rows(work / schema.META_FILE, schema.META,
                                         meta_rows(view, node=node), batch_rows=batch_rows_max)
    for table in (schema.STREAMS_FILE, schema.CONSUMERS_FILE, schema.META_FILE):
        progress(table, rows[table])
    return schema.Manifest(
        node=node, source="", exported_ms=0, cluster=cluster_fingerprint(view.state),
        applied_index=view.index, members=sorted(view.state.members), rows=rows,
        skipped=[schema.MESSAGES_FILE] if skip_messages else [])


def _read_streams(db: ReadOnlyDb) -> _Streams:
    streams = _Streams()
    it = db.cf(CF_STREAM_STATE).iter()
    it.seek(_RECORDS_LOWER)
    while it.valid():
        name = bytes(it.key()).decode()
        record = storage_pb2.StreamRecord.FromString(it.value())
        streams.records[name] = record
        streams.names[record.stream_id] = name
        it.next()
    return streams


def _write_messages(db: ReadOnlyDb, writer: TableWriter, *, node: str, names: dict[int, str],
                    progress: Progress) -> dict[int, EpochStarts]:
    """Every stored message, in key order; returns each stream id's epoch starts."""
    epochs: dict[int, EpochStarts] = {}
    items = cast(Iterator[tuple[bytes, bytes]], iter(db.cf(CF_MESSAGES).items()))  # raw mode
    while True:
        chunk = list(itertools.islice(items, batch_rows_max))
        if not chunk:
            break
        batch, changes = message_batch(node=node, names=names, keys=[key for key, _ in chunk],
                                       values=[value for _, value in chunk])
        del chunk
        writer.write(batch)
        for seen in changes:
            epochs.setdefault(seen.stream_id, EpochStarts()).see(epoch=seen.epoch, seq=seen.seq)
        progress(schema.MESSAGES_FILE, writer.rows)
    return epochs


def _store_consumer_rows(db: ReadOnlyDb, *, node: str,
                         names: dict[int, str]) -> Iterator[dict[str, Any]]:
    it = db.cf(CF_CONSUMERS).iter()
    it.seek_to_first()
    while it.valid():
        key = bytes(it.key())
        record = storage_pb2.ConsumerRecord.FromString(it.value())
        yield store_consumer_row(node=node, stream=names.get(_U64.unpack(key[:8])[0]),
                                 record=record)
        it.next()


def _write_rows(path: Path, table: pa.Schema, rows: Iterable[dict[str, Any]], *,
                batch_rows: int) -> int:
    """Writes rows in batches of at most `batch_rows`; returns how many."""
    with TableWriter(path, table) as writer:
        pending: list[dict[str, Any]] = []
        for row in rows:
            pending.append(row)
            if len(pending) >= batch_rows:
                writer.write(rows_batch(pending, table))
                pending = []
        writer.write(rows_batch(pending, table))
        return writer.rows
