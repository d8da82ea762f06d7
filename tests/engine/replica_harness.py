"""The replica harness shared by tests/engine/test_replica.py and
tests/process/test_replica_validation.py: one in-process replica (ReplicationService over a real
StreamEngine on RocksDB under a given path), no sockets."""

from __future__ import annotations

import asyncio
import zlib
from pathlib import Path

from raftlog.base.clock import FakeClock
from raftlog.internal import raft_pb2, replication_pb2, storage_pb2
from raftlog.node.consumers.rocks_store import RocksConsumerStore
from raftlog.node.engine.rocks_store import RocksMessageStore
from raftlog.node.engine.storage import GroupCommitter, Storage
from raftlog.node.engine.stream import Stream
from raftlog.node.engine.streams import NoConsumers, StreamEngine
from raftlog.node.replication.service import ReplicationService
from raftlog.v1 import types_pb2


def stored(payload: bytes, *, epoch: int, subject: str = "s") -> bytes:
    return storage_pb2.StoredMessage(subject=subject, payload=payload, ts_ms=1,
                                     epoch=epoch).SerializeToString()


class Replica:
    def __init__(self, path: Path) -> None:
        self.storage = Storage(path)
        self.committer = GroupCommitter(self.storage)
        self.engine = StreamEngine(store=RocksMessageStore(self.storage, self.committer),
                                   clock=FakeClock(), consumers=NoConsumers(), follow_raft=True)
        # The node's own consumer store (RepairConsumer removes records from it).
        self.consumer_copies = RocksConsumerStore(
            storage=self.storage, committer=self.committer,
            stream_id=lambda name: self.engine.get(name).stream_id)
        self.service = ReplicationService(node_id="r1", engine=self.engine,
                                          committer=self.committer,
                                          ensure_replica=self._missing,
                                          consumer_copies=self.consumer_copies)

    async def _missing(self, name: str) -> Stream:
        raise AssertionError(f"unexpected stream {name}")

    async def open(self) -> Stream:
        self.committer.start(asyncio.get_running_loop())
        await self.engine.create(types_pb2.StreamConfig(name="s"))
        return self.engine.get("s")

    async def send(self, *, epoch: int, first_seq: int, payloads: list[bytes] | None = None,
                   msg_epoch: int | None = None, history: list[tuple[int, int]] | None = None,
                   checksum: int | None = None, reseed: bool = False,
                   removed: list[tuple[int, int]] | None = None,
                   commit_seq: int = 0) -> replication_pb2.ReplicateAck:
        values = [stored(p, epoch=msg_epoch or epoch) for p in payloads or []]
        request = replication_pb2.ReplicateRequest(
            stream="s", epoch=epoch, first_seq=first_seq, messages=values, reseed=reseed,
            checksum=zlib.crc32(b"".join(values)) if checksum is None else checksum,
            history=[raft_pb2.EpochStart(fence_epoch=e, start_seq=s)
                     for e, s in history or [(1, 1)]],
            removed=[replication_pb2.SeqRange(first=a, last=b) for a, b in removed or []],
            commit_seq=commit_seq, primary="p", request_id=7)
        return await self.service.apply(request)

    def payloads(self, stream: Stream) -> dict[int, bytes]:
        return {seq: storage_pb2.StoredMessage.FromString(value).payload
                for seq, value in enumerate(stream.stored_values(
                    from_seq=1, to_seq=stream.last_seq, bytes_max=1 << 30), start=1) if value}

    def close(self) -> None:
        self.committer.stop()
        self.storage.close()
