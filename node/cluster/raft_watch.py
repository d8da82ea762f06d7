"""Says in the node's log when the metadata group has had no leader for a while, and why as far
as this node can see: its term, which peers it is connected to, whether it ever caught up, and
the frames its Raft transport refused.

A node that cannot reach a leader otherwise logs nothing at all (it serves gRPC and answers
NO_LEADER), which leaves an operator, or a failed test, with no way to tell a partition from a
peer that refuses this node's frames."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from raftlog.base import limits
from raftlog.raft.api import GroupStatus

log = logging.getLogger(__name__)


def leaderless_report(status: GroupStatus, leaderless_s: float) -> str:
    """One line: how long, the term, each peer and whether it is connected, and the counters
    that point at a transport that refuses what it receives."""
    peers = ", ".join(f"{peer.address} {'connected' if peer.connected else 'not connected'}"
                      for peer in status.peers) or "none"
    counters = {key: status.journal[key] for key in ("refused_frames", "events_dropped")
                if status.journal.get(key)}
    extra = "".join(f", {key} {value}" for key, value in counters.items())
    failure = f", stopped: {status.failure}" if status.failure else ""
    return (f"raft: no leader for {leaderless_s:.0f} s (term {status.term}, caught up once: "
            f"{status.ready}, applied index {status.applied_index}; peers: {peers}{extra}"
            f"{failure})")


async def warn_while_leaderless(status: Callable[[], GroupStatus], *,
                                period_s: float = limits.raft_leaderless_warn_s,
                                monotonic: Callable[[], float] = time.monotonic) -> None:
    """Forever: every `period_s` without a leader, one warning (leaderless_report); one info
    line when a leader is back after a warning."""
    since: float | None = None
    warned = False
    while True:
        await asyncio.sleep(period_s)
        now = status()
        if now.leader is not None:
            if warned:
                log.info("raft: leader %s is back after %.1f s without one", now.leader,
                         monotonic() - since if since is not None else 0.0)
            since, warned = None, False
            continue
        if since is None:
            since = monotonic() - period_s  # leaderless since at most one period ago
        log.warning("%s", leaderless_report(now, monotonic() - since))
        warned = True
