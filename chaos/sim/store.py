"""A node's message store with a disk that can lose what was not made durable.

`SimStore` is the real in-memory twin (`MemoryMessageStore`, node/engine/memory_store.py) with
the contract of the real store (node/engine/store.py) made observable: `write` applies a batch
to what the node reads at once, and it reaches the *disk* (`SimDisk`, a second
`MemoryMessageStore`) only when a `durable()` that started after it returns, each `durable()`
taking a seeded fsync time. A process crash keeps every write (the OS page cache reaches the
disk); a power loss keeps the disk plus, as a page cache partly flushed might, a seeded prefix
of the writes no `durable()` covered (whole batches, in order: the contract says a crash never
keeps part of a batch). The next incarnation starts from what was kept.

The crashed incarnation's store is dead: its writes go nowhere and its `durable()` never
returns (the process is gone), so code of a crashed node still unwinding cannot change the disk.
"""

from __future__ import annotations

import asyncio
import copy
import random
from collections.abc import Callable

from raftlog.node.engine.memory_store import MemoryBatch, MemoryMessageStore
from raftlog.node.engine.store import StoreBatch


class SimDisk:
    """What survives a crash of one node: the durable image of its store."""

    def __init__(self) -> None:
        self.image = MemoryMessageStore()
        self.fsyncs = 0

    def apply(self, batch: MemoryBatch) -> None:
        for operation in batch.operations:
            operation(self.image)

    def fresh_store(self) -> MemoryMessageStore:
        """A copy of the image, for an incarnation to read and write."""
        store = MemoryMessageStore()
        store.streams = copy.deepcopy(self.image.streams)
        store.stream_records = dict(self.image.stream_records)
        store.last_next_stream_id = self.image.last_next_stream_id
        return store


class SimStore(MemoryMessageStore):
    """The store of one node incarnation over its `SimDisk`; see the module docstring."""

    def __init__(self, disk: SimDisk, *, fsync_s: Callable[[], float]) -> None:
        super().__init__()
        start = disk.fresh_store()
        self.streams = start.streams
        self.stream_records = start.stream_records
        self.last_next_stream_id = start.last_next_stream_id
        self.disk = disk
        self._fsync_s = fsync_s
        self._unsynced: list[MemoryBatch] = []
        self._written = 0  # batches written by this incarnation
        self._synced = 0  # of those, on the disk
        self.dead = False

    def write(self, batch: StoreBatch) -> None:
        if self.dead:
            return
        super().write(batch)
        if isinstance(batch, MemoryBatch):
            self._unsynced.append(batch)
            self._written += 1

    async def durable(self) -> None:
        self.durables += 1
        goal = self._written
        await asyncio.sleep(self._fsync_s())
        while self.dead:
            await asyncio.Future()  # the process is gone: nobody is answered
        self._sync_to(goal)

    def _sync_to(self, goal: int) -> None:
        if goal <= self._synced:
            return
        for batch in self._unsynced[:goal - self._synced]:
            self.disk.apply(batch)
        del self._unsynced[:goal - self._synced]
        self._synced = goal
        self.disk.fsyncs += 1

    def crash(self, rng: random.Random, *, power_loss: bool) -> int:
        """The node dies and this store with it. A process crash loses nothing written (the
        OS page cache keeps it); a power loss keeps a seeded prefix of the unsynced batches
        and loses the rest. Returns how many batches were lost."""
        kept = rng.randint(0, len(self._unsynced)) if power_loss else len(self._unsynced)
        self._sync_to(self._synced + kept)
        lost = len(self._unsynced)
        self._unsynced.clear()
        self.dead = True
        return lost


class LyingCommitter:
    """A committer whose `durable()` answers at once and syncs nothing: handed to a replica's
    ReplicationService, it makes the replica acknowledge batches before they are durable (the
    `replica-acks-before-fsync` bug, bugs.py)."""

    def __init__(self, store: SimStore) -> None:
        self._store = store

    async def durable(self) -> None:
        await asyncio.sleep(0)
