"""A node's place in the cluster: the metadata group, placement, and keeping the local engine
in line with what Raft committed.

- Membership: each node registers itself (MemberJoin with its gRPC and Raft addresses) once a
  leader exists; JoinNode/LeaveNode change the Raft group and the member table one at a time.
- Placement: the ring over the member table; an existing stream lives where its assignment
  says (authority override included); a new one goes to the ring owner.
- Reconciling: every applied command that names a stream queues that stream; one worker
  brings the local engine to the committed state (create, config change, delete), so a node
  that restarts, lags or installs a snapshot converges the same way.
- Watch: applied commands become WatchEvents for every watcher.
- A consumer state an operator set (ConsumerStateSet, an audit's repair) is what this node serves
  the consumer from afterwards, if it serves it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Protocol

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import InvariantViolation, RaftlogError, Reason
from raftlog.internal import raft_pb2, replication_pb2
from raftlog.node.cluster.liveness import LivenessMonitor
from raftlog.node.cluster.raft_watch import warn_while_leaderless
from raftlog.node.cluster.ring import Ring
from raftlog.node.consumers.manager import ConsumerManager
from raftlog.node.consumers.raft_store import RaftConsumerStore
from raftlog.node.engine.stream import ROLE_PRIMARY, Stream
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.replication.primary import ReplicationManager
from raftlog.node.transport import logctx
from raftlog.raft.api import Applied, LeaderChange, MetaGroup, ensure_ok
from raftlog.raft.state_model import MetaState, StreamAssignment
from raftlog.v1 import cluster_pb2, types_pb2

log = logging.getLogger(__name__)


_WATCH_TYPES = {
    "stream_create": cluster_pb2.WATCH_EVENT_TYPE_STREAM_CREATED,
    "stream_update": cluster_pb2.WATCH_EVENT_TYPE_STREAM_UPDATED,
    "stream_delete": cluster_pb2.WATCH_EVENT_TYPE_STREAM_DELETED,
    "stream_promote": cluster_pb2.WATCH_EVENT_TYPE_AUTHORITY_CHANGED,
    "stream_promotes": cluster_pb2.WATCH_EVENT_TYPE_AUTHORITY_CHANGED,
    "authority_set_override": cluster_pb2.WATCH_EVENT_TYPE_AUTHORITY_CHANGED,
    "authority_clear_override": cluster_pb2.WATCH_EVENT_TYPE_AUTHORITY_CHANGED,
    "authority_set_pinned": cluster_pb2.WATCH_EVENT_TYPE_AUTHORITY_CHANGED,
    "consumer_create": cluster_pb2.WATCH_EVENT_TYPE_CONSUMER_CREATED,
    "consumer_delete": cluster_pb2.WATCH_EVENT_TYPE_CONSUMER_DELETED,
    "member_join": cluster_pb2.WATCH_EVENT_TYPE_MEMBER_CHANGED,
    "member_leave": cluster_pb2.WATCH_EVENT_TYPE_MEMBER_CHANGED,
    "member_set_status": cluster_pb2.WATCH_EVENT_TYPE_MEMBER_CHANGED,
}


def _trouble(local: Stream, assignment: StreamAssignment, node_id: str) -> str:
    """Why this node's copy does not fit the committed assignment ('' when it does)."""
    fenced = local.record.fenced_epoch
    if fenced > assignment.fence_epoch:
        return (f"{node_id}'s copy is fenced at epoch {fenced}; the metadata is at "
                f"{assignment.fence_epoch}")
    if assignment.primary == node_id and (local.role != ROLE_PRIMARY
                                          or local.deposed is not None):
        return f"{node_id} is named primary at epoch {assignment.fence_epoch} but does not serve"
    return ""


def command_streams(command: raft_pb2.RaftCommand) -> list[str]:
    """The streams a command is about (none for member commands)."""
    if command.WhichOneof("command") == "stream_promotes":
        return [p.stream for p in command.stream_promotes.promotes]
    name = command_stream(command)
    return [name] if name else []


def command_stream(command: raft_pb2.RaftCommand) -> str:
    """The stream a command is about ('' for member commands)."""
    kind = command.WhichOneof("command")
    if kind is None:
        return ""
    body = getattr(command, kind)
    if kind == "stream_create":
        return str(body.config.name)
    for field in ("stream", "name"):
        if hasattr(body, field):
            return str(getattr(body, field))
    return ""


