"""Reading a stopped node's copy of a stream straight from its RocksDB, after a chaos run: the
bytes it will start from, which must equal what it served while it ran (replicas.py compares
every copy's committed prefix, these included).

The node must be stopped (RocksDB takes a lock). Opening the database replays its WAL as a
node start would; nothing else is written.
"""

from __future__ import annotations

from pathlib import Path

from raftlog.base.clock import SystemClock
from raftlog.chaos.collect import ReplicaCopy
from raftlog.node.engine.rocks_store import RocksMessageStore
from raftlog.node.engine.storage import GroupCommitter, Storage
from raftlog.node.engine.streams import NoConsumers, StreamEngine

stored_bytes_max = 1 << 40  # read a copy whole


def read_stopped_copy(data_dir: Path, stream: str, *, node: str) -> ReplicaCopy | None:
    """Node `node`'s copy of `stream` in `data_dir` (None when it holds none), named
    "<node> (disk)" so that it stands beside the copy the node served."""
    if not (data_dir / "db").exists():
        return None
    storage = Storage(data_dir)
    try:
        engine = StreamEngine(store=RocksMessageStore(storage, GroupCommitter(storage)),
                              clock=SystemClock(), consumers=NoConsumers(), follow_raft=True)
        engine.load()
        copy = engine.streams.get(stream)
        if copy is None:
            return None
        values = copy.stored_values(from_seq=copy.first_seq, to_seq=copy.last_seq,
                                    bytes_max=stored_bytes_max)
        stored = {copy.first_seq + i: value for i, value in enumerate(values) if value}
        return ReplicaCopy(node=f"{node} (disk)", address=str(data_dir),
                           epoch=copy.record.epoch, first_seq=copy.first_seq,
                           last_seq=copy.last_seq, commit_seq=0, stored=stored)
    finally:
        storage.close()
