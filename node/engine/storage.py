"""The node's one RocksDB (rocksdict, raw mode) and its group-commit writer.

Column families (DESIGN §2): raft_log, raft_meta (owned by raftlog.raft.journal); messages,
subjects, dedupe, stream_state (the streams' `MessageStore`, rocks_store.py); consumers. Writes
are unsynced WriteBatches made on the event loop thread; `GroupCommitter.durable()` returns once
one `flush_wal(True)` (which releases the GIL) covers every write made before the call. Many
publishes share one fsync.

A write or fsync the disk refuses is fatal (base/fatal.py): the node exits rather than
acknowledge anything more, and starts again from what is on disk.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

from rocksdict import Checkpoint, ColumnFamily, Options, Rdict, WriteBatch, WriteOptions

from raftlog.base import limits
from raftlog.base.errors import InvariantViolation
from raftlog.base.fatal import fatal_on_disk_failure
from raftlog.base.files import ensure_dir, fsync_dir
from raftlog.base.waiters import settle

log = logging.getLogger(__name__)

CF_RAFT_LOG = "raft_log"
CF_RAFT_META = "raft_meta"
CF_MESSAGES = "messages"
CF_SUBJECTS = "subjects"
CF_DEDUPE = "dedupe"
CF_STREAM_STATE = "stream_state"
CF_CONSUMERS = "consumers"
COLUMN_FAMILIES = (
    CF_RAFT_LOG,
    CF_RAFT_META,
    CF_MESSAGES,
    CF_SUBJECTS,
    CF_DEDUPE,
    CF_STREAM_STATE,
    CF_CONSUMERS,
)


def _cf_options() -> Options:
    options = Options(raw_mode=True)
    return options


class Storage:
    """One RocksDB per node. Reads and unsynced writes from any thread; see GroupCommitter."""

    def __init__(self, data_dir: Path) -> None:
        ensure_dir(data_dir)
        db_path = data_dir / "db"
        creating = not db_path.exists()
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        self.db = Rdict(
            str(db_path),
            options,
            column_families={name: _cf_options() for name in COLUMN_FAMILIES},
        )
        if creating:
            fsync_dir(data_dir)
        self.path = db_path
        self._handles = {name: self.db.get_column_family_handle(name) for name in COLUMN_FAMILIES}
        self._views = {name: self.db.get_column_family(name) for name in COLUMN_FAMILIES}
        self._unsynced = WriteOptions()
        self._unsynced.sync = False
        # Bytes of every batch `write` applied so far (their WAL records, not yet fsynced);
        # GroupCommitter tells each fsync's share to the metrics. Writes may come from any
        # thread, hence the lock.
        self._written_lock = threading.Lock()
        self._written_bytes = 0

    def handle(self, cf: str) -> ColumnFamily:
        return self._handles[cf]

    def view(self, cf: str) -> Rdict:
        return self._views[cf]

    def batch(self) -> WriteBatch:
        return WriteBatch(raw_mode=True)

    def write(self, batch: WriteBatch) -> None:
        """Applies the batch atomically, without fsync (see GroupCommitter)."""
        if not batch.is_empty():
            size_bytes = batch.size_in_bytes()
            with fatal_on_disk_failure("a write to the node's database"):
                self.db.write(batch, self._unsynced)
            with self._written_lock:
                self._written_bytes += size_bytes

    @property
    def written_bytes(self) -> int:
        """Bytes of the batches `write` has applied since the database was opened."""
        return self._written_bytes

    def get(self, cf: str, key: bytes) -> bytes | None:
        value: bytes | None = self._views[cf].get(key)
        return value

    def scan(self, cf: str, *, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs with lower <= key < upper, ascending."""
        # items() takes one call per pair where iter() takes four (a fetch reads every message
        # it hands out); an upper bound in its ReadOptions costs more than the comparison.
        # raw mode: keys and values are bytes (rocksdict's stubs say any key type)
        items = cast("Iterator[tuple[bytes, bytes]]", self._views[cf].items(from_key=lower))
        for item in items:
            if item[0] >= upper:
                return
            yield item

    def scan_keys(self, cf: str, *, lower: bytes, upper: bytes) -> Iterator[bytes]:
        it = self._views[cf].iter()
        it.seek(lower)
        while it.valid():
            key = it.key()
            if key >= upper:
                break
            yield key
            it.next()

    def last_key(self, cf: str, *, lower: bytes, upper: bytes) -> bytes | None:
        """The greatest key with lower <= key < upper, or None."""
        it = self._views[cf].iter()
        it.seek_for_prev(upper)
        while it.valid():
            key: bytes = it.key()
            if key < lower:
                return None
            if key < upper:
                return key
            it.prev()
        return None

    def checkpoint(self, path: Path) -> None:
        """A consistent copy of the whole database in `path` (which must not exist yet): hard
        links to its table files, memtables flushed first. Any thread; the database keeps
        serving meanwhile. The copy is the caller's to remove."""
        Checkpoint(self.db).create_checkpoint(str(path))

    def sync(self) -> None:
        """fsyncs the WAL; releases the GIL while it waits."""
        self.db.flush_wal(True)

    def close(self) -> None:
        self._views.clear()
        self._handles.clear()
        self.db.close()


class GroupCommitter:
    """One fsync thread; `durable()` resolves once an fsync that started after the call's
    preceding writes has completed. Must be awaited on the loop the committer was started on."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._loop: asyncio.AbstractEventLoop | None = None
        self._requested = 0  # generation asked for (loop thread)
        self._synced = 0  # generation known durable (loop thread)
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._wake = threading.Condition()
        self._want = 0  # latest generation asked of the thread (under _wake)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.fsyncs = 0
        # Told, for each fsync, how many `durable()` callers it released and how many bytes of
        # `Storage.write` batches it made durable (the node's metrics), or None. The Raft
        # journal writes and syncs on its own and is not counted.
        self.on_batch: Callable[[int, int], None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
        self._thread.start()

    async def durable(self) -> None:
        """Waits until every write made before this call is fsynced."""
        self._requested += 1
        generation = self._requested
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiters.append((generation, future))
        with self._wake:
            self._want = generation
            self._wake.notify()
        await future

    def _run(self) -> None:
        synced = 0
        synced_bytes = 0  # Storage.written_bytes as the previous fsync started
        while True:
            with self._wake:
                while self._want <= synced and not self._stopping:
                    self._wake.wait()
                if self._stopping and self._want <= synced:
                    return
                target = self._want
            # Read before the fsync, so every byte counted here is surely covered by it; a
            # write that lands meanwhile counts toward the next one.
            written_bytes = self._storage.written_bytes
            with fatal_on_disk_failure("fsync of the node's database"):
                self._storage.sync()
            synced = target
            self.fsyncs += 1
            if self._loop is None:
                raise InvariantViolation("the group-commit thread runs before start()")
            self._loop.call_soon_threadsafe(self._resolve, target, written_bytes - synced_bytes)
            synced_bytes = written_bytes

    def _resolve(self, generation: int, synced_bytes: int) -> None:
        self._synced = max(self._synced, generation)
        ready = [future for wanted, future in self._waiters if wanted <= self._synced]
        settle(ready)
        if self.on_batch is not None and (ready or synced_bytes):
            self.on_batch(len(ready), synced_bytes)
        self._waiters = [(wanted, future) for wanted, future in self._waiters
                         if wanted > self._synced]

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=limits.fsync_wait_s_max)
