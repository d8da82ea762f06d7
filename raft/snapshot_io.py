"""`SnapshotIO`, the mixin of `RaftGroup` (raft/group.py) that holds pysyncobj's snapshot conf
hooks: snapshots never pickle.

- `_serialize` (`serializer`) writes the protobuf `RaftSnapshot` — the state as of the last
  applied entry, the last and previous entries, the Raft members — with a CRC and fsyncs the
  file (`snapshot_file.py`);
- `_check_serialized` (`serializeChecker`) reports success only after pysyncobj's rename of that
  file is durable (directory fsync), so the journal prefix is dropped only once the snapshot that
  replaces it is durable;
- `_deserialize` (`deserializer`) loads a snapshot (at start, or received from the leader) and
  replaces the state; a snapshot that cannot be loaded halts the group.

All three run on pysyncobj's tick thread. `_entry_pb` / `_entry_tuple` convert pysyncobj's
entries `(command, index, term)` to and from `raft_pb2.JournalEntry`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.node import TCPNode

from raftlog.base.errors import InvariantViolation
from raftlog.internal import raft_pb2
from raftlog.raft.api import Applied, EventSink
from raftlog.raft.journal import RocksJournal
from raftlog.raft.snapshot_file import fsync_directory, read_snapshot_file, write_snapshot_file
from raftlog.raft.state_model import MetaState
from raftlog.raft.state_snapshot import encode_snapshot, from_snapshot

log = logging.getLogger(__name__)


def _entry_pb(entry: Any) -> raft_pb2.JournalEntry:
    command, index, term = entry
    return raft_pb2.JournalEntry(index=index, term=term, command=bytes(command))


def _entry_tuple(entry: raft_pb2.JournalEntry) -> tuple[bytes, int, int]:
    return (entry.command, entry.index, entry.term)


class SnapshotIO:
    """Snapshot hooks of `RaftGroup`; the attributes below are set by `RaftGroup.__init__`."""

    journal: RocksJournal
    _state: MetaState
    _state_lock: threading.Lock
    _events: EventSink
    _snapshot_path: str
    _snapshot_written: int | None  # inode awaiting rename + directory fsync
    _snapshot_failed: bool
    _halt: Callable[[str], None]  # stops the group: its state is in doubt

    def _serialize(self, tmp_path: str, data: Any) -> None:
        """pysyncobj serializer (tick thread): the state as of the last applied entry."""
        last_entry, prev_entry, cluster = data
        self._snapshot_written, self._snapshot_failed = None, False
        try:
            with self._state_lock:
                if self._state.applied_index > last_entry[1]:
                    raise InvariantViolation(
                        f"raft: state at {self._state.applied_index} is past the snapshot "
                        f"entry {last_entry[1]}")
                # The state as of last_entry: entries after the last command (NO_OPs,
                # membership changes) do not change it.
                payload = encode_snapshot(self._state, last_applied_index=last_entry[1])
            payload += raft_pb2.RaftSnapshot(
                last_entry=_entry_pb(last_entry), prev_entry=_entry_pb(prev_entry),
                raft_nodes=sorted(str(node.id) for node in cluster)).SerializeToString()
            self._snapshot_written = write_snapshot_file(tmp_path, payload)
        except Exception:
            self._snapshot_failed = True
            log.exception("raft: writing the snapshot failed")
            raise

    def _check_serialized(self) -> int:
        """pysyncobj serializeChecker (tick thread, every tick). pysyncobj renames the file
        right after the serializer returns; success is reported only once that rename is
        durable, since pysyncobj then drops the journal prefix the snapshot replaces."""
        if self._snapshot_failed:
            self._snapshot_failed = False
            return int(SERIALIZER_STATE.FAILED)
        inode = self._snapshot_written
        if inode is None:
            return int(SERIALIZER_STATE.NOT_SERIALIZING)
        self._snapshot_written = None
        try:
            if os.stat(self._snapshot_path).st_ino != inode:
                return int(SERIALIZER_STATE.FAILED)
            fsync_directory(os.path.dirname(os.path.abspath(self._snapshot_path)))
        except OSError:
            log.exception("raft: checking the snapshot failed")
            return int(SERIALIZER_STATE.FAILED)
        return int(SERIALIZER_STATE.SUCCESS)

    def _deserialize(self, path: str) -> tuple[Any, Any, set[Any]]:
        """pysyncobj deserializer (tick thread): at start, and when a snapshot was received.
        Replaces the state; returns (last entry, previous entry, Raft members)."""
        try:
            snapshot = read_snapshot_file(path)
            state = from_snapshot(snapshot)
            if snapshot.last_entry.index != snapshot.last_applied_index:
                raise InvariantViolation("raft: snapshot index does not match its last entry")
        except Exception as err:
            self._halt(f"loading snapshot {path} failed: {err!r}")
            raise
        with self._state_lock:
            self._state = state
        self.journal.applied_index = state.applied_index
        self._events.applied(Applied(index=state.applied_index, command=None, result=None))
        # Node objects, not ids: pysyncobj compares them with its own node to drop itself.
        nodes = {TCPNode(address) for address in snapshot.raft_nodes}
        return _entry_tuple(snapshot.last_entry), _entry_tuple(snapshot.prev_entry), nodes
