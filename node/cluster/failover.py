"""Stream failover and repair, run by the Raft leader: a retried, idempotent procedure that ends
only when the metadata names a primary that holds the current fence epoch and serves writes.

What needs it (checked every `failover_check_period_s`, all per node, never a scan of every
stream):
- the streams led by a member the liveness monitor judges *lost* (node/cluster/liveness.py:
  silent here and to a majority of the members);
- the streams a member reports in trouble in its Ping replies (node/cluster/coordinator.py
  `ClusterNode.troubles`): named primary but deposed or not serving, or holding a fence above
  the committed epoch (a survey that fenced and a promote that never committed), or a primary
  that restarted (it never resumes its old epoch: its copy may lack an unsynced tail its
  replicas hold; reported at once); this node's own troubles too, so the leader's own streams
  are repaired like any other.

One round at a time handles every such stream together (bounded concurrency; no survey storm
when many streams change at once), in two phases per replica node, each one `Survey` call
carrying all the round's streams that node holds:
1. read only: each replica's position (no fence). A stream whose replica set did not answer
   with a majority is left alone: no fence is left behind that could depose a working primary
   (the stream is retried after `failover_retry_s`);
2. fence at epoch + 1 on the nodes that answered (a primary still serving there stops taking
   writes), and read the positions again. With a majority fenced, the old primary can commit
   nothing more at the old epoch, and every message it committed is on one of them, so the
   most complete copy (highest epoch, then last seq) holds all of them (G1, G3).
Then one `StreamPromotes` Raft entry (or a few, within the command size limit) promotes the most
complete copy of every stream at epoch + 1 from its last seq + 1. Phase 2 at the same epoch is
idempotent, so a round that fails anywhere (a node stops answering, leadership moves before the
promote commits) is simply run again, by this node or the next leader, which learns of the
stream from the same lost-node verdict or trouble report.

Timings and bounds are in base/limits.py ("Failover"), read at use time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError
from raftlog.internal import raft_pb2, replication_pb2
from raftlog.node.cluster.liveness import LivenessMonitor, majority
from raftlog.node.cluster.replica_sets import most_complete
from raftlog.node.transport import logctx
from raftlog.node.transport.peer import PeerClient
from raftlog.raft.api import MetaGroup, ensure_ok
from raftlog.raft.state_model import promotes_max

__all__ = ["FailoverCoordinator", "LivenessMonitor", "Need"]

log = logging.getLogger(__name__)

if limits.failover_after_s <= limits.primary_lease_s:
    raise ValueError("limits.failover_after_s must exceed limits.primary_lease_s")


@dataclass(frozen=True)
class Need:
    """A stream to fail over or repair, as the committed state said when it was noticed."""

    name: str
    primary: str
    replicas: tuple[str, ...]
    fence_epoch: int
    why: str


class FailoverCoordinator:
    def __init__(self, *, node_id: str, group: MetaGroup, liveness: LivenessMonitor,
                 peers: PeerClient, clock: Clock,
                 own_troubles: Callable[[], Iterable[replication_pb2.StreamTrouble]] = tuple,
                 busy: Callable[[str], bool] = lambda name: False) -> None:
        """`own_troubles()`: this node's trouble reports; `busy(stream)`: a placement change
        of the stream is in progress here (it fences and moves authority itself)."""
        self._node_id = node_id
        self._group = group
        self._liveness = liveness
        self._peers = peers
        self._clock = clock
        self._own_troubles = own_troubles
        self._busy = busy
        self._attempted_s: dict[str, float] = {}
        self._round: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.failovers: list[dict[str, Any]] = []
        self.rounds = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="failover")

    async def stop(self) -> None:
        for task in (self._task, self._round):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(limits.failover_check_period_s)
            if not self._group.is_leader() or (self._round is not None
                                               and not self._round.done()):
                continue
            try:
                needs = self.needs()
            except Exception:
                log.exception("failover check failed")
                continue
            if needs:
                self._round = asyncio.get_running_loop().create_task(
                    self._run_round(needs), name="failover-round")

    # ----------------------------------------------------------------- what needs it

    def needs(self) -> list[Need]:
        """The streams to handle now (lost primaries, reported troubles), due for an attempt."""
        now = self._clock.monotonic_s()
        found: dict[str, Need] = {}
        troubles = [*self._liveness.troubles(),
                    *((self._node_id, t) for t in self._own_troubles())]
        with self._group.read_state() as state:
            for node_id in list(state.by_primary):
                if node_id != self._node_id and (node_id not in state.members
                                                 or self._liveness.lost(node_id)):
                    for name in state.streams_led_by(node_id):
                        stream = state.streams[name]
                        found[name] = Need(name, stream.primary, tuple(stream.replicas),
                                           stream.fence_epoch, f"{node_id} is lost")
            for reporter, trouble in troubles:
                troubled = state.streams.get(trouble.stream)
                if troubled is None or troubled.fence_epoch != trouble.assignment_epoch \
                        or troubled.name in found:
                    continue
                found[troubled.name] = Need(troubled.name, troubled.primary,
                                            tuple(troubled.replicas), troubled.fence_epoch,
                                            f"{reporter} reports: {trouble.why}")
        due = [need for need in found.values()
               if not self._busy(need.name)
               and now - self._attempted_s.get(need.name, -1e9) >= limits.failover_retry_s]
        round_max = limits.failover_round_streams_max
        for need in due[:round_max]:
            self._attempted_s[need.name] = now
        if len(self._attempted_s) > 4 * round_max:  # forget old attempts
            self._attempted_s = {k: v for k, v in self._attempted_s.items()
                                 if now - v < limits.failover_retry_s}
        return due[:round_max]

    # ----------------------------------------------------------------- one round

    async def _run_round(self, needs: list[Need]) -> None:
        started = time.perf_counter()
        self.rounds += 1
        try:
            reachable = await self._survey(needs, fence=False)
            ready = [n for n in needs
                     if len(reachable.get(n.name, {})) >= majority(len(n.replicas))]
            if len(ready) < len(needs):
                log.warning("failover: %d of %d streams have too few replicas answering; "
                            "they stay as they are for now (e.g. %s)", len(needs) - len(ready),
                            len(needs), [n.name for n in needs if n not in ready][:3])
            if not ready:
                return
            fenced = await self._survey(ready, fence=True, only=reachable)
            promotes = []
            for need in ready:
                states = fenced.get(need.name, {})
                if len(states) < majority(len(need.replicas)):
                    continue
                best = most_complete(states.values())
                promotes.append(raft_pb2.StreamPromote(
                    stream=need.name, new_primary=best.node_id,
                    new_fence_epoch=need.fence_epoch + 1, epoch_start_seq=best.last_seq + 1,
                    replicas=need.replicas))
            await self._promote(promotes, needs={n.name: n for n in ready}, started=started)
        except RaftlogError as err:
            log.warning("failover round of %d streams failed: %s; retrying", len(needs), err)
        except Exception:
            log.exception("failover round of %d streams failed; retrying", len(needs))

    async def _survey(self, needs: list[Need], *, fence: bool,
                      only: dict[str, dict[str, replication_pb2.ReplicaState]] | None = None
                      ) -> dict[str, dict[str, replication_pb2.ReplicaState]]:
        """Every replica node's position in each stream it holds, one Survey call per node;
        stream -> node -> state (nodes that did not answer, or hold no copy, are absent)."""
        members = set(self._group.state.members)
        threshold_s = self._liveness.threshold_s()
        # A node silent that long would only make the round wait for its timeout.
        askable = {n for n in members if self._liveness.silent_s(n) <= threshold_s}
        per_node: dict[str, list[Need]] = {}
        for need in needs:
            for node_id in need.replicas:
                if node_id in askable and (only is None or node_id in only.get(need.name, {})):
                    per_node.setdefault(node_id, []).append(need)
        replies = await asyncio.gather(*(self._ask(node_id, items, fence=fence)
                                         for node_id, items in per_node.items()))
        found: dict[str, dict[str, replication_pb2.ReplicaState]] = {}
        for node_id, reply in zip(per_node, replies, strict=True):
            for state in reply:
                if state.exists:
                    found.setdefault(state.stream, {})[node_id] = state
        return found

    async def _ask(self, node_id: str, needs: list[Need], *, fence: bool
                   ) -> list[replication_pb2.ReplicaState]:
        items = [replication_pb2.SurveyItem(stream=n.name,
                                            fence_epoch=n.fence_epoch + 1 if fence else 0)
                 for n in needs]
        try:
            reply = await self._peers.survey(node_id, items,
                                             timeout_s=limits.failover_survey_timeout_s)
        except (grpc.aio.AioRpcError, RaftlogError) as err:
            log.info("failover: %s did not answer the survey of %d streams: %s", node_id,
                     len(items), err.code().name if isinstance(err, grpc.aio.AioRpcError)
                     else err)
            return []
        return [s for s in reply.states if s.node_id == node_id]

    async def _promote(self, promotes: list[raft_pb2.StreamPromote], *, needs: dict[str, Need],
                       started: float) -> None:
        for chunk in _chunks(promotes):
            result = ensure_ok(await self._group.propose(
                raft_pb2.RaftCommand(now_ms=self._clock.wall_ms(),
                                     stream_promotes=raft_pb2.StreamPromotes(promotes=chunk)),
                timeout_s=limits.failover_promote_timeout_s))
            skipped = {s.stream: s.reason for s in result.skipped}
            took_ms = (time.perf_counter() - started) * 1000
            for promote in chunk:
                if promote.stream in skipped:
                    continue
                need = needs[promote.stream]
                self.failovers.append({
                    "stream": promote.stream, "from": need.primary, "to": promote.new_primary,
                    "epoch": promote.new_fence_epoch, "start_seq": promote.epoch_start_seq,
                    "ms": took_ms, "why": need.why})
            moved = len(chunk) - len(skipped)
            sample = chunk[0]
            log.warning("failover: promoted %d streams in %.0f ms (e.g. %s: %s -> %s at epoch "
                        "%d from seq %d, because %s)%s", moved, took_ms, sample.stream,
                        needs[sample.stream].primary, sample.new_primary,
                        sample.new_fence_epoch, sample.epoch_start_seq,
                        needs[sample.stream].why,
                        f"; {len(skipped)} skipped: {dict(list(skipped.items())[:3])}"
                        if skipped else "",
                        # a line about one stream carries it; a round's summary names none
                        extra=logctx.fields(stream=sample.stream, epoch=sample.new_fence_epoch)
                        if len(chunk) == 1 else None)


def _chunks(promotes: list[raft_pb2.StreamPromote]) -> list[list[raft_pb2.StreamPromote]]:
    """Promotes split so each Raft entry stays under the command size limit and the state
    machine's count limit (raft/state_model.py `promotes_max`)."""
    chunks: list[list[raft_pb2.StreamPromote]] = []
    size = 0
    for promote in promotes:
        encoded = promote.ByteSize() + 8
        if not chunks or size + encoded > limits.failover_promote_batch_bytes_max \
                or len(chunks[-1]) >= promotes_max:
            chunks.append([])
            size = 0
        chunks[-1].append(promote)
        size += encoded
    return chunks
