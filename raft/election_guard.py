"""`ElectionGuard`, the mixin of `RaftGroup` (raft/group.py) that applies raftlog's election
rules (raft/elections.py: pre-vote, leader stickiness, a stuck node does not lead) to pysyncobj,
which has none of them.

It owns, all on the tick thread:
- the guard run at the start of every tick (`_guard_elections`, called by
  `_MetaSyncObj._onTick`): a follower whose election deadline comes stands only after a pre-vote
  majority and never while its serving loop is stuck; a leader whose loop is stuck steps down;
- the messages `_DurableTransport` (raft/syncobj_glue.py) hands over before pysyncobj sees them:
  pre-votes and their answers, vote requests (dropped while a leader works), append_entries (the
  last leader contact; a leader below this member's term is told that term, and adopts it),
  and timeout_now (a leadership transfer to this node);
- `leader_contact_age_s`, read by the node (any thread).

It reads and writes pysyncobj's private election state (`_SyncObj__raftState`,
`_SyncObj__raftElectionDeadline`, ...), as read from pysyncobj 0.3.17.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pysyncobj import FAIL_REASON
from pysyncobj.syncobj import _RAFT_STATE

from raftlog.base import limits
from raftlog.raft import elections
from raftlog.raft.syncobj_glue import (
    NEWER_TERM,
    PREVOTE,
    PREVOTE_REPLY,
    TRANSFER_FLAG,
    _MetaSyncObj,
    _raft_now,
)

if TYPE_CHECKING:
    from raftlog.raft.group import RaftTimings

log = logging.getLogger(__name__)


class ElectionGuard:
    """Election plumbing of `RaftGroup`; the attributes below are set by `RaftGroup.__init__`."""

    _obj: _MetaSyncObj
    _timings: RaftTimings
    _stuck: Callable[[], bool]  # is the node's serving loop stuck? (any thread)
    _timeouts: elections.AdaptiveTimeouts
    _prevote: elections.PreVote
    _last_leader_contact_s: float
    _transfer_asked_s: float
    election_counters: collections.Counter[str]

    def _guard_elections(self, now: float) -> None:
        """Tick thread: a follower stands for election only after a pre-vote majority and
        never while its serving loop is stuck; a leader whose loop is stuck steps down."""
        obj = self._obj
        state = obj._SyncObj__raftState
        stuck = self._stuck()
        if state == _RAFT_STATE.LEADER:
            if stuck:
                self._step_down(now)
            return
        if obj._SyncObj__transferInProgress:
            return
        others = obj._SyncObj__otherNodes
        if obj._SyncObj__raftElectionDeadline > now + 2 * self._timings.tick_period_s:
            return
        if stuck:
            obj._SyncObj__raftElectionDeadline = now + self._timeouts.current.election_max_s
            return
        if not others or self._prevote.granted(now):
            return  # the election may start on the next tick
        # No word from a leader for an election timeout: say there is none (callers fail fast)
        # while the pre-vote decides whether to stand.
        obj._SyncObj__raftLeader = None
        obj._SyncObj__raftElectionDeadline = now + limits.prevote_retry_s
        if self._prevote.due(now):
            term = int(obj.raftCurrentTerm) + 1
            self._prevote.start(term=term, now_s=now)
            self.election_counters["prevotes_asked"] += 1
            for node in list(others):
                obj._SyncObj__transport.send(node, {
                    "type": PREVOTE, "term": term,
                    "last_log_index": obj._SyncObj__getCurrentLogIndex(),
                    "last_log_term": obj._SyncObj__getCurrentLogTerm()})

    def _step_down(self, now: float) -> None:
        obj = self._obj
        log.warning("raft: this node's serving loop is stuck; giving up Raft leadership")
        self.election_counters["stepped_down_stuck"] += 1
        obj.transferLeadership()  # best effort: needs a follower that is fully caught up
        obj._SyncObj__setState(_RAFT_STATE.FOLLOWER)
        obj._SyncObj__raftLeader = None
        obj._SyncObj__raftElectionDeadline = now + self._timeouts.current.election_max_s

    def _hand_over_leadership(self) -> None:
        """Tick thread, for `RaftGroup.transfer_leadership`: pysyncobj's TimeoutNow to a fully
        caught-up member; once sent, this node stops leading at once."""
        sent: list[int] = []
        obj = self._obj
        obj.transferLeadership(callback=lambda _, fail_reason: sent.append(fail_reason))
        if sent == [FAIL_REASON.SUCCESS]:
            obj._SyncObj__setState(_RAFT_STATE.FOLLOWER)
            obj._SyncObj__raftLeader = None
            obj._SyncObj__raftElectionDeadline = (
                _raft_now() + self._timeouts.current.election_max_s)

    def _sticky(self, now: float) -> bool:
        return elections.sticky(
            now_s=now, last_leader_contact_s=self._last_leader_contact_s,
            election_min_s=self._timeouts.current.election_min_s,
            is_leader_with_quorum=self._obj._SyncObj__raftState == _RAFT_STATE.LEADER)

    def _ignores_vote(self, node: Any, message: dict[str, Any]) -> bool:
        """Tick thread: a vote request while this member has a working leader is dropped
        before pysyncobj sees it (it would adopt the higher term and depose the leader).
        Except on the leader, from a member that has stopped answering it: that member may
        have raised its term past the leader's (two candidates raced) and then ignores the
        leader's lower-term entries for good; letting its request through makes the leader
        adopt the term and a new election include it (what a Raft reply's term would do)."""
        now = _raft_now()
        if message.get(TRANSFER_FLAG) or not self._sticky(now):
            return False
        obj = self._obj
        if obj._SyncObj__raftState == _RAFT_STATE.LEADER:
            answered = obj._SyncObj__lastResponseTime.get(node, now)
            if now - answered > self._timeouts.current.election_min_s:
                self.election_counters["votes_from_silent_members"] += 1
                return False
        self.election_counters["votes_ignored"] += 1
        return True

    def _on_timeout_now(self, node: Any) -> None:
        """The leader hands leadership to this node (pysyncobj starts the election on the
        next tick, and clears its own flag before sending the vote requests)."""
        if node == self._obj._getLeader():
            self._transfer_asked_s = _raft_now()

    def _transferring(self) -> bool:
        """Tick thread: this node's vote requests are those of a leadership transfer."""
        return _raft_now() - self._transfer_asked_s < self._timeouts.current.election_max_s

    def _on_append_entries(self, transport: Any, node: Any, message: dict[str, Any]) -> None:
        """Tick thread: notes the leader's contact. Entries from a leader below this member's
        term get this member's term in answer (pysyncobj drops them without a word). A member
        whose term ran past the leader's (two candidates raced, at start or after a partition)
        would otherwise stay out for good: its pre-votes never pass while the leader works, and
        it sends no vote request the leader could learn the term from. Told, the leader steps
        down and the next election includes this member (Raft's reply term; etcd answers so
        under pre-vote too)."""
        term, own_term = int(message.get("term", 0)), int(self._obj.raftCurrentTerm)
        if term >= own_term:
            self._last_leader_contact_s = _raft_now()
            return
        self.election_counters["stale_appends_answered"] += 1
        transport.send(node, {"type": NEWER_TERM, "term": own_term})

    def _on_newer_term(self, node: Any, message: dict[str, Any]) -> None:
        """Tick thread: a member answered this node's entries with a higher term: adopt it
        and follow (a leader steps down); the next election runs with every member."""
        obj = self._obj
        term = int(message.get("term", 0))
        if term <= int(obj.raftCurrentTerm):
            return
        log.warning("raft: %s is at term %d, above this node's %d; %s", node.address, term,
                    obj.raftCurrentTerm,
                    "stepping down" if obj._SyncObj__raftState == _RAFT_STATE.LEADER
                    else "adopting it")
        self.election_counters["newer_terms_adopted"] += 1
        obj._SyncObj__setCurrentTerm(term, None)
        obj._SyncObj__setState(_RAFT_STATE.FOLLOWER)
        obj._SyncObj__raftLeader = None
        obj._SyncObj__raftElectionDeadline = (
            _raft_now() + self._timeouts.current.election_min_s)

    def _on_prevote_message(self, transport: Any, node: Any, message: dict[str, Any]) -> None:
        """Tick thread: answers a pre-vote request, or counts an answer to ours."""
        obj = self._obj
        now = _raft_now()
        term = int(message.get("term", 0))
        if message["type"] == PREVOTE:
            granted = (term > int(obj.raftCurrentTerm) and not self._sticky(now)
                       and elections.up_to_date(
                           candidate_term=int(message.get("last_log_term", 0)),
                           candidate_index=int(message.get("last_log_index", 0)),
                           own_term=int(obj._SyncObj__getCurrentLogTerm()),
                           own_index=int(obj._SyncObj__getCurrentLogIndex())))
            self.election_counters["prevotes_granted" if granted else "prevotes_denied"] += 1
            transport.send(node, {"type": PREVOTE_REPLY, "term": term, "granted": granted})
            return
        if message.get("granted") and self._prevote.grant(
                voter=str(node.id), term=term, members=len(obj._SyncObj__otherNodes) + 1,
                now_s=now):
            obj._SyncObj__raftElectionDeadline = 0  # stand for election on the next tick
            self.election_counters["elections_started"] += 1

    def leader_contact_age_s(self) -> float:
        """Seconds since this node last heard from a Raft leader (0 while it leads)."""
        if self._obj._isLeader():
            return 0.0
        return _raft_now() - self._last_leader_contact_s
