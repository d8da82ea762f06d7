"""The node's view of the Raft metadata, for the export: the snapshot file, then the journal's
committed entries replayed read-only (raft/replay.py); its META rows, its CONSUMERS rows
(holder "raft": the consumer progress the metadata holds), the cluster fingerprint and members
of the manifest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from raftlog.audit.export_rows import HOLDER_RAFT
from raftlog.audit.export_source import ReadOnlyDb
from raftlog.node.engine.storage import CF_RAFT_LOG, CF_RAFT_META
from raftlog.raft.replay import ReplayedView, replay
from raftlog.raft.state_model import MetaState


def meta_view(db: ReadOnlyDb, *, snapshot: Path | None,
              applied_index: int | None = None) -> ReplayedView:
    """The view up to `applied_index` (online: the node's, noted before the checkpoint), or up
    to the commit index the journal stored (offline; up to a second behind what it applied)."""
    return replay(log=db.cf(CF_RAFT_LOG), meta=db.cf(CF_RAFT_META), snapshot_path=snapshot,
                  commit_index=applied_index)


def cluster_fingerprint(state: MetaState) -> str:
    """schema.py's `Manifest.cluster`: SHA-256 hex of "<node id>\\n<joined_ms>" of the member
    that joined first (ties: the smaller id); "" when the view holds no member."""
    if not state.members:
        return ""
    first = min(state.members.values(), key=lambda member: (member.joined_ms, member.node_id))
    return hashlib.sha256(f"{first.node_id}\n{first.joined_ms}".encode()).hexdigest()


def meta_rows(view: ReplayedView, *, node: str) -> Iterator[dict[str, Any]]:
    """One META row per stream the metadata knows, by name."""
    streams = view.state.streams
    for name in sorted(streams):
        stream = streams[name]
        yield {
            "node": node, "stream": name, "stream_id": stream.stream_id,
            "primary": stream.primary, "replicas": list(stream.replicas),
            "fence_epoch": stream.fence_epoch, "epoch_start_seq": stream.epoch_start_seq,
            "epoch_history": [{"epoch": epoch, "start_seq": start_seq}
                              for epoch, start_seq in stream.epoch_history],
            "applied_index": view.index,
        }


def raft_consumer_rows(view: ReplayedView, *, node: str) -> Iterator[dict[str, Any]]:
    """One CONSUMERS row (holder "raft") per consumer in the metadata, by stream and name.
    The metadata keeps no dead-letter count: that column is null."""
    consumers = view.state.consumers
    for stream in sorted(consumers):
        for name in sorted(consumers[stream]):
            consumer = consumers[stream][name]
            yield {
                "node": node, "stream": stream, "consumer": name, "holder": HOLDER_RAFT,
                "delivered_seq": consumer.delivered_seq, "ack_floor": consumer.ack_floor,
                "acked": sorted(consumer.acked), "dead_lettered": None,
            }
