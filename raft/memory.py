"""`MemoryRaftGroup`: the in-memory twin of `RaftGroup`, for testing node code without sockets
or disk.

One member that is always leader (unless a test says otherwise with `set_leader`): `propose`
encodes the command exactly as the real group does (same size limit, same `now_ms` stamping),
applies the decoded copy at once through the same pure `apply`, and delivers `on_applied` on the
event loop before `propose` returns, as the real group does. Raft membership changes only edit a
set of addresses.
"""

from __future__ import annotations

import asyncio

from raftlog.base.clock import Clock, SystemClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.raft.api import (
    OUTCOME_NOT_COMMITTED,
    Applied,
    AppliedState,
    EventSink,
    GroupStatus,
    LeaderChange,
    OnApplied,
    OnLeaderChange,
    PeerStatus,
    encode_command,
    running_loop_or_none,
    stamped,
)
from raftlog.raft.state import apply
from raftlog.raft.state_model import MetaState


class MemoryRaftGroup(AppliedState):
    def __init__(
        self, *,
        self_address: str = "127.0.0.1:7000",
        state: MetaState | None = None,
        on_applied: OnApplied | None = None,
        on_leader_change: OnLeaderChange | None = None,
        clock: Clock | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.self_address = self_address
        super().__init__(state)
        self._clock = clock or SystemClock()
        self._events = EventSink(on_applied=on_applied, on_leader_change=on_leader_change,
                                 loop=loop or running_loop_or_none())
        self._index = self._state.applied_index
        self._term = 1
        self._leader = True
        self._closed = False
        self.raft_members: set[str] = {self_address}
        self.proposals = 0  # commands proposed, for tests

    async def propose(self, command: raft_pb2.RaftCommand, *, timeout_s: float
                      ) -> raft_pb2.RaftResult:
        if self._closed:
            raise RaftlogError(Reason.SHUTTING_DOWN, "the metadata group is closed")
        if not self._leader:
            raise RaftlogError(Reason.NO_LEADER, "the metadata group has no leader",
                               outcome=OUTCOME_NOT_COMMITTED)
        data = encode_command(stamped(command, now_ms=self._clock.wall_ms()))
        decoded = raft_pb2.RaftCommand.FromString(data)
        self.proposals += 1
        with self._state_lock:
            self._index += 1
            result = apply(self._state, decoded)
            self._state.applied_index = self._index
        result.index = self._index
        self._events.applied(Applied(index=self._index, command=decoded, result=result))
        await asyncio.sleep(0)  # lets the on_applied delivery run first, like the real group
        return result

    def is_leader(self) -> bool:
        return self._leader

    def is_ready(self) -> bool:
        return True

    def leader_address(self) -> str | None:
        return self.self_address if self._leader else None

    def set_leader(self, is_leader: bool) -> None:
        """Test hook: lose or regain leadership (a new term each time)."""
        if is_leader != self._leader:
            self._leader = is_leader
            self._term += 1
            self._events.leader_changed(LeaderChange(
                is_leader=is_leader, leader=self.leader_address(), term=self._term))

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._events.loop = loop

    async def add_member(self, address: str, *, timeout_s: float) -> None:
        if address in self.raft_members:
            raise RaftlogError(Reason.NODE_EXISTS, f"{address} is already a raft member")
        self.raft_members.add(address)

    async def remove_member(self, address: str, *, timeout_s: float) -> None:
        if address not in self.raft_members:
            raise RaftlogError(Reason.NODE_NOT_FOUND, f"{address} is not a raft member")
        if address == self.self_address:
            raise RaftlogError(Reason.INVALID_ARGUMENT,
                               "a node cannot remove itself; ask another member")
        self.raft_members.discard(address)

    async def transfer_leadership(self, *, timeout_s: float) -> str:
        """Another Raft member (see `raft_members`) leads from now on; returns its address."""
        if not self._leader:
            raise RaftlogError(Reason.NO_LEADER, "only the Raft leader can hand leadership over")
        others = sorted(self.raft_members - {self.self_address})
        if not others:
            raise RaftlogError(Reason.TIMEOUT, "no other member took Raft leadership over",
                               outcome=OUTCOME_NOT_COMMITTED)
        self.set_leader(False)
        return others[0]

    def status(self) -> GroupStatus:
        return GroupStatus(
            self_address=self.self_address, term=self._term, is_leader=self._leader,
            leader=self.leader_address(), commit_index=self._index, applied_index=self._index,
            log_entries=self._index, has_quorum=self._leader, ready=True,
            peers=tuple(PeerStatus(address=address, connected=True)
                        for address in sorted(self.raft_members - {self.self_address})),
        )

    def close(self) -> None:
        self._closed = True