class NodeIdentity(Protocol):
    """What the cluster reads of the node's configuration: its name and the addresses it
    registers with (node/config.py's NodeConfig has them)."""

    @property
    def name(self) -> str:
        """The node id in the member table and in assignments."""
        ...

    @property
    def grpc_address(self) -> str: ...

    @property
    def raft_address(self) -> str: ...

    @property
    def peer_address(self) -> str: ...


class ClusterNode:
    def __init__(self, *, config: NodeIdentity, group: MetaGroup, engine: StreamEngine,
                 consumers: ConsumerManager, clock: Clock,
                 replication: ReplicationManager | None = None,
                 consumer_store: RaftConsumerStore | None = None) -> None:
        """`config` names this node and the addresses it registers with (a NodeConfig, or
        anything else with those attributes: `NodeIdentity`)."""
        self.config = config
        self.consumer_store = consumer_store
        self.replication = replication
        self.node_id = config.name
        self.group = group
        self.engine = engine
        self.consumers = consumers
        self.clock = clock
        self._ring: Ring | None = None
        self._ring_members: tuple[str, ...] = ()
        self._reconcile: asyncio.Queue[str | None] = asyncio.Queue(limits.reconcile_queue_max)
        self._queued: set[str] = set()
        self._reconciling: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.watchers: set[asyncio.Queue[cluster_pb2.WatchEvent | None]] = set()
        self.registered = asyncio.Event()
        self.liveness: LivenessMonitor | None = None  # set by the node (server.py)
        self.troubles: dict[str, replication_pb2.StreamTrouble] = {}
        self._trouble_seen: dict[str, float] = {}
        self._troubles_logged: set[str] = set()
        self._caught_up = False  # see caught_up()
        self._caught_up_event = asyncio.Event()
        # Restart rule (as Raft's: a restarted leader never resumes its term). `_loaded`: the
        # copies this incarnation found on disk, not yet reconciled; `_barred`: stream -> the
        # fence epoch at which this node must not lead (see `_lead`).
        self._loaded: set[str] = set()
        self._barred: dict[str, int] = {}

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.group.attach_loop(loop)
        self._loaded = set(self.engine.streams)  # the engine loaded its copies before
        self.queue_all()
        self._tasks = [loop.create_task(self.catch_up(), name="catch-up"),
                       loop.create_task(self._reconcile_forever(), name="reconcile"),
                       loop.create_task(self._register(), name="register"),
                       loop.create_task(self._scan_troubles_forever(), name="troubles"),
                       loop.create_task(warn_while_leaderless(self.group.status),
                                        name="leaderless")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for watcher in list(self.watchers):
            watcher.put_nowait(None)

    # ----------------------------------------------------------------- metadata

    @property
    def state(self) -> MetaState:
        return self.group.state

    async def propose(self, command: raft_pb2.RaftCommand, *,
                      timeout_s: float | None = None) -> raft_pb2.RaftResult:
        """Commits a command; the rejection (or the failure to commit) as RaftlogError."""
        command.now_ms = command.now_ms or self.clock.wall_ms()
        timeout = min(timeout_s or limits.metadata_propose_timeout_s,
                      limits.metadata_propose_timeout_s)
        await self._wait_for_leader(min(timeout, limits.no_leader_wait_s))
        try:
            result = await self.group.propose(command, timeout_s=timeout)
        except RaftlogError as err:
            if err.reason in (Reason.NO_LEADER, Reason.TIMEOUT):
                err.metadata.setdefault("retry_after_ms", str(limits.no_leader_retry_after_ms))
            raise
        return ensure_ok(result)

    async def _wait_for_leader(self, timeout_s: float) -> None:
        """Until the metadata group has a leader (an election takes about this long); then
        NO_LEADER at once rather than at the caller's deadline (an isolated node)."""
        deadline = self.clock.monotonic_s() + timeout_s
        while self.group.leader_address() is None:
            if self.clock.monotonic_s() >= deadline:
                raise RaftlogError(Reason.NO_LEADER, "the metadata group has no leader this "
                                   "node can reach; retry",
                                   retry_after_ms=limits.no_leader_retry_after_ms,
                                   outcome="not_committed")
            await asyncio.sleep(limits.metadata_ready_poll_s / 5)

    def member_address(self, node_id: str) -> str:
        member = self.state.members.get(node_id)
        if member is None:
            raise RaftlogError(Reason.NODE_NOT_FOUND, f"no member {node_id!r}", node=node_id)
        return member.grpc_address

    def member_addresses(self) -> dict[str, str]:
        with self.group.read_state() as state:
            return {m.node_id: m.grpc_address for m in state.members.values()}

    def member_ids(self) -> list[str]:
        return list(self.state.members)

    def member_peer_address(self, node_id: str) -> str:
        """A member's peer listener; NODE_NOT_FOUND when it is not a member or registered
        none."""
        member = self.state.members.get(node_id)
        if member is None or not member.peer_address:
            raise RaftlogError(Reason.NODE_NOT_FOUND, f"no member {node_id!r} with a peer "
                               "address", node=node_id)
        return member.peer_address

    def health_report(self) -> replication_pb2.PingReply:
        """What this node tells a pinging member about itself (see PingReply)."""
        reply = replication_pb2.PingReply(node_id=self.node_id,
                                          raft_applied_index=self.state.applied_index,
                                          raft_ready=self.group.is_ready(),
                                          troubles=self.troubles.values())
        if self.liveness is not None:
            reply.silent_ms.update(self.liveness.silences_ms())
        return reply

    # ----------------------------------------------------------------- troubles

    def scan_troubles(self) -> None:
        """Finds the streams this node cannot serve as the metadata says it should, or whose
        copy here holds a fence no committed epoch explains (a failover that fenced and never
        promoted). One seen in two scans in a row is reported (`troubles`, in every Ping
        reply) until the metadata moves on: the Raft leader repairs it
        (node/cluster/failover.py)."""
        now = self.clock.monotonic_s()
        found: dict[str, replication_pb2.StreamTrouble] = {}
        with self.group.read_state() as state:
            for name, local in list(self.engine.streams.items()):
                assignment = state.streams.get(name)
                if assignment is None or self.node_id not in assignment.replicas \
                        or name in self._queued or name in self._reconciling:
                    continue  # not brought in line with the assignment yet
                why = _trouble(local, assignment, self.node_id)
                if why:
                    found[name] = replication_pb2.StreamTrouble(
                        stream=name, assignment_epoch=assignment.fence_epoch,
                        fenced_epoch=local.record.fenced_epoch, why=why)
            for name in state.streams_led_by(self.node_id):
                if name not in self.engine.streams and name not in self._queued \
                        and name not in self._reconciling:
                    found[name] = replication_pb2.StreamTrouble(
                        stream=name, assignment_epoch=state.streams[name].fence_epoch,
                        why=f"{self.node_id} is named primary but holds no copy")
        barred = {name for name, trouble in found.items()
                  if self._barred.get(name) == trouble.assignment_epoch}
        for name in barred:  # reported at once (see `_bar`)
            found[name].why = self._barred_why(name, found[name].assignment_epoch)
        seen = self._trouble_seen
        self._trouble_seen = {name: now - limits.trouble_grace_s if name in barred
                              else seen.get(name, now) for name in found}
        self.troubles = {name: trouble for name, trouble in found.items()
                         if now - self._trouble_seen[name] >= limits.trouble_grace_s}
        if self.troubles and set(self.troubles) != self._troubles_logged:
            log.warning("%d streams need repair (e.g. %s: %s)", len(self.troubles),
                        *next(iter((n, t.why) for n, t in self.troubles.items())))
        self._troubles_logged = set(self.troubles)

    async def _scan_troubles_forever(self) -> None:
        await self._wait_caught_up()
        while True:
            await asyncio.sleep(limits.trouble_scan_period_s)
            try:
                self.scan_troubles()
            except Exception:
                log.exception("scanning for stream troubles failed")

    def stream_owner(self, name: str) -> str:
        """The user whose call created the stream ("" = none, or not a stream here)."""
        assignment = self.state.streams.get(name)
        return assignment.owner if assignment is not None else ""

    def leader_node_id(self) -> str:
        address = self.group.leader_address()
        if address is None:
            return ""
        for member in list(self.state.members.values()):
            if member.raft_address == address:
                return member.node_id
        return ""

    # ----------------------------------------------------------------- placement

    def ring(self) -> Ring:
        members = tuple(sorted(self.state.members))
        if self._ring is None or members != self._ring_members:
            self._ring = Ring(members)
            self._ring_members = members
        return self._ring

    def placement_short(self, config: types_pb2.StreamConfig) -> bool:
        """Whether the members this node knows are fewer than the copies `config` wants."""
        return len(self.ring()) < (config.replicas or limits.replicas_default)

    def check_replicas(self, config: types_pb2.StreamConfig) -> None:
        """INSUFFICIENT_REPLICAS when `config` asks for more copies than there are members."""
        members = len(self.ring())
        if config.replicas > members:
            raise RaftlogError(
                Reason.INSUFFICIENT_REPLICAS,
                f"stream {config.name!r} asks for {config.replicas} replicas and the cluster "
                f"has {members} member(s); add nodes or ask for fewer",
                stream=config.name, replicas=config.replicas, members=members,
                retry_after_ms=limits.insufficient_replicas_retry_after_ms)

    def new_placement(self, config: types_pb2.StreamConfig) -> tuple[str, tuple[str, ...]]:
        """Primary and replicas for a stream that does not exist yet. An explicit replica
        count the membership cannot hold is refused, never quietly lowered; the default
        (`replicas` 0) takes as many members as there are, up to its usual count."""
        ring = self.ring()
        self.check_replicas(config)
        replicas = min(config.replicas or limits.replicas_default, len(ring))
        placement = ring.place(config.name, replicas=replicas)
        return placement.primary, placement.replicas

    def primary_of(self, stream: str) -> str:
        assignment = self.state.streams.get(stream)
        if assignment is not None:
            return assignment.primary
        return self.ring().owner(stream)

    def primary_address(self, stream: str) -> str | None:
        """Router: None when this node serves the stream."""
        if not self.state.members:
            raise RaftlogError(Reason.NO_LEADER, "the cluster has no members yet",
                               retry_after_ms=limits.no_leader_retry_after_ms)
        primary = self.primary_of(stream)
        if primary == self.node_id:
            if not self.caught_up():  # its state may lack the stream or its consumers
                raise RaftlogError(Reason.CATCHING_UP, "this node has not caught up with the "
                                   "cluster's metadata yet; retry", stream=stream,
                                   retry_after_ms=limits.catching_up_retry_after_ms)
            return None
        if self.liveness is not None and self.liveness.unreachable(primary):
            raise RaftlogError(Reason.NOT_PRIMARY, f"the primary of {stream!r}, {primary}, has "
                               f"not answered for {self.liveness.silent_s(primary):.1f} s; "
                               "retry (a failover replaces it)", stream=stream, primary=primary,
                               retry_after_ms=limits.unreachable_retry_after_ms)
        return self.member_address(primary)

    def unreachable(self, address: str) -> RaftlogError | None:
        """Router: the member at gRPC `address` went silent (a forwarded call stops waiting)."""
        if self.liveness is None:
            return None
        for member in list(self.state.members.values()):
            if member.grpc_address == address and self.liveness.unreachable(member.node_id):
                return RaftlogError(
                    Reason.FORWARD_FAILED, f"{member.node_id} at {address} stopped answering "
                    f"({self.liveness.silent_s(member.node_id):.1f} s); retry (a failover "
                    "replaces a lost primary)", address=address,
                    retry_after_ms=limits.unreachable_retry_after_ms)
        return None

    def caught_up(self) -> bool:
        """The metadata caught up with the cluster once since start (then for good): before,
        a stream or consumer missing here may be a command not yet applied."""
        return self._caught_up

    # ----------------------------------------------------------------- registration

    async def _register(self) -> None:
        me = raft_pb2.MemberJoin(node_id=self.node_id, raft_address=self.config.raft_address,
                                 grpc_address=self.config.grpc_address,
                                 peer_address=self.config.peer_address)
        while True:
            member = self.state.members.get(self.node_id)
            if member is not None:
                registered = (member.raft_address, member.grpc_address, member.peer_address)
                if registered != (me.raft_address, me.grpc_address, me.peer_address):
                    log.error("member %s is registered with raft %s, grpc %s, peer %s; this "
                              "node runs with raft %s, grpc %s, peer %s", self.node_id,
                              *registered, me.raft_address, me.grpc_address, me.peer_address)
                self.registered.set()
                return
            try:
                await self.propose(raft_pb2.RaftCommand(member_join=me))
            except RaftlogError as err:
                if err.reason is not Reason.NODE_EXISTS:
                    log.debug("registering %s: %s", self.node_id, err)
                    await asyncio.sleep(limits.register_retry_s)

    # ----------------------------------------------------------------- events

    def on_applied(self, event: Applied) -> None:
        if event.snapshot_installed or event.command is None:
            self.queue_all()
            return
        streams = command_streams(event.command)
        for stream in streams:
            self.queue(stream)
        if event.result is not None and event.result.ok:
            for stream in streams or [""]:
                self._emit(event, stream)
            if event.command.WhichOneof("command") == "consumer_state_set":
                # An operator replaced a consumer's state: if this node serves it, from now on
                # from the new state (the primary that proposed it does so itself).
                body = event.command.consumer_state_set
                self.consumers.refresh(body.stream, body.consumer)

    def on_leader_change(self, event: LeaderChange) -> None:
        log.info("raft leader: %s (term %d, this node leads: %s)", event.leader, event.term,
                 event.is_leader)

    def _emit(self, event: Applied, stream: str) -> None:
        if event.command is None:
            raise InvariantViolation("an applied event without its command")
        kind = event.command.WhichOneof("command") or ""
        watch_type = _WATCH_TYPES.get(kind)
        if watch_type is None or not self.watchers:
            return
        body = getattr(event.command, kind)
        watch = cluster_pb2.WatchEvent(type=watch_type, stream=stream, index=event.index,
                                       ts_ms=event.command.now_ms)
        if kind.startswith("consumer_"):
            watch.consumer = body.consumer if hasattr(body, "consumer") else body.config.name
        if kind.startswith("member_"):
            watch.node_id = body.node_id
        if watch_type == cluster_pb2.WATCH_EVENT_TYPE_AUTHORITY_CHANGED:
            assignment = self.state.streams.get(stream)
            if assignment is not None:
                watch.claimant = assignment.override.claimant if assignment.override else ""
                watch.fence_epoch = assignment.fence_epoch
        for watcher in list(self.watchers):
            if watcher.qsize() >= limits.watch_queue_max:  # too slow: end its stream
                self.watchers.discard(watcher)
                watcher.put_nowait(None)
            else:
                watcher.put_nowait(watch)

    # ----------------------------------------------------------------- reconciling

    def queue(self, stream: str) -> None:
        if stream not in self._queued:
            self._queued.add(stream)
            self._reconcile.put_nowait(stream)

    def queue_all(self) -> None:
        with self.group.read_state() as state:
            names: Iterable[str] = list(state.streams)
        for name in {*names, *self.engine.streams}:
            self.queue(name)

    async def catch_up(self) -> None:
        """Commits a Barrier after start and waits until it is applied here: every command
        committed before it is applied here too. Until then a stream missing from the state
        may only be a command not yet replayed (pysyncobj's own "ready" can come before the
        replay, from a stale commit index), so nothing is reconciled or denied."""
        started = self.clock.monotonic_s()
        while True:
            try:
                await self.group.propose(raft_pb2.RaftCommand(barrier=raft_pb2.Barrier()),
                                         timeout_s=limits.metadata_catch_up_attempt_s)
                break
            except RaftlogError as err:
                log.debug("catching up with the metadata: %s", err)
                await asyncio.sleep(limits.metadata_ready_poll_s)
        self._caught_up = True
        self._caught_up_event.set()
        log.info("metadata caught up in %.2f s (applied index %d)",
                 self.clock.monotonic_s() - started, self.state.applied_index)

    async def _wait_caught_up(self) -> None:
        await self._caught_up_event.wait()

    async def _reconcile_forever(self) -> None:
        await self._wait_caught_up()
        log.info("reconciling %d streams", self._reconcile.qsize())
        while True:
            name = await self._reconcile.get()
            if name is None:
                return
            self._queued.discard(name)  # a change applied from here on queues it again
            self._reconciling.add(name)  # `scan_troubles` waits for it
            try:
                await self.reconcile(name)
            except Exception:
                log.exception("reconciling stream %s failed; retrying", name,
                              extra=logctx.fields(stream=name))
                await asyncio.sleep(limits.register_retry_s)
                self.queue(name)
            finally:
                self._reconciling.discard(name)

    async def reconcile(self, name: str) -> None:
        """Brings the local copy of one stream in line with the committed assignment: its
        existence, config, role (primary at the epoch, or replica) and replication. Lines
        written meanwhile carry the stream and its committed fence epoch."""
        assignment = self.state.streams.get(name)
        with logctx.bind(**logctx.fields(
                stream=name, epoch=assignment.fence_epoch if assignment is not None else None)):
            await self._bring_in_line(name, assignment)

    async def _bring_in_line(self, name: str, assignment: StreamAssignment | None) -> None:
        local = self.engine.streams.get(name)
        if assignment is None or self.node_id not in assignment.replicas:
            self._loaded.discard(name)
            self._barred.pop(name, None)
            if self.replication is not None:
                self.replication.release(name)
            if local is not None:
                if local.role == ROLE_PRIMARY:
                    local.depose(self._not_primary(name))
                log.info("stream %s %s; removing the local copy", name,
                         "was deleted" if assignment is None else "moved off this node")
                await self.engine.delete(name)
            return
        if name in self._loaded:  # the first reconcile of a copy found on disk
            self._loaded.discard(name)
            if assignment.primary == self.node_id and len(assignment.replicas) > 1:
                self._bar(name, assignment)
        if local is None:
            log.info("stream %s has a copy here; creating it", name)
            await self.engine.create(assignment.config)
            local = self.engine.get(name)
        elif local.config != assignment.config:
            await self.engine.apply_config(name, assignment.config)
        if assignment.primary == self.node_id:
            await self._lead(local, assignment)
        else:
            self.barred(name, assignment)  # forgets a bar the epoch moved past
            self._follow(local)

    def _not_primary(self, name: str) -> RaftlogError:
        return RaftlogError(Reason.NOT_PRIMARY, f"this node is no longer the primary of "
                            f"{name!r}; retry with the same msg_id", stream=name)

    def _bar(self, name: str, assignment: StreamAssignment) -> None:
        """This node restarted as the named primary of a replicated stream: it does not lead
        it at that fence epoch again. Its copy may have lost an unsynced tail that its replicas
        hold (a primary sends batches while it fsyncs them), so leading on would give those
        seqs other messages (G1, G7). It follows instead and reports the stream in trouble
        at once; the Raft leader's failover round (node/cluster/failover.py) then fences a
        majority and promotes the most complete copy at the next epoch, this one included
        (it then leads at that epoch, a replica's tail truncated by the replicator)."""
        epoch = assignment.fence_epoch
        self._barred[name] = epoch
        why = self._barred_why(name, epoch)
        log.warning("stream %s: %s", name, why)
        # Reported in every Ping reply from now on; the scans keep it without a grace time.
        self.troubles[name] = replication_pb2.StreamTrouble(
            stream=name, assignment_epoch=epoch, why=why)

    def _barred_why(self, name: str, epoch: int) -> str:
        return (f"{self.node_id} restarted as the primary of {name!r} at epoch {epoch} and "
                "does not resume it; a failover must pick the most complete copy")

    def barred(self, name: str, assignment: StreamAssignment) -> bool:
        """This node must not lead `name` at the assignment's epoch (see `_bar`)."""
        barred = self._barred.get(name)
        if barred is None:
            return False
        if assignment.fence_epoch > barred:  # a failover moved the epoch on
            del self._barred[name]
            return False
        return True

    async def _lead(self, local: Stream, assignment: StreamAssignment) -> None:
        if self.barred(local.name, assignment):
            self._follow(local)
            return
        promoted = local.role != ROLE_PRIMARY or local.record.epoch != assignment.fence_epoch
        local.become_primary(epoch=assignment.fence_epoch)
        if self.replication is not None:
            self.replication.lead(local, replicas=assignment.replicas,
                                  epoch=assignment.fence_epoch,
                                  history=list(assignment.epoch_history))
        if local.replicator is None:
            local.set_commit_seq(local.durable_seq)
        if promoted:
            log.info("leading stream %s at fence epoch %d from seq %d", local.name,
                     assignment.fence_epoch, assignment.epoch_start_seq)
            await self._reload_consumers(local, assignment)

    async def _reload_consumers(self, local: Stream, assignment: StreamAssignment) -> None:
        """Consumer state may have moved on elsewhere (a former primary acked): read it again
        from the metadata. No barrier is needed: this runs after the promote (or override)
        that made this node primary was applied here, so every ack a former primary had
        committed is applied too, and any it commits later carries an older fence epoch and
        is skipped by the state machine (ConsumerProgress.fence_epoch)."""
        self.consumers.detach_stream(local.name)
        self.consumers.attach_stream(local, retention=assignment.config.retention,
                                     subjects=list(assignment.config.subjects))

    def _follow(self, local: Stream) -> None:
        if self.replication is not None:
            self.replication.release(local.name)
        if local.role == ROLE_PRIMARY:
            local.depose(self._not_primary(local.name))
        local.become_replica()

    async def ensure_replica(self, name: str) -> Stream:
        """The local copy of a stream this node is a replica of, created when missing."""
        assignment = self.state.streams.get(name)
        if assignment is None or self.node_id not in assignment.replicas or \
                not self.caught_up():
            raise RaftlogError(Reason.STREAM_NOT_FOUND,
                               f"this node holds no copy of {name!r} (yet)", stream=name)
        await self.reconcile(name)
        return self.engine.get(name)

