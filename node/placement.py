"""Placement changes: moving a stream's primary (migrate, rebalance) and keeping every stream
at its replica count as members join, leave or die.

Migration (run on the Raft leader):
1. the target becomes a replica if it is not one (StreamUpdate), and catches up through normal
   replication (a re-seed when it starts empty);
2. once it holds what the primary has committed, the old primary is asked to stop taking
   writes (its replication carries on), the target receives the rest, and the other replicas
   are fenced at the next epoch (as a failover survey does);
3. if the target is the most complete of them, an authority override makes it the primary at
   that epoch, from its last seq + 1. Otherwise the most complete one is promoted (nothing
   committed may be lost) and the move is tried again, a bounded number of times.

The janitor (Raft leader, every `janitor_period_s`): a stream with fewer replicas than its
config asks (capped by the alive members) gains members in ring order; a replica on a member
silent for longer than `replace_dead_after_s` is replaced by another member, unless that member
is the primary (failover handles that first).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc

from raftlog.node.clock import Clock
from raftlog.node.errors import RaftlogError, Reason
from raftlog.node.failover import LivenessMonitor
from raftlog.node.forwarding import ChannelPool
from raftlog.node.replication import majority
from raftlog.node.ring import Ring
from raftlog.raft.api import MetaGroup, ensure_ok
from raftlog.v1 import cluster_pb2, raft_pb2, replication_pb2, replication_pb2_grpc

log = logging.getLogger(__name__)

catch_up_timeout_s = 30.0  # a new replica must hold the committed prefix within this
catch_up_poll_s = 0.02
handover_catch_up_s = 5.0  # after the old primary stops writing, for the target's last seqs
migrate_attempts_max = 3
survey_timeout_s = 0.5
propose_timeout_s = 5.0
janitor_period_s = 1.0
replace_dead_after_s_default = 30.0


class Placement:
    def __init__(self, *, node_id: str, group: MetaGroup, pool: ChannelPool,
                 liveness: LivenessMonitor, clock: Clock,
                 replace_dead_after_s: float = replace_dead_after_s_default) -> None:
        self._node_id = node_id
        self._group = group
        self._pool = pool
        self._liveness = liveness
        self._clock = clock
        self._replace_dead_after_s = replace_dead_after_s
        self._moving: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._janitor(), name="placement")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # ----------------------------------------------------------------- helpers

    async def _propose(self, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
        command.now_ms = command.now_ms or self._clock.wall_ms()
        return ensure_ok(await self._group.propose(command, timeout_s=propose_timeout_s))

    def _address(self, node_id: str) -> str:
        member = self._group.state.members.get(node_id)
        if member is None:
            raise RaftlogError(Reason.NODE_NOT_FOUND, f"no member {node_id!r}", node=node_id)
        return member.grpc_address

    async def _replica_state(self, stream: str, node_id: str, *, fence_epoch: int = 0
                             ) -> replication_pb2.ReplicaState | None:
        stub: Any = replication_pb2_grpc.ReplicationStub(  # type: ignore[no-untyped-call]
            self._pool.get(self._address(node_id)))
        try:
            state: replication_pb2.ReplicaState = await stub.GetReplicaState(
                replication_pb2.GetReplicaStateRequest(stream=stream, fence_epoch=fence_epoch),
                timeout=survey_timeout_s)
        except grpc.aio.AioRpcError:
            return None
        return state if state.exists else None

    # ----------------------------------------------------------------- migration

    async def migrate(self, stream: str, target: str, *, pin: bool = False
                      ) -> cluster_pb2.MigrateStreamResponse:
        if stream in self._moving:
            raise RaftlogError(Reason.MEMBERSHIP_CHANGE_IN_PROGRESS,
                               f"stream {stream!r} is already being moved", stream=stream)
        self._moving.add(stream)
        try:
            return await self._migrate(stream, target, pin=pin)
        finally:
            self._moving.discard(stream)

    async def _migrate(self, stream: str, target: str, *, pin: bool
                       ) -> cluster_pb2.MigrateStreamResponse:
        state = self._group.state
        if target not in state.members:
            raise RaftlogError(Reason.NODE_NOT_FOUND, f"no member {target!r}", node=target)
        assignment = state.streams.get(stream)
        if assignment is None:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"no stream named {stream!r}",
                               stream=stream)
        answer = cluster_pb2.MigrateStreamResponse(stream=stream, from_node=assignment.primary,
                                                   to_node=target)
        if assignment.primary == target:
            answer.fence_epoch = assignment.fence_epoch
            answer.outcome = "already the primary"
            return answer
        added = target not in assignment.replicas
        if added:
            await self._propose(raft_pb2.RaftCommand(stream_update=raft_pb2.StreamUpdate(
                name=stream, replicas=[*assignment.replicas, target])))
        for attempt in range(1, migrate_attempts_max + 1):
            answer.attempts = attempt
            await self._wait_caught_up(stream, target)
            if await self._take_over(stream, target, pin=pin, answer=answer):
                answer.outcome = ("added as a replica, caught up, took over" if added
                                  else "caught up, took over")
                return answer
        raise RaftlogError(Reason.NO_QUORUM, f"{target!r} did not become the primary of "
                           f"{stream!r} in {migrate_attempts_max} attempts", stream=stream)

    async def _wait_caught_up(self, stream: str, target: str) -> None:
        deadline = time.monotonic() + catch_up_timeout_s
        while time.monotonic() < deadline:
            primary = self._group.state.streams[stream].primary
            theirs = await self._replica_state(stream, primary)
            mine = await self._replica_state(stream, target)
            if theirs is not None and mine is not None and mine.last_seq >= theirs.commit_seq:
                return
            await asyncio.sleep(catch_up_poll_s)
        raise RaftlogError(Reason.TIMEOUT, f"{target!r} did not catch up with {stream!r} "
                           f"within {catch_up_timeout_s} s", stream=stream)

    async def _wait_for_seq(self, stream: str, node: str, seq: int) -> bool:
        deadline = time.monotonic() + handover_catch_up_s
        while time.monotonic() < deadline:
            state = await self._replica_state(stream, node)
            if state is not None and state.last_seq >= seq:
                return True
            await asyncio.sleep(catch_up_poll_s)
        return False

    async def _take_over(self, stream: str, target: str, *, pin: bool,
                         answer: cluster_pb2.MigrateStreamResponse) -> bool:
        assignment = self._group.state.streams[stream]
        epoch, replicas = assignment.fence_epoch + 1, tuple(assignment.replicas)
        others = [n for n in replicas if n != assignment.primary]
        # Stop the old primary's writes first; let the target receive what it still holds.
        old = await self._replica_state(stream, assignment.primary, fence_epoch=epoch)
        if old is not None:
            await self._wait_for_seq(stream, target, old.last_seq)
        states = [s for s in await asyncio.gather(*(
            self._replica_state(stream, n, fence_epoch=epoch) for n in others)) if s]
        if len(states) < majority(len(replicas)):
            raise RaftlogError(Reason.NO_QUORUM, f"only {len(states)} of {len(replicas)} "
                               f"replicas of {stream!r} answered", stream=stream)
        best = max(states, key=lambda s: (s.epoch, s.last_seq))
        mine = next((s for s in states if s.node_id == target), None)
        if mine is not None and (mine.epoch, mine.last_seq) >= (best.epoch, best.last_seq):
            await self._propose(raft_pb2.RaftCommand(
                authority_set_override=raft_pb2.AuthoritySetOverride(
                    stream=stream, claimant=target, fence_epoch=epoch,
                    epoch_start_seq=mine.last_seq + 1, pinned=pin)))
            answer.fence_epoch, answer.epoch_start_seq = epoch, mine.last_seq + 1
            return True
        # The old primary is fenced: keep the stream available on the most complete copy.
        await self._propose(raft_pb2.RaftCommand(stream_promote=raft_pb2.StreamPromote(
            stream=stream, new_primary=best.node_id, new_fence_epoch=epoch,
            epoch_start_seq=best.last_seq + 1, replicas=replicas)))
        log.info("moving %s to %s: it was behind %s; %s leads meanwhile", stream, target,
                 best.node_id, best.node_id)
        return False

    async def rebalance(self, request: cluster_pb2.RebalanceStreamsRequest
                        ) -> cluster_pb2.RebalanceStreamsResponse:
        from raftlog.node import rpc

        reply = cluster_pb2.RebalanceStreamsResponse()
        stopped = False
        for step in request.steps:
            outcome = reply.outcomes.add(step=step)
            if stopped:
                continue
            outcome.ran = True
            try:
                outcome.result.CopyFrom(await self.migrate(step.stream, step.target))
                outcome.ok = True
                reply.succeeded += 1
            except RaftlogError as err:
                outcome.error.CopyFrom(rpc.to_error_pb(err))
                reply.failed += 1
                stopped = request.stop_on_error
        return reply

    # ----------------------------------------------------------------- janitor

    async def _janitor(self) -> None:
        while True:
            await asyncio.sleep(janitor_period_s)
            if not self._group.is_leader():
                continue
            try:
                await self.tidy()
            except RaftlogError as err:
                log.info("placement janitor: %s", err)
            except Exception:
                log.exception("placement janitor failed")

    def _alive(self, node_id: str) -> bool:
        return self._liveness.silent_s(node_id) < self._replace_dead_after_s

    def _replicas_wanted(self, name: str, replicas: tuple[str, ...], primary: str, *,
                         wanted: int, members: list[str], leaving: str = "") -> tuple[str, ...]:
        """The replica set a stream should have: dead (or leaving) replicas replaced by alive
        spare members in ring order, grown to `wanted`; never shrunk for lack of spares (a
        smaller set needs a larger share of it alive)."""
        ring = Ring(members)
        spares = [n for n in ring.replicas_for(name, len(members))
                  if n not in replicas and n != leaving and self._alive(n)]
        new: list[str] = []
        for node in replicas:
            gone = node not in members or node == leaving or not self._alive(node)
            if not gone or node == primary:
                new.append(node)
            elif spares:
                new.append(spares.pop(0))
            elif node in members and node != leaving:
                new.append(node)
        while len(new) < min(wanted, len(members)) and spares:
            new.append(spares.pop(0))
        return tuple(new)

    async def tidy(self) -> int:
        """One pass: restores replica counts and clears overrides that no longer redirect
        anything (the claimant is the ring owner again), except on pinned streams; returns how
        many streams it changed."""
        with self._group.read_state() as state:
            members = sorted(state.members)
            plans = [(s.name, tuple(s.replicas), s.primary, s.config.replicas or 3)
                     for s in state.streams.values() if s.name not in self._moving]
            overrides = [(s.name, s.override.claimant) for s in state.streams.values()
                         if s.override is not None and not s.override.pinned
                         and s.name not in self._moving]
        changed = 0
        if members:
            ring = Ring(members)
            for name, claimant in overrides:
                if ring.owner(name) == claimant:
                    log.info("placement: %s's override to %s is redundant; clearing it",
                             name, claimant)
                    await self._propose(raft_pb2.RaftCommand(
                        authority_clear_override=raft_pb2.AuthorityClearOverride(stream=name)))
                    changed += 1
        for name, replicas, primary, wanted in plans:
            new = self._replicas_wanted(name, replicas, primary, wanted=wanted, members=members)
            if new != replicas:
                log.info("placement: %s replicas %s -> %s", name, list(replicas), list(new))
                await self._propose(raft_pb2.RaftCommand(stream_update=raft_pb2.StreamUpdate(
                    name=name, replicas=new)))
                changed += 1
        return changed

    async def drain(self, node_id: str) -> int:
        """Moves every stream off a member that is about to leave; returns how many."""
        with self._group.read_state() as state:
            members = sorted(state.members)
            held = [(s.name, s.primary) for s in state.streams.values()
                    if node_id in s.replicas]
        for name, primary in held:
            if primary == node_id:
                others = [n for n in self._group.state.streams[name].replicas if n != node_id]
                if not others:
                    raise RaftlogError(Reason.NODE_IN_USE, f"stream {name!r} has no other "
                                       f"replica to take over from {node_id!r}", stream=name)
                await self.migrate(name, others[0])
            assignment = self._group.state.streams[name]
            new = self._replicas_wanted(name, tuple(assignment.replicas), assignment.primary,
                                        wanted=len(assignment.replicas), members=members,
                                        leaving=node_id)
            if node_id in new:
                raise RaftlogError(Reason.NODE_IN_USE, f"no member can take {node_id!r}'s "
                                   f"copy of {name!r}", stream=name)
            await self._propose(raft_pb2.RaftCommand(stream_update=raft_pb2.StreamUpdate(
                name=name, replicas=new)))
        return len(held)
