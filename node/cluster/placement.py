"""Placement changes: moving a stream's primary (migrate, rebalance) and keeping every stream
at its replica count as the config changes and members join, leave or die.

Replica sets change one node at a time, and only when the change is safe
(node/cluster/replica_sets.py says why and decides what to change): every majority of the new set
must contain a copy that holds everything the primary held when asked. The primary's commit rule
follows the committed set (node/cluster/coordinator.py reconciles it), and a node taken out of a set
deletes its copy.

Migration (run on the Raft leader):
1. the target becomes a replica if it is not one (a safe addition), and catches up through
   normal replication (a re-seed when it starts empty);
2. once it holds what the primary has committed, and only if a majority of the copies answers
   a read-only probe, the old primary is fenced at the next epoch (it stops taking writes; its
   replication carries on), the target receives the rest, and the other copies are fenced too
   (`fence`);
3. if the target is the most complete of the fenced copies, an authority override makes it the
   primary at that epoch, from its last seq + 1; otherwise the most complete copy is promoted
   (nothing committed may be lost) and the move is tried again, a bounded number of times;
4. the set shrinks back to the config's count (the copy most behind leaves).
A move that cannot complete never leaves the stream without a serving primary: when the fences
reached only a minority, or the override did not commit, the old primary (fenced, so it holds
all it wrote) is promoted again at the new epoch; a target the move added is taken out again.

The janitor (Raft leader, every `janitor_period_s`): streams with more or fewer replicas than
their config asks (capped by the members), or with a replica on a member silent for longer than
`replace_dead_after_s`, get their next safe change; overrides that redirect nothing are cleared.
`drain` moves everything off a member that is about to leave.

Timings and bounds are in base/limits.py ("Placement"), read at use time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Coroutine
from typing import Any, TypeVar

import grpc

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2, replication_pb2
from raftlog.node.cluster import replica_sets
from raftlog.node.cluster.liveness import LivenessMonitor
from raftlog.node.cluster.replica_sets import (
    Position,
    Shape,
    completeness,
    holders,
    is_safe,
    majority,
    next_replicas,
)
from raftlog.node.cluster.ring import Ring
from raftlog.node.transport import logctx
from raftlog.node.transport.peer import PeerClient
from raftlog.raft.api import MetaGroup, ensure_ok
from raftlog.raft.state_model import StreamAssignment
from raftlog.v1 import cluster_pb2

log = logging.getLogger(__name__)

States = dict[str, replication_pb2.ReplicaState]
Result = TypeVar("Result")


def most_complete(states: States) -> replication_pb2.ReplicaState:
    """The copy that holds every committed message (replica_sets.most_complete)."""
    return replica_sets.most_complete(states.values())


def _always(new: tuple[str, ...]) -> Callable[[dict[str, Position | None]], tuple[str, ...]]:
    """A `decide` for `Placement._change` that asks for one given set."""
    return lambda _: new


class Placement:
    """Migrations, drains and the janitor of one node; they act on the Raft leader (the
    admin calls are forwarded there, the janitor idles elsewhere)."""

    def __init__(self, *, node_id: str, group: MetaGroup, peers: PeerClient,
                 liveness: LivenessMonitor, clock: Clock,
                 replace_dead_after_s: float | None = None) -> None:
        """`replace_dead_after_s` defaults to `limits.replace_dead_after_s_default`."""
        self._node_id = node_id
        self._group = group
        self._peers = peers
        self._liveness = liveness
        self._clock = clock
        self._replace_dead_after_s = (limits.replace_dead_after_s_default
                                      if replace_dead_after_s is None else replace_dead_after_s)
        self._moving: set[str] = set()
        self._detached: set[asyncio.Task[Any]] = set()
        self._task: asyncio.Task[None] | None = None

    def is_moving(self, stream: str) -> bool:
        """A migration of the stream runs here (it fences and moves authority itself)."""
        return stream in self._moving

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._janitor(), name="placement")

    async def stop(self) -> None:
        tasks = [*self._detached, *([self._task] if self._task is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _to_the_end(self, work: Coroutine[Any, Any, Result]) -> Result:
        """Runs `work` to its end even when the caller gives up (a client deadline cancels its
        call): a move stopped between fencing and promoting would leave the stream unserved."""
        task = asyncio.get_running_loop().create_task(work)
        self._detached.add(task)
        task.add_done_callback(self._detached.discard)
        return await asyncio.shield(task)

    # ----------------------------------------------------------------- asking the copies

    async def _propose(self, command: raft_pb2.RaftCommand) -> raft_pb2.RaftResult:
        command.now_ms = command.now_ms or self._clock.wall_ms()
        return ensure_ok(await self._group.propose(
            command, timeout_s=limits.placement_propose_timeout_s))

    async def _replica_state(self, stream: str, node_id: str, *, fence_epoch: int = 0
                             ) -> replication_pb2.ReplicaState | None:
        try:
            state = await self._peers.replica_state(node_id, stream, fence_epoch=fence_epoch,
                                                    timeout_s=limits.placement_survey_timeout_s)
        except (grpc.aio.AioRpcError, RaftlogError):
            return None
        return state if state.exists else None

    async def positions(self, stream: str, replicas: Collection[str], *, primary: str
                        ) -> dict[str, Position | None]:
        """Where each copy stands (read-only; None for no answer): the primary first, so that
        a copy at or past the primary's last seq holds everything the primary held."""
        lead = await self._replica_state(stream, primary)
        others = [n for n in replicas if n != primary]
        states = await asyncio.gather(*(self._replica_state(stream, n) for n in others))
        found: dict[str, Position | None] = {}
        for node, state in ((primary, lead), *zip(others, states, strict=True)):
            found[node] = None if state is None else Position(state.epoch, state.last_seq)
        return found

    async def fence(self, stream: str, nodes: Collection[str], *, epoch: int) -> States:
        """Fences the copies on `nodes` at `epoch` (each refuses older epochs durably before it
        answers; a primary below `epoch` stops taking writes) and returns the answers by node.
        Once a majority of a replica set answered, the old epoch can commit nothing more, and
        the most complete answer (`most_complete`) holds every message it committed."""
        states = await asyncio.gather(*(self._replica_state(stream, n, fence_epoch=epoch)
                                        for n in nodes))
        return {s.node_id: s for s in states if s is not None}

    # ----------------------------------------------------------------- replica sets

    def _alive(self, node_id: str) -> bool:
        return self._liveness.silent_s(node_id) < self._replace_dead_after_s

    def _assignment(self, name: str) -> StreamAssignment:
        assignment = self._group.state.streams.get(name)
        if assignment is None:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"no stream named {name!r}",
                               stream=name)
        return assignment

    def _shape(self, assignment: StreamAssignment, *, ring: Ring, leaving: str = "") -> Shape:
        members = ring.members
        order = ring.replicas_for(assignment.name, len(members))
        alive = {m for m in members if self._alive(m)}
        replicas = tuple(assignment.replicas)
        wanted = assignment.config.replicas or limits.replicas_default
        return Shape(
            replicas=replicas, primary=assignment.primary,
            wanted=min(wanted, len(members) - (leaving in members)),
            healthy=frozenset(n for n in replicas if n in alive and n != leaving),
            leaving=frozenset(n for n in replicas if n in alive and n == leaving),
            gone=frozenset(n for n in replicas if n not in members),
            spares=tuple(n for n in order if n in alive and n != leaving
                         and n not in replicas), ring=order)

    def _ring(self) -> Ring:
        members = list(self._group.state.members)
        if not members:
            raise RaftlogError(Reason.NO_LEADER, "the cluster has no members yet")
        return Ring(members)

    async def _step(self, name: str, *, ring: Ring, leaving: str = ""
                    ) -> tuple[str, ...] | None:
        """Makes the stream's next replica-set change (replica_sets.next_replicas) when one is
        due and safe; returns the new set, or None when none was due or it is not safe yet."""
        assignment = self._group.state.streams.get(name)
        if assignment is None:
            return None
        shape = self._shape(assignment, ring=ring, leaving=leaving)
        if next_replicas(shape) is None:
            return None
        return await self._change(name, lambda positions: next_replicas(shape, positions),
                                  expect=(assignment.primary, assignment.fence_epoch,
                                          shape.replicas))

    async def _change(self, name: str,
                      decide: Callable[[dict[str, Position | None]], tuple[str, ...] | None],
                      *, expect: tuple[str, int, tuple[str, ...]]) -> tuple[str, ...] | None:
        """Asks the copies where they stand, lets `decide` pick the new set, and commits it
        when it is safe and the assignment is still `expect` (primary, epoch, replicas)."""
        primary, epoch, replicas = expect
        positions = await self.positions(name, replicas, primary=primary)
        new = decide(positions)
        if new is None or new == replicas:
            return None
        if not is_safe(new, holders(positions, primary=primary, fence_epoch=epoch)):
            return None
        current = self._group.state.streams.get(name)
        if current is None or (current.primary, current.fence_epoch,
                               tuple(current.replicas)) != expect:
            return None  # it moved meanwhile: decide again
        log.info("placement: %s replicas %s -> %s", name, list(replicas), list(new),
                 extra=logctx.fields(stream=name, epoch=epoch))
        await self._propose(raft_pb2.RaftCommand(stream_update=raft_pb2.StreamUpdate(
            name=name, replicas=new)))
        return new

    async def _set_replicas(self, name: str,
                            change: Callable[[StreamAssignment], tuple[str, ...]], *,
                            timeout_s: float) -> bool:
        """Commits `change(assignment)` as the replica set once it is safe; True when the set
        is what `change` asks for, False when that was not safe within `timeout_s`."""
        deadline = self._clock.monotonic_s() + timeout_s
        while True:
            assignment = self._assignment(name)
            replicas, new = tuple(assignment.replicas), change(assignment)
            if new == replicas:
                return True
            expect = (assignment.primary, assignment.fence_epoch, replicas)
            if await self._change(name, _always(new), expect=expect) is not None:
                return True
            if self._clock.monotonic_s() >= deadline:
                return False
            await asyncio.sleep(limits.placement_step_poll_s)

    async def _settle(self, name: str, *, timeout_s: float, leaving: str = "",
                      done: Callable[[StreamAssignment], bool] | None = None) -> bool:
        """Changes the set step by step until no change is due (or `done`); False when that
        did not happen within `timeout_s`."""
        deadline = self._clock.monotonic_s() + timeout_s
        while True:
            assignment = self._group.state.streams.get(name)
            if assignment is None:
                return True
            ring = self._ring()
            if done is not None and done(assignment):
                return True
            if done is None and next_replicas(self._shape(assignment, ring=ring,
                                                          leaving=leaving)) is None:
                return True
            if await self._step(name, ring=ring, leaving=leaving) is None:
                if self._clock.monotonic_s() >= deadline:
                    return False
                await asyncio.sleep(limits.placement_step_poll_s)

    # ----------------------------------------------------------------- migration

    async def migrate(self, stream: str, target: str, *, pin: bool = False
                      ) -> cluster_pb2.MigrateStreamResponse:
        """Moves the stream's primary to `target` (see the module docstring); runs to its end
        even when the caller gives up."""
        self._claim(stream)
        return await self._to_the_end(self._migrate_claimed(stream, target, pin=pin))

    def _claim(self, stream: str) -> None:
        if stream in self._moving:
            raise RaftlogError(Reason.MEMBERSHIP_CHANGE_IN_PROGRESS,
                               f"stream {stream!r} is already being moved", stream=stream)
        self._moving.add(stream)

    async def _migrate_claimed(self, stream: str, target: str, *, pin: bool
                               ) -> cluster_pb2.MigrateStreamResponse:
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
        if added and not await self._set_replicas(
                stream, lambda a: a.replicas if target in a.replicas else (*a.replicas, target),
                timeout_s=limits.placement_step_timeout_s):
            raise RaftlogError(Reason.NO_QUORUM, f"{target!r} could not be added to "
                               f"{stream!r}'s replicas safely within "
                               f"{limits.placement_step_timeout_s} s (its "
                               "replicas do not hold what its primary holds)", stream=stream)
        try:
            await self._move(stream, target, pin=pin, answer=answer)
        except Exception:
            if added:
                await self._take_out(stream, target)
            raise
        answer.outcome = ("added as a replica, caught up, took over" if added
                          else "caught up, took over")
        try:
            settled = await self._settle(stream, timeout_s=limits.move_settle_timeout_s)
        except RaftlogError as err:
            log.info("moving %s: shrinking its replica set back: %s", stream, err)
            settled = False
        if not settled:
            log.info("moving %s: its replica set did not shrink back within %s s; the janitor "
                     "carries on", stream, limits.move_settle_timeout_s)
        return answer

    async def _move(self, stream: str, target: str, *, pin: bool,
                    answer: cluster_pb2.MigrateStreamResponse) -> None:
        for attempt in range(1, limits.migrate_attempts_max + 1):
            answer.attempts = attempt
            await self._wait_caught_up(stream, target)
            if await self._take_over(stream, target, pin=pin, answer=answer):
                return
        raise RaftlogError(Reason.NO_QUORUM, f"{target!r} did not become the primary of "
                           f"{stream!r} in {limits.migrate_attempts_max} attempts", stream=stream)

    async def _take_out(self, stream: str, target: str) -> None:
        """After a failed move: the target it added leaves the replica set again."""
        try:
            if not await self._set_replicas(
                    stream, lambda a: a.replicas if a.primary == target
                    else tuple(n for n in a.replicas if n != target),
                    timeout_s=limits.placement_step_timeout_s):
                log.warning("moving %s: could not take %s out of its replicas safely; the "
                            "janitor carries on", stream, target)
        except RaftlogError as err:
            log.warning("moving %s: taking %s out of its replicas failed: %s", stream, target,
                        err)

    async def _wait_caught_up(self, stream: str, target: str) -> None:
        """Until the target holds what the primary has committed; TIMEOUT after
        `placement_catch_up_timeout_s`, NODE_UNREACHABLE once it answered nothing for
        `move_target_silent_s_max`."""
        now = self._clock.monotonic_s()
        deadline, heard = now + limits.placement_catch_up_timeout_s, now
        while True:
            primary = self._assignment(stream).primary
            theirs = await self._replica_state(stream, primary)
            mine = await self._replica_state(stream, target)
            now = self._clock.monotonic_s()
            if mine is not None:
                heard = now
                if theirs is not None and mine.last_seq >= theirs.commit_seq:
                    return
            if now - heard > limits.move_target_silent_s_max:
                raise RaftlogError(Reason.NODE_UNREACHABLE, f"{target!r} answered nothing about "
                                   f"{stream!r} for {limits.move_target_silent_s_max} s; the "
                                   "move stops",
                                   stream=stream, node=target)
            if now >= deadline:
                raise RaftlogError(Reason.TIMEOUT, f"{target!r} did not catch up with "
                                   f"{stream!r} within {limits.placement_catch_up_timeout_s} s",
                                   stream=stream)
            await asyncio.sleep(limits.placement_catch_up_poll_s)

    async def _wait_for_seq(self, stream: str, node: str, seq: int) -> bool:
        """Until the node holds `seq`; False after `move_handover_catch_up_s`, or once it
        answered nothing for `move_target_silent_s_max`."""
        now = self._clock.monotonic_s()
        deadline, heard = now + limits.move_handover_catch_up_s, now
        while now < deadline and now - heard <= limits.move_target_silent_s_max:
            state = await self._replica_state(stream, node)
            now = self._clock.monotonic_s()
            if state is not None:
                if state.last_seq >= seq:
                    return True
                heard = now
            await asyncio.sleep(limits.placement_catch_up_poll_s)
        return False

    async def _take_over(self, stream: str, target: str, *, pin: bool,
                         answer: cluster_pb2.MigrateStreamResponse) -> bool:
        """One handover attempt; True when the target leads. Raises NO_QUORUM, having changed
        nothing, when a majority of the copies does not answer a read-only probe first."""
        assignment = self._assignment(stream)
        epoch, replicas = assignment.fence_epoch + 1, tuple(assignment.replicas)
        old = assignment.primary
        probed = await self.positions(stream, replicas, primary=old)
        answered = sum(at is not None for at in probed.values())
        if answered < majority(len(replicas)):
            raise RaftlogError(Reason.NO_QUORUM, f"only {answered} of {len(replicas)} "
                               f"replicas of {stream!r} answered; nothing was changed",
                               stream=stream)
        # Stop the old primary's writes first; let the target receive what it still holds.
        first = await self.fence(stream, [old], epoch=epoch)
        if old in first:
            await self._wait_for_seq(stream, target, first[old].last_seq)
        fenced = {**first, **await self.fence(stream, [n for n in replicas if n != old],
                                              epoch=epoch)}
        if len(fenced) < majority(len(replicas)):
            await self._serve_again(stream, epoch=epoch, old=first.get(old))
            raise RaftlogError(Reason.NO_QUORUM, f"only {len(fenced)} of {len(replicas)} "
                               f"replicas of {stream!r} answered the fence; it stays on "
                               f"{old!r}", stream=stream)
        best, mine = most_complete(fenced), fenced.get(target)
        try:
            if mine is not None and completeness(mine) >= completeness(best):
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
        except RaftlogError:
            await self._serve_again(stream, epoch=epoch, old=first.get(old))
            raise
        log.info("moving %s to %s: it was behind %s; %s leads meanwhile", stream, target,
                 best.node_id, best.node_id)
        return False

    async def _serve_again(self, stream: str, *, epoch: int,
                           old: replication_pb2.ReplicaState | None) -> None:
        """The move stopped after fencing the old primary: it leads again at `epoch` (it
        holds everything it wrote). Without its answer nothing is promoted here; failover
        replaces a primary that stopped serving."""
        if old is None:
            log.warning("moving %s stopped after fencing; its old primary did not answer, so "
                        "failover takes it from here", stream)
            return
        try:
            await self._propose(raft_pb2.RaftCommand(stream_promote=raft_pb2.StreamPromote(
                stream=stream, new_primary=old.node_id, new_fence_epoch=epoch,
                epoch_start_seq=old.last_seq + 1)))
            log.info("moving %s stopped; %s leads it again at fence epoch %d", stream,
                     old.node_id, epoch)
        except RaftlogError as err:  # e.g. another node already leads that epoch
            log.warning("moving %s stopped; promoting %s again failed: %s", stream,
                        old.node_id, err)

    async def rebalance(self, request: cluster_pb2.RebalanceStreamsRequest
                        ) -> cluster_pb2.RebalanceStreamsResponse:
        from raftlog.node.transport import rpc

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
            await asyncio.sleep(limits.janitor_period_s)
            if not self._group.is_leader():
                continue
            try:
                await self.tidy()
            except RaftlogError as err:
                log.info("placement janitor: %s", err)
            except Exception:
                log.exception("placement janitor failed")

    async def tidy(self) -> int:
        """One pass: the next safe replica-set change of up to `janitor_streams_per_pass_max`
        streams whose set differs from what their config asks, and clearing overrides that no
        longer redirect anything (the claimant is the ring owner again), except on pinned
        streams; returns how many streams it changed."""
        ring = self._ring()
        usable = {m for m in ring.members if self._alive(m)}
        with self._group.read_state() as state:
            # A cheap look first (no ring walk per stream): the count or a replica is off.
            due = [s.name for s in state.streams.values() if s.name not in self._moving
                   and (len(s.replicas) != min(s.config.replicas or limits.replicas_default,
                                               len(ring))
                        or not usable.issuperset(s.replicas))]
            overrides = [(s.name, s.override.claimant) for s in state.streams.values()
                         if s.override is not None and not s.override.pinned
                         and s.name not in self._moving]
        changed = 0
        for name, claimant in overrides:
            if ring.owner(name) == claimant:
                log.info("placement: %s's override to %s is redundant; clearing it",
                         name, claimant, extra=logctx.fields(stream=name))
                await self._propose(raft_pb2.RaftCommand(
                    authority_clear_override=raft_pb2.AuthorityClearOverride(stream=name)))
                changed += 1
        due = due[:limits.janitor_streams_per_pass_max]
        concurrency_max = limits.janitor_concurrency_max
        for start in range(0, len(due), concurrency_max):
            batch = due[start:start + concurrency_max]
            results = await asyncio.gather(*(self._step(name, ring=ring) for name in batch),
                                           return_exceptions=True)
            for name, result in zip(batch, results, strict=True):
                if isinstance(result, RaftlogError):
                    log.info("placement: changing %s's replicas: %s", name, result,
                             extra=logctx.fields(stream=name))
                elif isinstance(result, BaseException):
                    log.error("placement: changing %s's replicas failed", name,
                              exc_info=result, extra=logctx.fields(stream=name))
                elif result is not None:
                    changed += 1
        return changed

    async def drain(self, node_id: str) -> int:
        """Moves every stream off a member that is about to leave; returns how many. Each
        stream's move runs to its end even when the caller gives up."""
        with self._group.read_state() as state:
            held = [s.name for s in state.streams.values() if node_id in s.replicas]
        for name in held:
            self._claim(name)
            await self._to_the_end(self._drain_claimed(name, node_id))
        return len(held)

    async def _drain_claimed(self, name: str, node_id: str) -> None:
        try:
            await self._drain_one(name, node_id)
        finally:
            self._moving.discard(name)

    async def _drain_one(self, name: str, node_id: str) -> None:
        assignment = self._group.state.streams.get(name)
        if assignment is None:
            return
        if assignment.primary == node_id:
            shape = self._shape(assignment, ring=self._ring(), leaving=node_id)
            others = [n for n in shape.replicas if n in shape.healthy and n != node_id]
            target = (others or list(shape.spares) or [""])[0]
            if not target:
                raise RaftlogError(Reason.NODE_IN_USE, f"no member can take over {name!r} "
                                   f"from {node_id!r}", stream=name)
            await self._migrate(name, target, pin=False)
        if not await self._settle(name, timeout_s=limits.placement_step_timeout_s,
                                  leaving=node_id, done=lambda a: node_id not in a.replicas):
            raise RaftlogError(Reason.NODE_IN_USE, f"{node_id!r}'s copy of {name!r} could not "
                               f"be moved safely within {limits.placement_step_timeout_s} s",
                               stream=name)
