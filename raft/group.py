"""`RaftGroup`: the cluster's metadata group over pysyncobj 0.3.17 — construction and timings,
proposals, membership changes, leadership transfer, status, close, and applying committed
commands (tick thread).

It is built from the group's modules, the only ones that import pysyncobj (each reach into it
is covered by tests/process/test_raft_group.py):
- `syncobj_glue`: every reach into pysyncobj's internals — the process-wide patches (restricted
  codecs, the truncation log filter), its configuration, the journal swap at construction, the
  durable and filtering transport, the SyncObj subclass and its one replicated method;
- `completions`: pysyncobj callbacks to asyncio futures, failure reasons to `RaftlogError`s;
- `election_guard`: the `ElectionGuard` mixin — pre-vote, leader stickiness, stuck-loop step-down;
- `snapshot_io`: the `SnapshotIO` mixin — pysyncobj's snapshot hooks (protobuf, never pickle).

Threading: construct `RaftGroup` in a thread that lives as long as the node — the node's main
thread. pysyncobj's tick thread exits as soon as the thread that constructed the SyncObj is gone.
The tick thread applies commands (under the state lock), runs the serializer, and calls the
pysyncobj callbacks; they are bridged to the event loop with `call_soon_threadsafe`. Nothing here
blocks the event loop except `close()` (up to `limits.raft_close_timeout_s`) and construction.

Timings (see `RaftTimings`): ticks every 5 ms, heartbeats every 10 ms, elections after 150-350
ms of silence, a leader that hears no majority for 350 ms steps down.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rocksdict import Rdict

from raftlog.base import limits
from raftlog.base.clock import Clock, SystemClock
from raftlog.base.errors import InvariantViolation, RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.raft import elections
from raftlog.raft.addresses import check_raft_config, split_address
from raftlog.raft.api import (
    OUTCOME_UNKNOWN,
    Applied,
    AppliedState,
    EventSink,
    GroupStatus,
    LeaderChange,
    OnApplied,
    OnLeaderChange,
    PeerStatus,
    encode_command,
    running_loop_or_none,
    stamped,
)
from raftlog.raft.completions import PendingCalls
from raftlog.raft.completions import failure_error as failure_error
from raftlog.raft.election_guard import ElectionGuard
from raftlog.raft.journal import RocksJournal
from raftlog.raft.snapshot_io import SnapshotIO
from raftlog.raft.state import apply
from raftlog.raft.state_rules import rejected
from raftlog.raft.syncobj_glue import DUMP_CODEC as DUMP_CODEC
from raftlog.raft.syncobj_glue import (
    LOG_CODEC,
    TRANSPORT_CODEC,
    TRUNCATION_LOG_FILTER,
    _MetaSyncObj,
    _raft_now,
    construct_syncobj,
    install_pysyncobj_patches,
    syncobj_conf,
)
from raftlog.raft.syncobj_glue import _DurableTransport as _DurableTransport

# `name as name`: re-exported from here, `failure_error` for callers of RaftGroup, `DUMP_CODEC`
# and `_DurableTransport` for tests/process/test_raft_group.py (it checks the patches).

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RaftTimings:
    """pysyncobj timing and sizing; the defaults elect a leader well under a second on a LAN."""

    tick_period_s: float = 0.005  # autoTickPeriod: poll timeout of the tick thread
    append_entries_period_s: float = 0.01  # heartbeat, and the batching window of commands
    election_timeout_min_s: float = 0.15  # must be > 3 heartbeats (pysyncobj validates it)
    election_timeout_max_s: float = 0.35
    leader_fallback_timeout_s: float = 0.35  # a leader without a majority steps down after this
    connection_timeout_s: float = 1.0  # silence after which a peer connection is dropped
    connection_retry_s: float = 0.5  # redial period of a lost peer
    commands_queue_max: int = 10_000  # proposals waiting for the tick thread; then OVERLOADED
    log_compaction_entries_min: int = 50_000  # snapshot after this many journal entries...
    log_compaction_interval_s: float = 600.0  # ...or this long after the last snapshot
    bind_retry_s: float = 0.2
    bind_attempts_max: int = 5  # then the constructor raises



# ---------------------------------------------------------------------------------------------
# RaftGroup


class RaftGroup(AppliedState, ElectionGuard, SnapshotIO):
    """The metadata group of one node; see the module docstring and `raftlog.raft.api`."""

    def __init__(
        self, *,
        self_address: str,
        peers: Sequence[str],
        journal_db: Rdict,
        journal_cfs: tuple[str, str] = ("raft_log", "raft_meta"),
        snapshot_path: str | os.PathLike[str],
        secret: str = "",
        bind_address: str | None = None,
        on_applied: OnApplied | None = None,
        on_leader_change: OnLeaderChange | None = None,
        clock: Clock | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        timings: RaftTimings | None = None,
        stuck: Callable[[], bool] | None = None,
        dial: Callable[[str], str] | None = None,
    ) -> None:
        """Binds the Raft port and starts pysyncobj's tick thread; raises RaftlogError
        (INVALID_CONFIG) for a bad address, a port that cannot be bound, or a non-loopback bind
        without a secret. `peers` are the other members' Raft addresses (self is ignored).
        `journal_cfs` = (log CF, meta CF) of `journal_db`. `dial` maps a member's Raft address
        to the address to connect to (a proxy on the link); by default the address itself.
        Call from the node's main thread."""
        self.self_address = self_address
        self.dial_address: Callable[[str], str] = dial or (lambda address: address)
        bind = bind_address or self_address
        split_address(self_address)
        for peer in peers:
            split_address(peer)
        check_raft_config(bind_address=bind, secret=secret)
        install_pysyncobj_patches()
        self._clock = clock or SystemClock()
        self._timings = timings or RaftTimings()
        self._events = EventSink(on_applied=on_applied, on_leader_change=on_leader_change,
                                 loop=loop or running_loop_or_none())
        AppliedState.__init__(self)
        self._failure = ""
        # Told how long each proposal took, failed ones included (the node's metrics), or None.
        self.on_proposal: Callable[[float], None] | None = None
        self._closed = False
        self._calls = PendingCalls()
        self._membership_lock: asyncio.Lock | None = None
        self._last_leader: tuple[bool, str | None] = (False, None)
        self._stuck = stuck or (lambda: False)  # is the node's serving loop stuck? (any thread)
        self._timeouts = elections.AdaptiveTimeouts(elections.Timeouts(
            election_min_s=self._timings.election_timeout_min_s,
            election_max_s=self._timings.election_timeout_max_s,
            leader_fallback_s=self._timings.leader_fallback_timeout_s))
        self._prevote = elections.PreVote()
        self._last_leader_contact_s = -1e9
        self._transfer_asked_s = -1e9
        self.election_counters: collections.Counter[str] = collections.Counter()
        self._conflicts_seen = 0
        self._snapshot_path = os.fspath(snapshot_path)
        os.makedirs(os.path.dirname(os.path.abspath(self._snapshot_path)), exist_ok=True)
        self._snapshot_written: int | None = None  # inode awaiting rename + directory fsync
        self._snapshot_failed = False
        self.journal = RocksJournal(journal_db, log_cf=journal_cfs[0], meta_cf=journal_cfs[1])
        self._obj = self._construct(peers=[p for p in peers if p != self_address], bind=bind,
                                    secret=secret)
        self._obj.addOnTickCallback(self._on_tick)
        LOG_CODEC.on_refused.append(self._on_log_entry_refused)
        try:
            self._obj.waitBinded()
        except Exception as err:
            self._stop(limits.raft_close_timeout_s)
            raise RaftlogError(Reason.INVALID_CONFIG, f"cannot listen on raft address {bind}",
                               bind_address=bind) from err

    def _construct(self, *, peers: list[str], bind: str, secret: str) -> _MetaSyncObj:
        conf = self._conf = syncobj_conf(
            self._timings, bind=bind, secret=secret, snapshot_path=self._snapshot_path,
            serializer=self._serialize, deserializer=self._deserialize,
            serialize_checker=self._check_serialized)
        return construct_syncobj(group=self, journal=self.journal,
                                 self_address=self.self_address, peers=peers, conf=conf)

    # -- the public API ------------------------------------------------------------------------

    async def propose(self, command: raft_pb2.RaftCommand, *, timeout_s: float
                      ) -> raft_pb2.RaftResult:
        """Replicates and applies the command; returns the state machine's result (see
        `raftlog.raft.api` for what the errors mean). Stamps `now_ms` when 0."""
        self._check_usable()
        data = encode_command(stamped(command, now_ms=self._clock.wall_ms()))
        started_s = self._clock.monotonic_s()
        try:
            result = await self._calls.call(
                lambda cb: self._obj.apply_command(data, callback=cb),
                timeout_s=timeout_s, what="proposal")
        finally:
            if self.on_proposal is not None:
                self.on_proposal(self._clock.monotonic_s() - started_s)
        if not isinstance(result, raft_pb2.RaftResult):
            raise InvariantViolation(f"raft: a proposal returned {type(result).__name__}")
        return result

    def is_leader(self) -> bool:
        """True while pysyncobj believes it leads. Two nodes may believe it at once for up to
        leader_fallback_timeout_s: confirm with a committed Barrier before relying on it."""
        return bool(self._obj._isLeader())

    def leader_address(self) -> str | None:
        leader = self._obj._getLeader()
        return None if leader is None else str(leader.id)

    def is_ready(self) -> bool:
        """Caught up with the leader's commit index once since start."""
        return bool(self._obj.isReady())

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._events.loop = loop

    async def add_member(self, address: str, *, timeout_s: float) -> None:
        """Adds a node to the Raft group (start it afterwards with the members as its peers).
        One change at a time; retried while the group is busy with another change."""
        split_address(address)
        if address in self._raft_members():
            raise RaftlogError(Reason.NODE_EXISTS, f"{address} is already a raft member")
        await self._change_membership(address, add=True, timeout_s=timeout_s)

    async def remove_member(self, address: str, *, timeout_s: float) -> None:
        members = self._raft_members()
        if address not in members:
            raise RaftlogError(Reason.NODE_NOT_FOUND, f"{address} is not a raft member")
        if address == self.self_address:
            raise RaftlogError(Reason.INVALID_ARGUMENT,
                               "a node cannot remove itself; ask another member")
        await self._change_membership(address, add=False, timeout_s=timeout_s)

    async def transfer_leadership(self, *, timeout_s: float) -> str:
        """Hands Raft leadership to the most caught-up connected member and waits until
        another member leads; returns its Raft address. NO_LEADER when this node does not
        lead, TIMEOUT when no other member took over within `timeout_s`.

        Tick thread, in one tick: pysyncobj's TimeoutNow to a fully caught-up member (asked
        again every `retry_s` while none is), then this node stops leading at once: voters
        that heard from a leader lately ignore plain vote requests (raft/elections.py), so
        the target needs this node's vote."""
        self._check_usable()
        if not self.is_leader():
            raise RaftlogError(Reason.NO_LEADER, "only the Raft leader can hand leadership over")
        retry_s, poll_s = 0.1, 0.01
        loop = asyncio.get_running_loop()
        deadline, asked = loop.time() + timeout_s, -retry_s
        wanted = threading.Event()

        def on_tick() -> None:  # tick thread
            if not wanted.is_set():
                return
            wanted.clear()
            self._hand_over_leadership()

        self._obj.addOnTickCallback(on_tick)
        try:
            while loop.time() < deadline:
                leader = self.leader_address()
                if not self.is_leader() and leader not in (None, self.self_address):
                    return str(leader)
                if self.is_leader() and loop.time() - asked >= retry_s:
                    asked = loop.time()
                    wanted.set()
                await asyncio.sleep(poll_s)
        finally:
            self._obj.removeOnTickCallback(on_tick)
        raise RaftlogError(Reason.TIMEOUT, f"no other member took Raft leadership over within "
                           f"{timeout_s} s", outcome=OUTCOME_UNKNOWN)

    def status(self) -> GroupStatus:
        raw = self._read_racy(self._obj.getStatus)
        prefix = "partner_node_status_server_"
        peers = tuple(
            PeerStatus(address=key[len(prefix):], connected=value == 2,
                       match_index=raw.get("match_idx_server_" + key[len(prefix):]))
            for key, value in sorted(raw.items()) if key.startswith(prefix)
        )
        leader = raw["leader"]
        return GroupStatus(
            self_address=self.self_address, term=raw["raft_term"],
            is_leader=raw["state"] == 2, leader=None if leader is None else str(leader.id),
            # pysyncobj counts an entry applied only after the callbacks that resolve proposals;
            # ours is set before them, so a caller never sees its own result unapplied.
            commit_index=raw["commit_idx"],
            applied_index=max(raw["last_applied"], self.journal.applied_index),
            log_entries=raw["log_len"], has_quorum=raw["has_quorum"], ready=self.is_ready(),
            peers=peers,
            journal={**self.journal.counters,
                     "truncation_logs_suppressed": TRUNCATION_LOG_FILTER.suppressed,
                     "refused_frames": TRANSPORT_CODEC.refused + LOG_CODEC.refused,
                     "events_dropped": self._events.dropped,
                     "early_appends": self._obj.raftlog_early_sends, **self.election_counters},
            failure=self._failure,
        )

    def close(self, *, timeout_s: float | None = None) -> None:
        """Stops the tick thread (waits up to timeout_s, by default
        `limits.raft_close_timeout_s`), syncs and lets go of the journal, and fails pending
        calls with SHUTTING_DOWN. The database stays open (the caller owns it)."""
        if self._closed:
            return
        self._closed = True
        self._stop(limits.raft_close_timeout_s if timeout_s is None else timeout_s)
        self._calls.fail_all(Reason.SHUTTING_DOWN, "the metadata group is closing")

    def _stop(self, timeout_s: float) -> None:
        with contextlib.suppress(ValueError):
            LOG_CODEC.on_refused.remove(self._on_log_entry_refused)
        self._obj.destroy()
        waited = threading.Event()
        for _ in range(max(1, int(timeout_s / limits.raft_close_poll_s))):
            if not self._obj.tick_thread_alive():
                break
            waited.wait(limits.raft_close_poll_s)
        if self._obj.tick_thread_alive():
            log.warning("raft: tick thread still running %.1f s after close", timeout_s)
        else:
            self.journal.close()  # pysyncobj closed it too; idempotent

    # -- internals: calls ----------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise RaftlogError(Reason.SHUTTING_DOWN, "the metadata group is closed")
        if self._failure:
            raise RaftlogError(Reason.INTERNAL, f"the metadata group stopped: {self._failure}")

    async def _change_membership(self, address: str, *, add: bool, timeout_s: float) -> None:
        self._check_usable()
        if self._membership_lock is None:
            self._membership_lock = asyncio.Lock()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        async with self._membership_lock:
            # From one member to two, the new configuration (which takes effect when appended)
            # needs the new node for a quorum: the change commits only once that node runs,
            # so wait for the append only (pysyncobj issue #51).
            appended_is_enough = add and len(self._raft_members()) == 1
            for attempt in range(limits.raft_membership_retries_max + 1):
                if loop.time() >= deadline:
                    break
                try:
                    await self._submit_membership(address, add=add, deadline=deadline,
                                                  appended_is_enough=appended_is_enough)
                    return
                except RaftlogError as err:
                    if err.reason is not Reason.MEMBERSHIP_CHANGE_IN_PROGRESS \
                            or attempt == limits.raft_membership_retries_max:
                        raise
                await asyncio.sleep(limits.raft_membership_retry_delay_s)
        raise RaftlogError(Reason.TIMEOUT, f"membership change of {address} timed out",
                           outcome=OUTCOME_UNKNOWN)

    async def _submit_membership(self, address: str, *, add: bool, deadline: float,
                                 appended_is_enough: bool) -> None:
        change = self._obj.addNodeToCluster if add else self._obj.removeNodeFromCluster
        loop = asyncio.get_running_loop()
        if not appended_is_enough:
            await self._calls.call(lambda cb: change(address, callback=cb),
                                   timeout_s=deadline - loop.time(), what="membership change")
            return
        future: asyncio.Future[Any] = loop.create_future()
        future.add_done_callback(lambda done: done.cancelled() or done.exception())
        change(address, callback=self._calls.bridge(loop, future))
        while not future.done() and address not in self._raft_members():
            if loop.time() >= deadline:
                raise RaftlogError(Reason.TIMEOUT, f"adding {address} timed out",
                                   outcome=OUTCOME_UNKNOWN)
            await asyncio.sleep(limits.raft_membership_poll_s)
        if future.done():
            future.result()  # raises the failure, if it failed

    def _raft_members(self) -> set[str]:
        others = self._read_racy(lambda: self._obj.otherNodes)
        return {self.self_address} | {str(node.id) for node in others}

    @staticmethod
    def _read_racy(read: Callable[[], Any]) -> Any:
        """Reads a pysyncobj structure the tick thread may resize meanwhile."""
        for _ in range(limits.raft_status_read_attempts_max - 1):
            try:
                return read()
            except RuntimeError:  # changed size during iteration
                continue
        return read()

    # -- internals: the tick thread ------------------------------------------------------------

    def _apply_entry(self, index: int, data: bytes) -> raft_pb2.RaftResult:
        """Tick thread: applies one committed command (every member, same order)."""
        if self._failure:
            raise InvariantViolation(f"raft: not applying index {index}: {self._failure}")
        try:
            command: raft_pb2.RaftCommand | None = raft_pb2.RaftCommand.FromString(data)
        except Exception:
            command = None
        try:
            with self._state_lock:
                if index <= self._state.applied_index:
                    raise InvariantViolation(
                        f"raft: index {index} applied after {self._state.applied_index}")
                result = (rejected(Reason.INVALID_ARGUMENT, "undecodable command")
                          if command is None else apply(self._state, command))
                self._state.applied_index = index
        except Exception as err:
            self._halt(f"applying index {index} failed: {err!r}")
            raise
        result.index = index
        self.journal.applied_index = index
        if self._events.wants_applied:
            self._events.applied(Applied(index=index, command=command, result=result))
        return result

    def _on_tick(self) -> None:
        """Tick thread, at the end of every tick: timeouts, leadership events and divergence
        checks (the election guard runs at its start, `_MetaSyncObj._onTick`). Keep it
        cheap."""
        now = _raft_now()
        timeouts = self._timeouts.on_tick(now)
        conf = self._conf
        conf.raftMinTimeout, conf.raftMaxTimeout = (timeouts.election_min_s,
                                                    timeouts.election_max_s)
        conf.leaderFallbackTimeout = timeouts.leader_fallback_s
        leader = self._obj._getLeader()
        current = (bool(self._obj._isLeader()), None if leader is None else str(leader.id))
        if current != self._last_leader:
            self._last_leader = current
            self._events.leader_changed(LeaderChange(is_leader=current[0], leader=current[1],
                                                     term=int(self._obj.raftCurrentTerm)))
        conflicts = self.journal.counters["readds_conflicting_applied"]
        if conflicts != self._conflicts_seen:
            self._conflicts_seen = conflicts
            log.critical("raft: %d applied journal entries were rewritten with different "
                         "content: this member may have diverged", conflicts)

    def _on_log_entry_refused(self, error: Exception) -> None:
        """A log entry (membership change or command wrapper) the restricted unpickler refused:
        hostile or corrupt. pysyncobj would retry applying it on every tick; stop instead."""
        if not self._failure:
            self._halt(f"a raft log entry was refused by the restricted unpickler: {error}")

    def _halt(self, why: str) -> None:
        """Stops participating: a member whose state is in doubt must not vote or apply."""
        log.critical("raft: halting the metadata group: %s", why)
        self._failure = why
        obj = getattr(self, "_obj", None)  # None while still constructing
        if obj is not None:
            obj.destroy()
