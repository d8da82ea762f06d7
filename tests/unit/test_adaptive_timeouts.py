"""raft/elections.py AdaptiveTimeouts: timeouts follow the tick thread's scheduling delay, but
an outage of the node itself (a gap longer than the cap) is no delay to follow."""

from __future__ import annotations

import pytest

from raftlog.base import limits
from raftlog.raft.elections import AdaptiveTimeouts, Timeouts

BASE = Timeouts(election_min_s=0.15, election_max_s=0.35, leader_fallback_s=0.5)


def _ticks(timeouts: AdaptiveTimeouts, start_s: float, gaps: list[float]) -> float:
    now = start_s
    for gap in gaps:
        now += gap
        timeouts.on_tick(now)
    return now


def test_slow_ticks_raise_the_election_timeout() -> None:
    timeouts = AdaptiveTimeouts(BASE)
    _ticks(timeouts, 0.0, [0.01, 0.2, 0.01])
    assert timeouts.current.election_min_s == pytest.approx(limits.election_delay_factor * 0.2)


def test_a_stopped_node_does_not_stay_slow_to_elect_after_it_resumes() -> None:
    """SIGSTOP for 5 s, then normal ticks: the timeouts stay at the configured ones (counted,
    the gap would hold them at the cap for the whole delay window, and this member would
    refuse pre-votes that long after its leader stopped)."""
    timeouts = AdaptiveTimeouts(BASE)
    now = _ticks(timeouts, 0.0, [0.01] * 3)
    _ticks(timeouts, now, [limits.adaptive_election_timeout_s_max + 2.0, 0.01, 0.01])
    assert timeouts.current == BASE
