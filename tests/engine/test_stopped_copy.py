"""chaos/disks.py: a stopped node's copy of a stream read from its database equals what the
node stored while it ran."""

from __future__ import annotations

import asyncio
from pathlib import Path

from raftlog.base.clock import SystemClock
from raftlog.chaos.disks import read_stopped_copy
from raftlog.node.engine.rocks_store import RocksMessageStore
from raftlog.node.engine.storage import GroupCommitter, Storage
from raftlog.node.engine.streams import NoConsumers, StreamEngine
from raftlog.v1 import streams_pb2, types_pb2


def _run_node(data_dir: Path) -> list[bytes]:
    """A node's engine (no Raft) that stores three messages and stops; its stored bytes."""

    async def main() -> list[bytes]:
        storage = Storage(data_dir)
        committer = GroupCommitter(storage)
        committer.start(asyncio.get_running_loop())
        engine = StreamEngine(store=RocksMessageStore(storage, committer), clock=SystemClock(),
                              consumers=NoConsumers())
        try:
            engine.load()
            await engine.create(types_pb2.StreamConfig(name="s", subjects=["a"]))
            await engine.publish("s", [streams_pb2.PublishEntry(subject="a", payload=b"%d" % i)
                                       for i in range(3)])
            stream = engine.get("s")
            return stream.stored_values(from_seq=1, to_seq=stream.last_seq, bytes_max=1 << 20)
        finally:
            await engine.stop()
            committer.stop()
            storage.close()

    return asyncio.run(main())


def test_a_stopped_nodes_copy_reads_back_from_its_disk(tmp_path: Path) -> None:
    served = _run_node(tmp_path / "n1")
    copy = read_stopped_copy(tmp_path / "n1", "s", node="n1")
    assert copy is not None and copy.node == "n1 (disk)"
    assert (copy.first_seq, copy.last_seq) == (1, 3)
    assert [copy.stored[seq] for seq in (1, 2, 3)] == served
    assert read_stopped_copy(tmp_path / "n1", "other", node="n1") is None
    assert read_stopped_copy(tmp_path / "n2", "s", node="n2") is None  # no database there
