"""What node code sees of the metadata group: the `MetaGroup` protocol, which `RaftGroup`
(pysyncobj, `group.py`) and its in-memory twin `MemoryRaftGroup` (`memory.py`) implement, the
events it delivers, its status, and `ensure_ok`.

Threading contract, for both implementations:
- `propose`, `add_member`, `remove_member` are coroutines of the node's event loop; they never
  block it.
- `on_applied` and `on_leader_change` run on the event loop given to the group (at
  construction, or later with `attach_loop`), in the order the group saw them; before a loop is
  attached nothing is delivered. So attach the loop first, then read the state: every change
  after that read is also delivered as an event.
- The state machine is changed by another thread (pysyncobj's tick thread). `read_state()`
  holds the state lock for a consistent read (keep it short: applying waits for it); `state`
  is the live object, fine for a single lookup (`group.state.streams.get(name)`), not for
  iterating while commands apply.
- Results: `propose` returns the state machine's `RaftResult`; a rejection is a result with
  ok=False (`ensure_ok` turns it into a RaftlogError). It raises RaftlogError when the command's
  fate is not known or it did not commit: NO_LEADER / OVERLOADED with metadata
  outcome="not_committed" (safe to retry), or NO_LEADER / TIMEOUT with outcome="unknown" (it may
  still commit: retry only commands that are idempotent or carry their own guard, such as an
  expected epoch).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.raft.state_model import MetaState

log = logging.getLogger(__name__)

OUTCOME_NOT_COMMITTED = "not_committed"
OUTCOME_UNKNOWN = "unknown"


@dataclass(frozen=True)
class Applied:
    """A command applied at `index`; `command` and `result` are None when a snapshot replaced
    the whole state (read everything again)."""

    index: int
    command: raft_pb2.RaftCommand | None
    result: raft_pb2.RaftResult | None

    @property
    def snapshot_installed(self) -> bool:
        return self.command is None


@dataclass(frozen=True)
class LeaderChange:
    is_leader: bool
    leader: str | None  # Raft address of the leader this node knows of, if any
    term: int


@dataclass(frozen=True)
class PeerStatus:
    address: str
    connected: bool
    match_index: int | None = None  # on the leader only


@dataclass(frozen=True)
class GroupStatus:
    self_address: str
    term: int
    is_leader: bool
    leader: str | None
    commit_index: int
    applied_index: int
    log_entries: int
    has_quorum: bool
    ready: bool  # caught up with the leader's commit index once since start
    peers: tuple[PeerStatus, ...]
    journal: Mapping[str, int] = field(default_factory=dict)
    failure: str = ""  # why the group stopped applying, if it did


OnApplied = Callable[[Applied], None]
OnLeaderChange = Callable[[LeaderChange], None]



class AppliedState:
    """The applied metadata state and the lock readers take, as every MetaGroup (the real
    one, the in-memory twin, the simulation's) holds them."""

    def __init__(self, state: MetaState | None = None) -> None:
        self._state = state or MetaState()
        self._state_lock = threading.Lock()

    @property
    def state(self) -> MetaState:
        return self._state

    @contextlib.contextmanager
    def read_state(self) -> Iterator[MetaState]:
        with self._state_lock:
            yield self._state

class MetaGroup(Protocol):
    async def propose(self, command: raft_pb2.RaftCommand, *, timeout_s: float
                      ) -> raft_pb2.RaftResult: ...

    def is_leader(self) -> bool: ...

    def is_ready(self) -> bool:
        """Caught up with the leader's commit index once since start."""
        ...

    def leader_address(self) -> str | None: ...

    @property
    def state(self) -> MetaState: ...

    def read_state(self) -> AbstractContextManager[MetaState]: ...

    async def add_member(self, address: str, *, timeout_s: float) -> None: ...

    async def remove_member(self, address: str, *, timeout_s: float) -> None: ...

    async def transfer_leadership(self, *, timeout_s: float) -> str:
        """On the leader: another member leads on return (its Raft address)."""
        ...

    def status(self) -> GroupStatus: ...

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None: ...

    def close(self) -> None: ...


def ensure_ok(result: raft_pb2.RaftResult) -> raft_pb2.RaftResult:
    """The result when ok; else the rejection as a RaftlogError."""
    if result.ok:
        return result
    reason = Reason.__members__.get(result.reason, Reason.INTERNAL)
    raise RaftlogError(reason, result.message, raft_index=result.index)


def encode_command(command: raft_pb2.RaftCommand) -> bytes:
    data = command.SerializeToString()
    # Well under pysyncobj's 64 KiB append_entries batch (DEPENDENCIES.md §1.11); coalescers
    # split below it.
    bytes_max = limits.metadata_command_bytes_max
    if len(data) > bytes_max:
        raise RaftlogError(Reason.REQUEST_TOO_LARGE,
                           f"a metadata command is at most {bytes_max} bytes",
                           size=len(data), limit=bytes_max)
    return data


def stamped(command: raft_pb2.RaftCommand, *, now_ms: int) -> raft_pb2.RaftCommand:
    """A copy of the command carrying `now_ms` unless it already has a time."""
    copy = raft_pb2.RaftCommand()
    copy.CopyFrom(command)
    if not copy.now_ms:
        copy.now_ms = now_ms
    return copy


Event = TypeVar("Event", Applied, LeaderChange)


class EventSink:
    """Delivers events on the attached event loop, from any thread, in order."""

    def __init__(self, *, on_applied: OnApplied | None, on_leader_change: OnLeaderChange | None,
                 loop: asyncio.AbstractEventLoop | None) -> None:
        self._on_applied = on_applied
        self._on_leader_change = on_leader_change
        self.loop = loop
        self.dropped = 0  # events with no loop to go to

    @property
    def wants_applied(self) -> bool:
        return self._on_applied is not None

    def applied(self, event: Applied) -> None:
        if self._on_applied is not None:
            self._post(self._on_applied, event)

    def leader_changed(self, event: LeaderChange) -> None:
        if self._on_leader_change is not None:
            self._post(self._on_leader_change, event)

    def _post(self, callback: Callable[[Event], None], event: Event) -> None:
        loop = self.loop
        if loop is None or loop.is_closed():
            self.dropped += 1
            return
        try:
            loop.call_soon_threadsafe(_deliver, callback, event)
        except RuntimeError:  # closed between the check and the call
            self.dropped += 1


def _deliver(callback: Callable[[Event], None], event: Event) -> None:
    try:
        callback(event)
    except Exception:
        log.exception("metadata event handler failed on %r", event)


def running_loop_or_none() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None

