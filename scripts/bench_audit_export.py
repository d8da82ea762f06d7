"""Audit export benchmark (issue 13, "export rows/s per node"): one stream of --messages
messages (default 1,000,000) written into a tmp RocksDB through node/engine's store (no
cluster), then exported offline (raftlog.audit.export) to Parquet. Reports rows/s of the
export, the Parquet bytes, and the peak RSS of the same export run as the process a node starts
(raftlog.audit.export_child).

A line per phase goes to stderr, ONE JSON document to stdout.

    scripts/bench-audit-export                     1M messages
    scripts/bench-audit-export --messages 100000   a smaller run
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from raftlog.audit import schema
from raftlog.audit.export import SOURCE_OFFLINE, export_node
from raftlog.base.clock import SystemClock
from raftlog.internal import storage_pb2
from raftlog.node.engine.rocks_store import RocksMessageStore
from raftlog.node.engine.storage import GroupCommitter, Storage
from raftlog.v1 import types_pb2

SCHEMA = "raftlog-bench-audit-export/1"
STREAM = "bench"
SUBJECTS = 16  # distinct subjects the messages cycle through
fill_batch_messages = 10_000  # messages per WriteBatch while filling
payload_bytes_default = 100


def _log(text: str) -> None:
    print(f"[bench-audit-export] {text}", file=sys.stderr, flush=True)


def fill(data_dir: Path, *, messages: int, payload_bytes: int) -> None:
    """One stream of `messages` messages (epoch 1, seqs from 1) and its record."""
    storage = Storage(data_dir)
    store = RocksMessageStore(storage, GroupCommitter(storage))
    stream_id, seq, stored_bytes = 1, 1, 0
    payload = b"x" * payload_bytes
    while seq <= messages:
        count = min(fill_batch_messages, messages - seq + 1)
        subjects = [f"bench.s{(seq + k) % SUBJECTS}" for k in range(count)]
        values = [storage_pb2.StoredMessage(subject=subject, payload=payload, ts_ms=seq + k,
                                            epoch=1).SerializeToString()
                  for k, subject in enumerate(subjects)]
        batch = store.batch()
        batch.append(stream_id, first_seq=seq, values=values,
                     subject_refs=[store.subject_ref(stream_id, s) for s in subjects])
        store.write(batch)
        stored_bytes += sum(len(s) + payload_bytes for s in subjects)
        seq += count
    record = storage_pb2.StreamRecord(
        stream_id=stream_id, config=types_pb2.StreamConfig(name=STREAM, subjects=["bench.>"]),
        first_seq=1, last_seq=messages, epoch=1, last_epoch=1, messages=messages,
        bytes=stored_bytes)
    batch = store.batch()
    batch.put_record(STREAM, record.SerializeToString())
    batch.put_next_stream_id(stream_id + 1)
    store.write(batch)
    storage.sync()
    storage.close()


def export_in_child(root: Path) -> tuple[float, float]:
    """The export run by `python -m raftlog.audit.export_child` (as a node runs it): its wall
    seconds (start included) and its peak RSS in MiB."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "raftlog.audit.export_child", "--from",
                    str(root / "n1"), "--out", str(root / "child"), "--node-id", "n1",
                    "--source", "offline"], check=True)
    elapsed_s = time.monotonic() - started
    return elapsed_s, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--payload-bytes", type=int, default=payload_bytes_default)
    parser.add_argument("--dir", type=Path, default=None,
                        help="work directory (default: a temporary one, removed after)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raftlog-bench-audit.", dir=args.dir) as tmp:
        root = Path(tmp)
        started = time.monotonic()
        fill(root / "n1", messages=args.messages, payload_bytes=args.payload_bytes)
        _log(f"filled {args.messages:,} messages in {time.monotonic() - started:.1f} s")
        started = time.monotonic()
        manifest = export_node(root / "n1", root / "export", node_id="n1",
                               source=SOURCE_OFFLINE, clock=SystemClock())
        elapsed_s = time.monotonic() - started
        rows = manifest.rows[schema.MESSAGES_FILE]
        parquet_bytes = sum(p.stat().st_size for p in (root / "export" / "n1").iterdir())
        _log(f"exported {rows:,} rows in {elapsed_s:.1f} s: {rows / elapsed_s:,.0f} rows/s, "
             f"{parquet_bytes / 2**20:.1f} MiB of Parquet")
        child_s, child_rss_mib = export_in_child(root)
        _log(f"the same export as a process of its own (as a node runs it): {child_s:.1f} s "
             f"with its start, peak RSS {child_rss_mib:.0f} MiB")
    result = {
        "schema": SCHEMA, "messages": args.messages, "payload_bytes": args.payload_bytes,
        "export_s": round(elapsed_s, 2), "rows_per_s": round(rows / elapsed_s),
        "parquet_bytes": parquet_bytes, "child_export_s": round(child_s, 2),
        "child_peak_rss_mib": round(child_rss_mib, 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
