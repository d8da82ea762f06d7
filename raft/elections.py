"""Election rules raftlog adds around pysyncobj (which has no pre-vote and no leader
stickiness), kept pure: time comes in as arguments, nothing here touches pysyncobj. The plumbing
that applies them (message interception, the election deadline) is in raft/election_guard.py.

- **Pre-vote** (Raft thesis 9.6): a follower whose election timer runs out first asks the others
  whether they would vote for it; only with a majority of "yes" (itself included) does it raise
  its term and ask for real votes. An isolated node therefore never inflates its term, so its
  return does not depose a working leader.
- **Leader stickiness** (thesis 4.2.3): a member that heard from a leader within the minimum
  election timeout, or a leader that hears from a majority, refuses pre-votes and ignores vote
  requests, except those of a leadership transfer.
- **Adaptive timeouts**: timeouts are derived from the scheduling delay measured on the tick
  thread (the gap between consecutive ticks, worst in the last `election_delay_window_s`): at
  least `election_delay_factor` times it, never below the configured values, never above
  `adaptive_*_timeout_s_max` (all in base/limits.py). On an idle machine nothing changes; on a
  starved one elections wait instead of firing. A gap longer than the cap is an outage of this
  node (SIGSTOP, a frozen VM), not a delay, and is not counted.
- **A stuck node does not lead**: when the node's serving loop is stuck (node/cluster/liveness.py) a
  leader steps down and a follower does not stand for election.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from raftlog.base import limits


@dataclass(frozen=True)
class Timeouts:
    election_min_s: float
    election_max_s: float
    leader_fallback_s: float


def up_to_date(*, candidate_term: int, candidate_index: int, own_term: int,
               own_index: int) -> bool:
    """Raft's vote rule on logs: the candidate's last entry is at least as recent as ours."""
    return (candidate_term, candidate_index) >= (own_term, own_index)


def sticky(*, now_s: float, last_leader_contact_s: float, election_min_s: float,
           is_leader_with_quorum: bool) -> bool:
    """This member has a working leader (or is one): it refuses to help depose it."""
    return is_leader_with_quorum or now_s - last_leader_contact_s < election_min_s


@dataclass
class PreVote:
    """One follower's pre-vote round: started when its election timer runs out."""

    term: int = 0  # the term it would stand at
    started_s: float = -1e9
    grants: set[str] = field(default_factory=set)
    granted_until_s: float = -1e9

    def start(self, *, term: int, now_s: float) -> None:
        self.term, self.started_s, self.grants = term, now_s, set()

    def due(self, now_s: float) -> bool:
        return now_s - self.started_s >= limits.prevote_retry_s

    def grant(self, *, voter: str, term: int, members: int, now_s: float) -> bool:
        """Counts a "yes"; True when it makes a majority (this node counts itself)."""
        if term != self.term:
            return False
        self.grants.add(voter)
        if len(self.grants) + 1 > members / 2:
            self.granted_until_s = now_s + limits.prevote_grant_s
            return True
        return False

    def granted(self, now_s: float) -> bool:
        return now_s < self.granted_until_s


class AdaptiveTimeouts:
    """Raft timeouts that follow the measured scheduling delay of the tick thread."""

    def __init__(self, base: Timeouts) -> None:
        self.base = base
        self._last_tick_s: float | None = None
        self._gaps: collections.deque[tuple[float, float]] = collections.deque()
        self.current = base

    def on_tick(self, now_s: float) -> Timeouts:
        if self._last_tick_s is not None and \
                now_s - self._last_tick_s <= limits.adaptive_election_timeout_s_max:
            # A longer gap is an outage of this node (stopped, frozen), not a delay timeouts
            # could follow: counted, it would keep this member from granting pre-votes for
            # the cap's length (and so stall the election) for the whole window.
            gap = now_s - self._last_tick_s
            # A max-queue: gaps in decreasing order, the front the worst in the window.
            while self._gaps and self._gaps[-1][1] <= gap:
                self._gaps.pop()
            self._gaps.append((now_s, gap))
            while self._gaps[0][0] < now_s - limits.election_delay_window_s:
                self._gaps.popleft()
        self._last_tick_s = now_s
        self.current = self.for_delay(self._gaps[0][1] if self._gaps else 0.0)
        return self.current

    def for_delay(self, delay_s: float) -> Timeouts:
        base = self.base
        floor = limits.election_delay_factor * delay_s
        cap = limits.adaptive_election_timeout_s_max
        election_min = min(max(base.election_min_s, floor), cap)
        spread = base.election_max_s - base.election_min_s
        return Timeouts(
            election_min_s=election_min,
            election_max_s=min(election_min + spread, cap + spread),
            leader_fallback_s=min(max(base.leader_fallback_s, floor),
                                  limits.adaptive_leader_fallback_timeout_s_max))
