"""Failure detection and stream failover.

Every node pings every member (`LivenessMonitor`), so whichever node leads Raft already knows
who answered lately. The Raft leader runs `FailoverCoordinator`: a stream whose primary has not
answered for `failover_after_s` (longer than the primary's read lease) gets a new primary:

1. survey the other replicas with GetReplicaState(fence_epoch = epoch + 1): each first refuses
   the old epoch durably, then reports (epoch, last_seq); a majority of the replica set must
   answer, or the stream stays unavailable rather than promote an incomplete copy;
2. promote the most complete one (highest epoch, then last seq) with StreamPromote at
   epoch + 1, starting at its last seq + 1.

Because a majority is fenced before the survey answers, the old primary (which needs a
majority, itself included) can commit nothing more at the old epoch, and every message it did
commit is on at least one surveyed replica, so the most complete one holds them all (G1, G3).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

import grpc

from raftlog.node.clock import Clock
from raftlog.node.errors import RaftlogError
from raftlog.node.forwarding import ChannelPool
from raftlog.node.replication import lease_s, majority
from raftlog.raft.api import MetaGroup, ensure_ok
from raftlog.v1 import raft_pb2, replication_pb2, replication_pb2_grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lost:
    """A stream whose primary is lost, as the committed state said when that was noticed
    (the state's objects change under a coroutine that awaits)."""

    name: str
    primary: str
    replicas: tuple[str, ...]
    fence_epoch: int

ping_period_s = 0.1
ping_timeout_s = 0.25
failover_after_s = 0.8  # silence before a primary is replaced; must exceed lease_s
check_period_s = 0.05
survey_timeout_s = 0.5
failover_retry_s = 0.5  # between attempts for one stream
if failover_after_s <= lease_s:
    raise ValueError("failover_after_s must exceed the primary's lease")


class LivenessMonitor:
    """Pings every other member; `silent_s(node)` is how long it has not answered."""

    def __init__(self, *, node_id: str, members: Any, pool: ChannelPool, clock: Clock) -> None:
        self._node_id = node_id
        self._members = members  # callable -> dict node_id -> grpc address
        self._pool = pool
        self._clock = clock
        self._started_s = clock.monotonic_s()
        self.last_ok_s: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._started_s = self._clock.monotonic_s()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="liveness")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def silent_s(self, node_id: str) -> float:
        if node_id == self._node_id:
            return 0.0
        last = self.last_ok_s.get(node_id, self._started_s)
        return self._clock.monotonic_s() - last

    async def _ping(self, node_id: str, address: str) -> None:
        stub: Any = replication_pb2_grpc.ReplicationStub(  # type: ignore[no-untyped-call]
            self._pool.get(address))
        try:
            await stub.Ping(replication_pb2.PingRequest(from_node=self._node_id),
                            timeout=ping_timeout_s)
        except grpc.aio.AioRpcError:
            return
        self.last_ok_s[node_id] = self._clock.monotonic_s()

    async def _run(self) -> None:
        while True:
            members = {n: a for n, a in self._members().items() if n != self._node_id}
            await asyncio.gather(*(self._ping(n, a) for n, a in members.items()),
                                 asyncio.sleep(ping_period_s))


class FailoverCoordinator:
    def __init__(self, *, node_id: str, group: MetaGroup, liveness: LivenessMonitor,
                 pool: ChannelPool, clock: Clock) -> None:
        self._node_id = node_id
        self._group = group
        self._liveness = liveness
        self._pool = pool
        self._clock = clock
        self._attempted_s: dict[str, float] = {}
        self._running: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self.failovers: list[dict[str, Any]] = []

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="failover")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(check_period_s)
            if not self._group.is_leader():
                continue
            try:
                self._check()
            except Exception:
                log.exception("failover check failed")

    def _check(self) -> None:
        now = self._clock.monotonic_s()
        with self._group.read_state() as state:
            lost = [Lost(s.name, s.primary, tuple(s.replicas), s.fence_epoch)
                    for s in state.streams.values()
                    if s.primary != self._node_id
                    and (s.primary not in state.members
                         or self._liveness.silent_s(s.primary) > failover_after_s)]
            addresses = {m.node_id: m.grpc_address for m in state.members.values()}
        for stream in lost:
            if stream.name in self._running or \
                    now - self._attempted_s.get(stream.name, -1e9) < failover_retry_s:
                continue
            self._attempted_s[stream.name] = now
            self._running.add(stream.name)
            task = asyncio.get_running_loop().create_task(self._fail_over(stream, addresses))
            task.add_done_callback(functools.partial(self._finished, stream.name))

    def _finished(self, name: str, _: asyncio.Task[None]) -> None:
        self._running.discard(name)

    async def _survey(self, stream: Lost, node_id: str, address: str
                      ) -> replication_pb2.ReplicaState | None:
        stub: Any = replication_pb2_grpc.ReplicationStub(  # type: ignore[no-untyped-call]
            self._pool.get(address))
        try:
            state: replication_pb2.ReplicaState = await stub.GetReplicaState(
                replication_pb2.GetReplicaStateRequest(stream=stream.name,
                                                       fence_epoch=stream.fence_epoch + 1),
                timeout=survey_timeout_s)
        except grpc.aio.AioRpcError as err:
            log.info("failover of %s: %s did not answer the survey: %s", stream.name, node_id,
                     err.code())
            return None
        return state if state.exists else None

    async def _fail_over(self, stream: Lost, addresses: dict[str, str]) -> None:
        started = time.perf_counter()
        candidates = [n for n in stream.replicas if n != stream.primary and n in addresses]
        answers = await asyncio.gather(*(self._survey(stream, n, addresses[n])
                                         for n in candidates))
        states = [a for a in answers if a is not None]
        if len(states) < majority(len(stream.replicas)):
            log.warning("stream %s: primary %s is lost and only %d of %d replicas answered; "
                        "it stays unavailable", stream.name, stream.primary, len(states),
                        len(stream.replicas))
            return
        best = max(states, key=lambda s: (s.epoch, s.last_seq))
        command = raft_pb2.RaftCommand(now_ms=self._clock.wall_ms(), stream_promote=(
            raft_pb2.StreamPromote(stream=stream.name, new_primary=best.node_id,
                                   new_fence_epoch=stream.fence_epoch + 1,
                                   epoch_start_seq=best.last_seq + 1,
                                   replicas=stream.replicas)))
        try:
            ensure_ok(await self._group.propose(command, timeout_s=survey_timeout_s * 4))
        except RaftlogError as err:
            log.warning("stream %s: promoting %s failed: %s", stream.name, best.node_id, err)
            return
        took_ms = (time.perf_counter() - started) * 1000
        log.warning("stream %s: primary %s lost; promoted %s at epoch %d from seq %d "
                    "(survey and commit took %.0f ms)", stream.name, stream.primary,
                    best.node_id, stream.fence_epoch + 1, best.last_seq + 1, took_ms)
        self.failovers.append({"stream": stream.name, "from": stream.primary,
                               "to": best.node_id, "epoch": stream.fence_epoch + 1,
                               "start_seq": best.last_seq + 1, "ms": took_ms})
