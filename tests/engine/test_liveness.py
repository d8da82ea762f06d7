"""LivenessMonitor's adaptive threshold: round trips of members that answer count as delay;
the answer that ends a member's outage does not. Whom it has heard from since it started."""

from __future__ import annotations

import asyncio

import pytest

from raftlog.base import limits
from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import replication_pb2
from raftlog.node.cluster.liveness import LivenessMonitor


class _Peers:
    """Ping answers after `rtt_s` on the fake clock, or fails while `down`."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.rtt_s = 0.001
        self.down = False

    async def ping(self, node_id: str, *, timeout_s: float) -> replication_pb2.PingReply:
        if self.down:
            self.clock.advance(timeout_s)
            raise RaftlogError(Reason.NODE_UNREACHABLE, "no answer")
        self.clock.advance(self.rtt_s)
        return replication_pb2.PingReply()


def _monitor() -> tuple[LivenessMonitor, _Peers, FakeClock]:
    clock = FakeClock()
    peers = _Peers(clock)
    monitor = LivenessMonitor(node_id="n1", members=lambda: ["n1", "n2"],
                              peers=peers, clock=clock)  # type: ignore[arg-type]
    return monitor, peers, clock


def test_slow_answers_raise_the_threshold() -> None:
    monitor, peers, _ = _monitor()
    peers.rtt_s = 0.5
    asyncio.run(monitor._ping("n2"))
    asyncio.run(monitor._ping("n2"))
    assert monitor.threshold_s() == pytest.approx(limits.liveness_delay_factor * 0.5)


def test_the_answer_that_ends_an_outage_leaves_the_threshold_alone() -> None:
    monitor, peers, clock = _monitor()
    asyncio.run(monitor._ping("n2"))  # heard
    peers.down = True
    for _ in range(5):  # silent (stopped, cut off) for several seconds
        asyncio.run(monitor._ping("n2"))
    assert monitor.silent_s("n2") > limits.failover_after_s
    peers.down, peers.rtt_s = False, 0.9  # back: the first answer is slow
    asyncio.run(monitor._ping("n2"))
    assert monitor.silent_s("n2") == 0.0
    assert monitor.threshold_s() == limits.failover_after_s
    clock.advance(0.1)
    asyncio.run(monitor._ping("n2"))  # a slow answer from a member that answers: a sample
    assert monitor.threshold_s() == pytest.approx(limits.liveness_delay_factor * 0.9)


def test_heard_from_is_an_answer_since_it_started() -> None:
    monitor, peers, clock = _monitor()
    assert monitor.heard_from("n1")  # itself
    assert not monitor.heard_from("n2")  # not pinged yet
    peers.down = True
    asyncio.run(monitor._ping("n2"))
    assert not monitor.heard_from("n2")  # pinged, no answer
    clock.advance(limits.failover_after_s * 2)  # silent past the usual threshold, yet it
    assert not monitor._silent_past("n2", limits.failover_after_s)  # may only be starting
    peers.down = False
    asyncio.run(monitor._ping("n2"))
    assert monitor.heard_from("n2")
    peers.down = True
    asyncio.run(monitor._ping("n2"))
    assert monitor.heard_from("n2")  # it answered once: silence is judged as usual from now
