"""Where consumer records live: the `ConsumerStore` protocol and its in-memory twin.

The consumer engine (`consumers.py`) persists each consumer as one `storage_pb2.ConsumerRecord`
keyed by (stream, consumer name) and knows nothing else about how it is stored: today RocksDB
(`consumer_records.py`), later the Raft metadata group.

Contract every implementation keeps:
- `save` and `delete` are durable when they return (fsynced, or committed by a quorum).
- Calls on one key take effect in the order they were made, even when their awaits overlap:
  a `delete` called after a `save` of the same consumer is never undone by that save.
- `load` returns what the last completed calls left; records are not shared with the caller
  (the engine may keep or mutate what it is given).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from raftlog.internal import storage_pb2


class ConsumerStore(Protocol):
    def load(self, stream: str) -> list[storage_pb2.ConsumerRecord]:
        """Every consumer record of the stream, in no particular order."""
        ...

    async def save(self, stream: str, record: storage_pb2.ConsumerRecord) -> None:
        """Creates or replaces the record named `record.config.name`; durable on return."""
        ...

    async def delete(self, stream: str, name: str) -> None:
        """Removes the record if present (a missing one is not an error); durable on return."""
        ...


class MemoryConsumerStore:
    """In-memory twin of ConsumerStore, for tests. Counts saves so tests can check coalescing;
    `delay_s` makes every save and delete take that long, `error` makes saves fail."""

    def __init__(self, *, delay_s: float = 0.0) -> None:
        self.records: dict[tuple[str, str], bytes] = {}
        self.saves = 0
        self.deletes = 0
        self.delay_s = delay_s
        self.error: Exception | None = None

    def load(self, stream: str) -> list[storage_pb2.ConsumerRecord]:
        return [
            storage_pb2.ConsumerRecord.FromString(raw)
            for (owner, _), raw in sorted(self.records.items())
            if owner == stream
        ]

    async def save(self, stream: str, record: storage_pb2.ConsumerRecord) -> None:
        if self.error is not None:
            raise self.error
        # Stored at call time, like the RocksDB store's synchronous put: call order holds.
        self.records[(stream, record.config.name)] = record.SerializeToString()
        self.saves += 1
        await asyncio.sleep(self.delay_s)

    async def delete(self, stream: str, name: str) -> None:
        self.records.pop((stream, name), None)
        self.deletes += 1
        await asyncio.sleep(self.delay_s)
