"""The audit export's layout and schemas (version `SCHEMA_VERSION`).

An export is a directory with one subdirectory per node export, named after the node id:

    EXPORT/<node_id>/manifest.json    the `Manifest` (JSON)
    EXPORT/<node_id>/messages.parquet one row per stored message (MESSAGES)
    EXPORT/<node_id>/streams.parquet  one row per stream copy the node holds (STREAMS)
    EXPORT/<node_id>/consumers.parquet consumer state as the node holds it (CONSUMERS)
    EXPORT/<node_id>/meta.parquet     the node's view of the Raft metadata, one row per stream
                                      the metadata knows (META)

Every table has the `node` column, so a reader may take all nodes' files of one table as one
dataset (`EXPORT/*/messages.parquet`). Seqs, epochs and times are int64 (u64 values above 2^63
never occur: limits cap them far lower). Digests are lower-case SHA-256 hex.

`digest` of a message covers everything a replica must hold identically except the epoch,
which has its own column (so "same seq, different epoch" and "same seq, different content" are
told apart): SHA-256 of the deterministic protobuf encoding of the StoredMessage with `epoch`
cleared. `digest_key` is its first 8 bytes as a signed big-endian int64 (`digest_key`): what
the audit compares (a long reads and hashes several times faster than 64 characters; two
different digests share a key with probability 2^-64), the report showing the whole digests.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

SCHEMA_VERSION = 2  # 2: MESSAGES.digest_key
FORMAT = "raftlog-audit-export"
MANIFEST = "manifest.json"
MESSAGES_FILE = "messages.parquet"
STREAMS_FILE = "streams.parquet"
CONSUMERS_FILE = "consumers.parquet"
META_FILE = "meta.parquet"
TABLE_FILES = (MESSAGES_FILE, STREAMS_FILE, CONSUMERS_FILE, META_FILE)

DIGEST_KEY_BYTES = 8


def digest_key(digest: str) -> int:
    """MESSAGES.digest_key of a hex digest."""
    return int.from_bytes(bytes.fromhex(digest[:2 * DIGEST_KEY_BYTES]), "big", signed=True)


EPOCH_START = pa.struct([("epoch", pa.int64()), ("start_seq", pa.int64())])

MESSAGES = pa.schema([
    ("node", pa.string()),
    ("stream", pa.string()),
    ("stream_id", pa.int64()),
    ("seq", pa.int64()),
    ("epoch", pa.int64()),
    ("subject", pa.string()),
    ("ts_ms", pa.int64()),
    ("size", pa.int64()),  # payload bytes
    ("msg_id", pa.string()),
    ("digest", pa.string()),
    ("digest_key", pa.int64()),
])

STREAMS = pa.schema([
    ("node", pa.string()),
    ("stream", pa.string()),
    ("stream_id", pa.int64()),
    ("first_seq", pa.int64()),  # the head: seqs below were purged or dropped by retention
    ("last_seq", pa.int64()),
    # The node's commit seq when exported online; null offline (a stopped node does not know
    # it: at start a copy takes its last seq as committed until the primary says otherwise).
    ("commit_seq", pa.int64()),
    ("epoch", pa.int64()),  # the epoch the node last saw for the stream
    ("fenced_epoch", pa.int64()),
    ("last_epoch", pa.int64()),  # the epoch of the message at last_seq
    ("messages", pa.int64()),
    ("bytes", pa.int64()),
    ("created_ms", pa.int64()),
    # From the stored messages: the first seq held under each epoch, ascending.
    ("epochs", pa.list_(EPOCH_START)),
])

CONSUMERS = pa.schema([
    ("node", pa.string()),
    ("stream", pa.string()),
    ("consumer", pa.string()),
    ("holder", pa.string()),  # "raft": the metadata's copy; "store": the node's own store
    ("delivered_seq", pa.int64()),
    ("ack_floor", pa.int64()),
    ("acked", pa.list_(pa.int64())),  # acknowledged above the floor, ascending
    ("dead_lettered", pa.int64()),
])

META = pa.schema([
    ("node", pa.string()),
    ("stream", pa.string()),
    ("stream_id", pa.int64()),
    ("primary", pa.string()),
    ("replicas", pa.list_(pa.string())),  # the primary included
    ("fence_epoch", pa.int64()),
    ("epoch_start_seq", pa.int64()),
    ("epoch_history", pa.list_(EPOCH_START)),  # (epoch, start seq), newest last
    ("applied_index", pa.int64()),  # the Raft index this view is at
])

SCHEMAS: dict[str, pa.Schema] = {
    MESSAGES_FILE: MESSAGES, STREAMS_FILE: STREAMS, CONSUMERS_FILE: CONSUMERS, META_FILE: META,
}


@dataclass
class Manifest:
    """What a node export is: which node, cluster, moment and source, and its row counts."""

    node: str
    source: str  # "online" (a checkpoint of a running node) or "offline" (a data directory)
    exported_ms: int
    # Identifies the cluster: SHA-256 hex of "<node id>\n<joined_ms>" of the member that joined
    # first (smallest joined_ms, then id) in the node's Raft metadata view ("" when the view
    # holds no member). Exports of two clusters never share it; exports of one cluster differ
    # only if that first member left between the nodes' views.
    cluster: str
    applied_index: int  # the Raft index of the metadata view
    members: list[str] = field(default_factory=list)  # node ids in the metadata
    rows: dict[str, int] = field(default_factory=dict)  # per table file
    # Table files written without rows on request (an online export with skip_messages): their
    # emptiness says nothing about the node.
    skipped: list[str] = field(default_factory=list)
    format: str = FORMAT
    schema_version: int = SCHEMA_VERSION

    def write(self, directory: Path) -> None:
        text = json.dumps(asdict(self), indent=2, sort_keys=True)
        (directory / MANIFEST).write_text(text + "\n", encoding="utf-8")

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        """Raises ValueError for a file that is not a manifest of this format."""
        raw: Any = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ValueError(f"{directory / MANIFEST}: not a raftlog audit export manifest")
        known = {name for name in cls.__dataclass_fields__}
        return cls(**{key: value for key, value in raw.items() if key in known})
