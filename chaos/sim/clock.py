"""Simulated clocks: each node's `Clock` (base/clock.py) read off the virtual event loop, with a
wall clock that faults can jump and a monotonic clock that may run a little fast or slow, and a
`LoopHeartbeat` (node/cluster/liveness.py) that measures the virtual loop instead of
`time.monotonic()`.

Why both: node code times its waits with the event loop (`asyncio.sleep`, `wait_for`), which is
virtual and shared, and reads `Clock` for leases, link timeouts, liveness silences (monotonic)
and message timestamps, dedupe windows and command stamps (wall). A node's clocks belong to its
machine: they survive a crash and restart of the node.
"""

from __future__ import annotations

import asyncio

from raftlog.node.cluster.liveness import LoopHeartbeat

wall_epoch_ms = 1_700_000_000_000  # the wall clock of every node at virtual time 0
monotonic_start_s = 1_000.0  # a node's monotonic clock at virtual time 0


class SimClock:
    """One node's `Clock`: monotonic = start + virtual elapsed x `rate`; wall = epoch + virtual
    elapsed + the sum of the jumps applied so far (jumps may go back)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, rate: float = 1.0) -> None:
        self._loop = loop
        self.rate = rate
        self.wall_offset_ms = 0

    def wall_ms(self) -> int:
        return wall_epoch_ms + int(self._loop.time() * 1000) + self.wall_offset_ms

    def monotonic_s(self) -> float:
        return monotonic_start_s + self._loop.time() * self.rate

    def jump_wall(self, offset_ms: int) -> None:
        """The wall clock jumps by `offset_ms` (negative: back), as NTP stepping it does."""
        self.wall_offset_ms += offset_ms


class SimLoopHeartbeat(LoopHeartbeat):
    """`LoopHeartbeat` for the virtual loop, which is never late: its timers fire exactly when
    due, so the real heartbeat would only ever note delays of 0 (at a cost of one wake-up per
    node every `limits.loop_beat_period_s`). The real one reads `time.monotonic()`, which in a
    simulation measures the host, not the simulated node: its delays would change the liveness
    thresholds from run to run (see the report's seams)."""

    def start(self) -> None:
        """No task: nothing to measure."""

    def late_s(self) -> float:
        return 0.0
