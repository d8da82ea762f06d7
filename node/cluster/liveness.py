"""Who is alive, judged from the path that serves requests, robust to a busy machine.

- `LoopHeartbeat`: a task on the node's event loop that notes every `loop_beat_period_s` that the
  loop ran. `late_s()` (readable from any thread, e.g. pysyncobj's tick thread) says how long
  the loop has been stuck; a node whose loop is stuck stops leading Raft
  (raft/election_guard.py) and, since Ping is answered by the same loop, stops answering its
  peers.
- `LivenessMonitor`: pings every other member's peer listener every `liveness_ping_period_s`. One
  verdict per node, not per stream: a member is *lost* when this node has not heard from it
  for `threshold_s()` AND a majority of the other members (this one included) report the same
  in their own Ping replies. So a node that only this node cannot reach (a partition between
  two nodes, or this node's own scheduling delay) is not failed over, while a dead, stopped or
  isolated node is.
- Thresholds adapt to measured delay: `threshold_s()` is `failover_after_s`, raised to
  `liveness_delay_factor` times the worst scheduling delay seen in the last
  `liveness_delay_window_s` (this loop's lateness, ping round trips), capped at
  `failover_after_s_max`. On an idle machine it stays at `failover_after_s`; on a starved one
  it grows instead of firing. A ping sent to a member already silent past the threshold is no
  sample: the answer that ends its outage measures the outage.

Every timing named here is in base/limits.py ("Liveness"), read at use time.

Ping replies also carry each member's stream troubles (streams it is named primary of but
cannot serve, or fences no committed epoch explains): `troubles()` hands the fresh ones to the
failover coordinator.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError
from raftlog.internal import replication_pb2
from raftlog.node.transport.peer import PeerClient

log = logging.getLogger(__name__)


def majority(count: int) -> int:
    return count // 2 + 1


class LoopHeartbeat:
    """Notes that the event loop runs; `late_s()` is how long it has not (0 when on time)."""

    def __init__(self) -> None:
        self._last_beat_s = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self.delays = _Maxima(limits.liveness_delay_window_s)

    def start(self) -> None:
        self._last_beat_s = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-heartbeat")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def late_s(self) -> float:
        """Thread-safe: seconds the loop is behind its heartbeat (0.0 when on time)."""
        return max(0.0, time.monotonic() - self._last_beat_s - limits.loop_beat_period_s)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(limits.loop_beat_period_s)
            now = time.monotonic()
            late_s = now - self._last_beat_s - limits.loop_beat_period_s
            if late_s <= limits.failover_after_s_max:  # longer: this node was stopped, an
                self.delays.add(now, late_s)          # outage, not a delay to adapt to
            self._last_beat_s = now


class _Maxima:
    """The maximum of values seen in the last `window_s` (per-second buckets)."""

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._buckets: collections.deque[tuple[int, float]] = collections.deque()

    def add(self, now_s: float, value: float) -> None:
        second = int(now_s)
        if self._buckets and self._buckets[-1][0] == second:
            if value > self._buckets[-1][1]:
                self._buckets[-1] = (second, value)
        else:
            self._buckets.append((second, value))
        while self._buckets and self._buckets[0][0] < now_s - self._window_s:
            self._buckets.popleft()

    def max(self, now_s: float) -> float:
        return max((v for s, v in self._buckets if s >= now_s - self._window_s), default=0.0)


@dataclass
class _Peer:
    first_try_s: float  # the first ping this node sent it
    last_ok_s: float | None = None  # its last answer (None: never answered yet)
    reply: replication_pb2.PingReply | None = None
    reply_s: float = -1e9
    delays: _Maxima = field(default_factory=lambda: _Maxima(limits.liveness_delay_window_s))


class LivenessMonitor:
    """Pings every other member; see the module docstring."""

    def __init__(self, *, node_id: str, members: Callable[[], list[str]], peers: PeerClient,
                 clock: Clock, heartbeat: LoopHeartbeat | None = None) -> None:
        self._node_id = node_id
        self._members = members  # the members' node ids
        self._peers = peers
        self._clock = clock
        self.heartbeat = heartbeat or LoopHeartbeat()
        self._state: dict[str, _Peer] = {}
        self._task: asyncio.Task[None] | None = None
        self._threshold_s = limits.failover_after_s  # threshold_s() as of the last ping round

    def start(self) -> None:
        self.heartbeat.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="liveness")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.heartbeat.stop()

    # ----------------------------------------------------------------- verdicts

    def silent_s(self, node_id: str) -> float:
        """How long it has not answered (since the first ping, if it never did)."""
        if node_id == self._node_id:
            return 0.0
        peer = self._state.get(node_id)
        if peer is None:
            return 0.0  # not pinged yet: nothing known against it
        last = peer.last_ok_s if peer.last_ok_s is not None else peer.first_try_s
        return self._clock.monotonic_s() - last

    def heard_from(self, node_id: str) -> bool:
        """It has answered a ping since this node started (itself: always). Until then it has
        the never-answered allowance below."""
        peer = self._state.get(node_id)
        return node_id == self._node_id or (peer is not None and peer.last_ok_s is not None)

    def _silent_past(self, node_id: str, threshold_s: float) -> bool:
        """Silent longer than `threshold_s`; a member that never answered since this node
        started gets `failover_after_s_max` (it may only be starting, or its channel backing
        off from an early refusal)."""
        peer = self._state.get(node_id)
        if peer is not None and peer.last_ok_s is None:
            threshold_s = max(threshold_s, limits.failover_after_s_max)
        return self.silent_s(node_id) > threshold_s

    def delay_s(self) -> float:
        """The worst scheduling delay seen lately: this loop's lateness or a ping's round
        trip."""
        now = self._clock.monotonic_s()
        return max([self.heartbeat.delays.max(now),
                    *(p.delays.max(now) for p in self._state.values())])

    def threshold_s(self) -> float:
        return min(limits.failover_after_s_max,
                   max(limits.failover_after_s, limits.liveness_delay_factor * self.delay_s()))

    def unreachable(self, node_id: str) -> bool:
        """Silent for longer than the read lease (and than the recent scheduling delay allows):
        a call forwarded there would only wait for its deadline."""
        return self._silent_past(node_id, max(limits.unreachable_after_s,
                                              limits.liveness_delay_factor * self.delay_s()))

    def loop_stuck(self) -> bool:
        """Thread-safe: this node's serving loop is late past the failover threshold (as of
        the last ping round), so it must not lead Raft (raft/election_guard.py asks)."""
        return self.heartbeat.late_s() > self._threshold_s

    def lost(self, node_id: str) -> bool:
        """Silent past the threshold here and, by their own reports, to a majority of the
        other members (this one included)."""
        threshold_s = self.threshold_s()
        if node_id == self._node_id or not self._silent_past(node_id, threshold_s):
            return False
        voters = [n for n in self._members() if n != node_id]
        agree = 1  # this node
        now = self._clock.monotonic_s()
        for voter in voters:
            peer = self._state.get(voter)
            if voter == self._node_id or peer is None or peer.reply is None \
                    or now - peer.reply_s > limits.liveness_view_fresh_s:
                continue
            if peer.reply.silent_ms.get(node_id, 0) >= threshold_s * 1000:
                agree += 1
        return agree >= majority(len(voters))

    def silences_ms(self) -> dict[str, int]:
        """The members this node has not heard from lately (for its own Ping replies)."""
        found = {}
        for node_id in self._members():
            silent_ms = int(self.silent_s(node_id) * 1000)
            if silent_ms >= limits.liveness_report_silence_ms_min:
                found[node_id] = min(silent_ms, 2**32 - 1)
        return found

    def troubles(self) -> list[tuple[str, replication_pb2.StreamTrouble]]:
        """(reporting node, trouble) from every member's latest fresh Ping reply."""
        now = self._clock.monotonic_s()
        return [(node_id, trouble) for node_id, peer in list(self._state.items())
                if peer.reply is not None and now - peer.reply_s <= limits.liveness_trouble_fresh_s
                for trouble in peer.reply.troubles]

    def forget(self, node_id: str) -> None:
        self._state.pop(node_id, None)

    # ----------------------------------------------------------------- pinging

    async def _ping(self, node_id: str) -> None:
        sent = self._clock.monotonic_s()
        peer = self._state.get(node_id)
        if peer is None:
            peer = self._state[node_id] = _Peer(first_try_s=sent)
        try:
            reply = await self._peers.ping(node_id, timeout_s=limits.liveness_ping_timeout_s)
        except (grpc.aio.AioRpcError, RaftlogError):
            return
        now = self._clock.monotonic_s()
        silent_when_sent_s = sent - (peer.last_ok_s if peer.last_ok_s is not None
                                     else peer.first_try_s)
        peer.last_ok_s = now
        peer.reply, peer.reply_s = reply, now
        if silent_when_sent_s <= self._threshold_s:
            # A round trip is a delay sample, unless the ping went to a member already silent
            # past the threshold: the answer that ends a pause, a partition or a restart tells
            # of that member's outage, not of delay here, and counting it would make this node
            # slow to fail over the next lost primary for the whole delay window.
            peer.delays.add(now, now - sent)

    async def _run(self) -> None:
        in_flight: dict[str, asyncio.Task[None]] = {}
        while True:
            members = [n for n in self._members() if n != self._node_id]
            for node_id in members:
                task = in_flight.get(node_id)
                if task is None or task.done():  # a slow peer never piles pings up
                    in_flight[node_id] = asyncio.get_running_loop().create_task(
                        self._ping(node_id))
            for node_id in [n for n in in_flight if n not in members]:
                in_flight.pop(node_id).cancel()
                self.forget(node_id)
            self._threshold_s = self.threshold_s()
            await asyncio.sleep(limits.liveness_ping_period_s)
