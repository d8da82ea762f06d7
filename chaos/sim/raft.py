"""The Raft metadata group, modelled: `SimRaft` (one committed log, a leader, elections, who
holds which entries) and `SimMetaGroup`, each node's `MetaGroup` (raft/api.py) view of it.

What is real: every node's metadata state is built by the real pure state machine
(`raft.state.apply`) from the same committed commands, encoded, size-checked and time-stamped
by the proposer exactly as `RaftGroup` and `MemoryRaftGroup` do (`stamped`, `encode_command`),
and events reach `ClusterNode` through the real `EventSink`. What is modelled (pysyncobj is not
run): the log is committed when the leader can reach a majority (network reachability, both
ways); followers receive committed entries every `raft_tick_s` while they reach the leader, so
a partitioned node's metadata lags; a leader that cannot reach a majority keeps believing it
leads for `leader_fallback_s` (as pysyncobj's leaderFallbackTimeout), so two nodes may both
think they lead for a while; an election takes a seeded timeout in
[`election_timeout_min_s`, `election_timeout_max_s`]. Uncommitted entries are never kept, so
there is no log truncation to model. A proposal whose answer cannot come back (the proposer
lost the leader after sending) fails with TIMEOUT and outcome "unknown" at its deadline, whether
it committed or not, as in the real group.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.chaos.sim.network import SimNetwork
from raftlog.chaos.sim.trace import Trace
from raftlog.internal import raft_pb2
from raftlog.raft.api import (
    OUTCOME_NOT_COMMITTED,
    OUTCOME_UNKNOWN,
    Applied,
    AppliedState,
    EventSink,
    GroupStatus,
    LeaderChange,
    MetaGroup,
    encode_command,
    stamped,
)
from raftlog.raft.state import apply

raft_tick_s = 0.01  # how often the leader's entries reach followers and leadership is judged
election_timeout_min_s = 0.15  # raft/group.py's defaults
election_timeout_max_s = 0.35
leader_fallback_s = 0.35  # a leader that cannot reach a majority steps down after this
results_kept_max = 1_000  # apply results a view keeps for proposals still waiting


def raft_address(node: str) -> str:
    return f"sim-{node}:7000"


def majority(count: int) -> int:
    return count // 2 + 1


class SimRaft:
    """The group: the committed log, the leader, and how far each node's journal holds the
    log (durable: it survives the node's crashes, as the real journal does)."""

    def __init__(self, *, nodes: tuple[str, ...], network: SimNetwork, rng: random.Random,
                 trace: Trace) -> None:
        self.nodes = nodes
        self._network = network
        self._rng = rng
        self._trace = trace
        self.log: list[bytes] = []
        self.journal: dict[str, int] = {node: 0 for node in nodes}  # entries each node holds
        self.views: dict[str, SimMetaGroup] = {}
        self.term = 1
        self.leader: str | None = None
        self._stale_since_s: dict[str, float] = {}  # believes it leads, cannot commit, since
        self._election_at_s: float | None = 0.0

    # ----------------------------------------------------------------- membership of views

    def view(self, node: str, *, clock: Clock) -> SimMetaGroup:
        """A new incarnation's view: its journal replayed (no events: none is attached yet)."""
        view = SimMetaGroup(raft=self, node=node, clock=clock)
        view.catch_up(self.journal[node], deliver=False)
        self.views[node] = view
        return view

    def crashed(self, node: str) -> None:
        view = self.views.pop(node, None)
        if view is not None:
            view.close()
        self._stale_since_s.pop(node, None)
        if self.leader == node:
            self.leader = None
            self._trace.note("raft-no-leader", f"{node} crashed")

    # ----------------------------------------------------------------- reachability

    def _up(self, node: str) -> bool:
        return node in self.views and self._network.is_up(node)

    def _reaches_majority(self, node: str) -> bool:
        reached = sum(1 for other in self.nodes if self._up(other)
                      and (other == node or self._network.reachable(node, other)))
        return self._up(node) and reached >= majority(len(self.nodes))

    def leader_for(self, node: str) -> str | None:
        """The leader `node` knows of: itself when it believes it leads, else the leader when
        it reaches it."""
        view = self.views.get(node)
        if view is not None and view.believes_leader:
            return node
        leader = self.leader
        if leader is not None and self._network.reachable(node, leader):
            return leader
        return None

    # ----------------------------------------------------------------- ticking

    async def run(self) -> None:
        while True:
            self.tick()
            await asyncio.sleep(raft_tick_s)

    def tick(self) -> None:
        now = asyncio.get_running_loop().time()
        self._fall_back(now)
        leader = self.leader
        if leader is not None and self._reaches_majority(leader):
            self._election_at_s = None
        else:  # the majority no longer hears a leader: an election after a timeout
            if self._election_at_s is None:
                self._election_at_s = now + self._rng.uniform(election_timeout_min_s,
                                                              election_timeout_max_s)
            if now >= self._election_at_s:
                self._elect()
        self._push()

    def _fall_back(self, now: float) -> None:
        """A node that believes it leads but cannot commit (no majority, or another leader
        was elected) stops believing after `leader_fallback_s`."""
        for node in self.nodes:
            view = self.views.get(node)
            if view is None or not view.believes_leader:
                self._stale_since_s.pop(node, None)
                continue
            if node == self.leader and self._reaches_majority(node):
                self._stale_since_s.pop(node, None)
                continue
            since = self._stale_since_s.setdefault(node, now)
            if now - since >= leader_fallback_s:
                self._stale_since_s.pop(node, None)
                if self.leader == node:
                    self.leader = None
                    self._trace.note("raft-no-leader", f"{node} lost its majority")
                view.set_belief(False, leader=None, term=self.term)

    def _elect(self) -> None:
        candidates = [n for n in self.nodes if n != self.leader and self._reaches_majority(n)]
        self._election_at_s = None  # no candidate: try again after another timeout
        if not candidates:
            return
        new = self._rng.choice(candidates)
        self.term += 1
        self.leader = new
        self.journal[new] = len(self.log)  # the election restriction: it holds every entry
        self._trace.note("raft-leader", f"{new} term {self.term}")
        view = self.views.get(new)
        if view is not None:
            view.set_belief(True, leader=raft_address(new), term=self.term)

    def _step_down(self, node: str, *, why: str) -> None:
        if self.leader == node:
            self.leader = None
            self._trace.note("raft-no-leader", f"{node} {why}")
        view = self.views.get(node)
        if view is not None and view.believes_leader:
            view.set_belief(False, leader=None, term=self.term)

    def depose(self) -> None:
        """A forced election (the leader stepped down, as under load)."""
        if self.leader is not None:
            self._step_down(self.leader, why="forced election")

    def _push(self) -> None:
        """The leader's committed entries reach the nodes it reaches; a stale leader that
        hears from the real one steps down."""
        leader = self.leader
        if leader is None:
            return
        for node in self.nodes:
            view = self.views.get(node)
            if view is None or not (node == leader or self._network.reachable(leader, node)):
                continue
            if node != leader and view.believes_leader:
                view.set_belief(False, leader=raft_address(leader), term=self.term)
            self.journal[node] = len(self.log)
            view.catch_up(len(self.log), deliver=True)
            view.ready = True

    # ----------------------------------------------------------------- proposals

    async def propose(self, node: str, data: bytes, *, timeout_s: float
                      ) -> raft_pb2.RaftResult:
        """Commits an encoded command proposed by `node`; see the module docstring."""
        try:
            async with asyncio.timeout(timeout_s):
                return await self._propose(node, data)
        except TimeoutError:
            raise RaftlogError(Reason.TIMEOUT, f"a metadata command from {node} was not "
                               f"answered within {timeout_s} s",
                               outcome=OUTCOME_UNKNOWN) from None

    async def _propose(self, node: str, data: bytes) -> raft_pb2.RaftResult:
        leader = self.leader_for(node)
        if leader is None:
            await asyncio.sleep(raft_tick_s)  # the real group answers within a tick
            raise RaftlogError(Reason.NO_LEADER, "the metadata group has no leader",
                               outcome=OUTCOME_NOT_COMMITTED)
        await self._network.cross(node, leader)
        # A stale leader (or one without a majority) never commits: the deadline answers.
        while self.leader != leader or not self._reaches_majority(leader):
            await asyncio.sleep(raft_tick_s)
        await asyncio.sleep(2 * self._network.transit_s(leader, leader))  # a round to a majority
        while self.leader != leader or not self._reaches_majority(leader):
            await asyncio.sleep(raft_tick_s)
        self.log.append(data)
        index = len(self.log)
        self.journal[leader] = index
        leader_view = self.views.get(leader)
        if leader_view is not None:
            leader_view.catch_up(index, deliver=True)
        await self._network.cross(leader, node)
        view = self.views.get(node)
        while view is None or view.closed:
            await asyncio.sleep(raft_tick_s)  # the proposer crashed: nobody reads the answer
        self.journal[node] = max(self.journal[node], index)
        view.catch_up(index, deliver=True)
        await asyncio.sleep(0)  # lets the on_applied delivery run first, like the real group
        return view.result(index)


class SimMetaGroup(AppliedState):
    """One node incarnation's `MetaGroup`: its own `MetaState`, applied from the committed log
    by the real `apply`; see the module docstring."""

    def __init__(self, *, raft: SimRaft, node: str, clock: Clock) -> None:
        self._raft = raft
        self.node = node
        self.self_address = raft_address(node)
        self._clock = clock
        super().__init__()
        self._events = EventSink(on_applied=None, on_leader_change=None, loop=None)
        self._results: dict[int, raft_pb2.RaftResult] = {}
        self.closed = False
        self.ready = False  # caught up with the leader once since start
        self._term = raft.term
        self._leader_seen: str | None = None
        self.believes_leader = False
        self.applied_index = 0

    def bind(self, *, on_applied: Callable[[Applied], None],
             on_leader_change: Callable[[LeaderChange], None]) -> None:
        """The node's handlers (ClusterNode's), as RaftGroup takes them at construction."""
        self._events = EventSink(on_applied=on_applied, on_leader_change=on_leader_change,
                                 loop=self._events.loop)

    # ----------------------------------------------------------------- applying

    def catch_up(self, index: int, *, deliver: bool) -> None:
        """Applies the committed log up to `index` (events only with `deliver`)."""
        while self.applied_index < index and not self.closed:
            data = self._raft.log[self.applied_index]
            command = raft_pb2.RaftCommand.FromString(data)
            with self._state_lock:
                self.applied_index += 1
                result = apply(self._state, command)
                self._state.applied_index = self.applied_index
            result.index = self.applied_index
            self._results[self.applied_index] = result
            self._results.pop(self.applied_index - results_kept_max, None)
            if deliver:
                self._events.applied(Applied(index=self.applied_index, command=command,
                                             result=result))

    def result(self, index: int) -> raft_pb2.RaftResult:
        found = self._results.get(index)
        if found is None:
            raise RaftlogError(Reason.TIMEOUT, f"the result of entry {index} is gone",
                               outcome=OUTCOME_UNKNOWN)
        return found

    def set_belief(self, is_leader: bool, *, leader: str | None, term: int) -> None:
        self._term = term
        changed = is_leader != self.believes_leader or leader != self._leader_seen
        self.believes_leader = is_leader
        self._leader_seen = leader
        if changed and not self.closed:
            self._events.leader_changed(LeaderChange(is_leader=is_leader, leader=leader,
                                                     term=term))

    # ----------------------------------------------------------------- MetaGroup

    async def propose(self, command: raft_pb2.RaftCommand, *, timeout_s: float
                      ) -> raft_pb2.RaftResult:
        if self.closed:
            raise RaftlogError(Reason.SHUTTING_DOWN, "the metadata group is closed")
        data = encode_command(stamped(command, now_ms=self._clock.wall_ms()))
        return await self._raft.propose(self.node, data, timeout_s=timeout_s)

    def is_leader(self) -> bool:
        return self.believes_leader and not self.closed

    def is_ready(self) -> bool:
        return self.ready

    def leader_address(self) -> str | None:
        leader = self._raft.leader_for(self.node)
        return None if leader is None else raft_address(leader)

    async def add_member(self, address: str, *, timeout_s: float) -> None:
        raise RaftlogError(Reason.INVALID_ARGUMENT, "Raft membership changes are not simulated")

    async def remove_member(self, address: str, *, timeout_s: float) -> None:
        raise RaftlogError(Reason.INVALID_ARGUMENT, "Raft membership changes are not simulated")

    async def transfer_leadership(self, *, timeout_s: float) -> str:
        raise RaftlogError(Reason.INVALID_ARGUMENT, "leadership transfer is not simulated")

    def status(self) -> GroupStatus:
        return GroupStatus(
            self_address=self.self_address, term=self._term, is_leader=self.is_leader(),
            leader=self.leader_address(), commit_index=len(self._raft.log),
            applied_index=self.applied_index, log_entries=self._raft.journal[self.node],
            has_quorum=self._raft.leader is not None, ready=self.is_ready(), peers=())

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._events.loop = loop

    def close(self) -> None:
        self.closed = True
        self.believes_leader = False


if TYPE_CHECKING:
    def _keeps_the_protocol(group: SimMetaGroup) -> MetaGroup:
        return group  # mypy checks here that the view has the protocol's shape
