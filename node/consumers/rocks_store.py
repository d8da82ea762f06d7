"""ConsumerStore over the node's RocksDB: one ConsumerRecord per consumer, group-committed."""

from __future__ import annotations

from collections.abc import Callable

from raftlog.internal import storage_pb2
from raftlog.node.engine import keys
from raftlog.node.engine.storage import CF_CONSUMERS, GroupCommitter, Storage


class RocksConsumerStore:
    def __init__(
        self, *, storage: Storage, committer: GroupCommitter, stream_id: Callable[[str], int]
    ) -> None:
        self._storage = storage
        self._committer = committer
        self._stream_id = stream_id

    def load(self, stream: str) -> list[storage_pb2.ConsumerRecord]:
        stream_id = self._stream_id(stream)
        return [
            storage_pb2.ConsumerRecord.FromString(value)
            for _, value in self._storage.scan(
                CF_CONSUMERS, lower=keys.stream_prefix(stream_id), upper=keys.stream_end(stream_id)
            )
        ]

    async def save(self, stream: str, record: storage_pb2.ConsumerRecord) -> None:
        batch = self._storage.batch()
        batch.put(keys.consumer_key(self._stream_id(stream), record.config.name),
                  record.SerializeToString(), self._storage.handle(CF_CONSUMERS))
        self._storage.write(batch)
        await self._committer.durable()

    async def delete(self, stream: str, name: str) -> None:
        batch = self._storage.batch()
        batch.delete(keys.consumer_key(self._stream_id(stream), name),
                     self._storage.handle(CF_CONSUMERS))
        self._storage.write(batch)
        await self._committer.durable()
