"""A read-only replay of one member's metadata from its disk: the snapshot file, then the
journal's committed entries applied with `state.apply` — the state the member would hold after
a restart, without starting the group. Nothing is written (the audit export uses it on a stopped
node's database or on a checkpoint of a running one).

Journal entries are pysyncobj's (wire.py): the first byte is the entry's kind — 0 a regular
command, `(method id, (command bytes,))` pickled; 1 a new leader's NO_OP; 2 a membership change;
3 a code version. Only regular commands change the state. As in `RaftGroup._apply_entry`, a
command that does not decode is a rejected one: the state stays, the index moves on.

The journal is read one entry at a time from `snapshot index + 1` up to the stored commit index
(journal.py: stored lazily, so up to a second behind what the member had applied).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.raft import wire
from raftlog.raft.journal import stored_commit_index, stored_entries
from raftlog.raft.snapshot_file import read_snapshot_file
from raftlog.raft.state import apply
from raftlog.raft.state_model import MetaState
from raftlog.raft.state_snapshot import from_snapshot

ENTRY_REGULAR = 0  # pysyncobj's _COMMAND_TYPE.REGULAR; the other kinds never change the state

# Regular entries hold only tuples, ints and bytes: no class may be named.
_ENTRY_CODEC = wire.RestrictedPickle(allowed_globals=frozenset(), what="replayed log entry")


@dataclass
class ReplayedView:
    state: MetaState
    index: int  # the Raft index the state is at: the last entry replayed, or the snapshot's
    snapshot_index: int  # 0: no snapshot file
    commit_index: int  # replayed up to (the journal's stored one unless given)


def replay(*, log: Any, meta: Any, snapshot_path: Path | None,
           commit_index: int | None = None) -> ReplayedView:
    """The member's state from its snapshot file (None or a missing file: the empty state) and
    the journal column families `log` and `meta` (rocksdict views), up to `commit_index` (by
    default the stored one; a running member's applied index, noted before its journal was
    copied, is fresher). Raises RaftlogError (CORRUPT_RECORD) for a bad snapshot, an entry that
    does not unpickle, or a journal that does not continue the snapshot."""
    state, snapshot_index = _load_snapshot(snapshot_path)
    if commit_index is None:
        commit_index = stored_commit_index(meta)
    index = snapshot_index
    for command, entry_index, _term in stored_entries(log, lower=snapshot_index + 1):
        if entry_index > commit_index:
            break
        if entry_index != index + 1:
            raise RaftlogError(Reason.CORRUPT_RECORD, f"raft journal: entry {entry_index} "
                               f"follows {index} (the snapshot's index is {snapshot_index})")
        _apply_entry(state, command, index=entry_index)
        index = entry_index
    return ReplayedView(state=state, index=index, snapshot_index=snapshot_index,
                        commit_index=commit_index)


def _load_snapshot(path: Path | None) -> tuple[MetaState, int]:
    if path is None or not path.exists():
        return MetaState(), 0
    snapshot = read_snapshot_file(str(path), durable=False)
    if snapshot.last_entry.index != snapshot.last_applied_index:
        raise RaftlogError(Reason.CORRUPT_RECORD,
                           f"{path}: snapshot index does not match its last entry")
    return from_snapshot(snapshot), snapshot.last_applied_index


def _apply_entry(state: MetaState, entry_command: bytes, *, index: int) -> None:
    data = regular_command(entry_command, index=index)
    if data is None:
        return
    try:
        command = raft_pb2.RaftCommand.FromString(data)
    except Exception:
        state.applied_index = index  # undecodable: a rejected command
        return
    apply(state, command)
    state.applied_index = index


def regular_command(entry_command: bytes, *, index: int) -> bytes | None:
    """The RaftCommand bytes of a regular journal entry; None for the other kinds."""
    if not entry_command or entry_command[0] != ENTRY_REGULAR:
        return None
    try:
        decoded = _ENTRY_CODEC.loads(entry_command[1:])
    except Exception as err:
        raise RaftlogError(Reason.CORRUPT_RECORD,
                           f"raft journal: entry {index} does not unpickle: {err}") from None
    args = decoded[1] if isinstance(decoded, tuple) and len(decoded) >= 2 else ()
    if not isinstance(args, tuple | list) or len(args) != 1 or not isinstance(args[0], bytes):
        raise RaftlogError(Reason.CORRUPT_RECORD,
                           f"raft journal: entry {index} is not a replicated command")
    return args[0]
