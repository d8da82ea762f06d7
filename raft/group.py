"""`RaftGroup`: the cluster's metadata group over pysyncobj 0.3.17 — the ONLY module that
imports pysyncobj.

It owns everything that reaches into pysyncobj (each reach is covered by
tests/process/test_raft_group.py):
- the journal: `pysyncobj.syncobj.createJournal` is replaced by a function returning our
  `RocksJournal` while the SyncObj is constructed (under a lock, restored in `finally`); it is
  called exactly once, in `SyncObj.__init__`;
- durability: `_DurableTransport`, a `TCPTransport` subclass, syncs the journal before a follower
  acknowledges entries (`next_node_idx` with success) and at the end of every tick;
- no frame runs code: `pysyncobj.tcp_connection.pickle`, `pysyncobj.syncobj.pickle`,
  `pysyncobj.serializer.pickle` (and `pysyncobj.journal.loads`) are replaced by restricted
  codecs (`wire.py`) that pickle with protocol 5 and unpickle with an allowlist; the transport
  refuses utility commands (add/remove/status/transfer from anyone who can connect) and
  read-only peers;
- snapshots never pickle: the `serializer` / `deserializer` / `serializeChecker` conf hooks
  write the protobuf `RaftSnapshot` (`snapshot_file.py`, with a CRC) and fsync the file and its
  directory; the checker
  reports success only after the directory fsync, so the journal prefix is dropped only once
  the snapshot that replaces it is durable;
- one replicated method, `apply_command(data: bytes)` (pysyncobj numbers replicated methods by
  sorted name; a second one would renumber this one);
- the CRITICAL "truncating already-applied log entries" records are counted, not printed:
  they are routine under pipelining; the journal tells identical re-adds from conflicting ones,
  and a conflicting re-add of an applied index is logged here as the divergence it would be.

Threading: construct `RaftGroup` in a thread that lives as long as the node — the node's main
thread. pysyncobj's tick thread exits as soon as the thread that constructed the SyncObj is gone.
The tick thread applies commands (under the state lock), runs the serializer, and calls the
pysyncobj callbacks; they are bridged to the event loop with `call_soon_threadsafe`. Nothing here
blocks the event loop except `close()` (up to `close_timeout_s`) and construction.

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pysyncobj
import pysyncobj.journal
import pysyncobj.pickle
import pysyncobj.serializer
import pysyncobj.syncobj
import pysyncobj.tcp_connection
import pysyncobj.version
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.monotonic import monotonic as _pysyncobj_monotonic
from pysyncobj.node import TCPNode
from pysyncobj.syncobj import _RAFT_STATE
from pysyncobj.transport import TCPTransport
from rocksdict import Rdict

from raftlog.base.clock import Clock, SystemClock
from raftlog.base.errors import InvariantViolation, RaftlogError, Reason
from raftlog.internal import raft_pb2
from raftlog.raft import elections, wire
from raftlog.raft.addresses import check_raft_config, split_address
from raftlog.raft.api import (
    OUTCOME_NOT_COMMITTED,
    OUTCOME_UNKNOWN,
    Applied,
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
from raftlog.raft.journal import RocksJournal
from raftlog.raft.snapshot_file import fsync_directory, read_snapshot_file, write_snapshot_file
from raftlog.raft.state import apply
from raftlog.raft.state_model import MetaState
from raftlog.raft.state_rules import rejected
from raftlog.raft.state_snapshot import encode_snapshot, from_snapshot

log = logging.getLogger(__name__)

PYSYNCOBJ_VERSION = "0.3.17"  # every reach into pysyncobj below was read from this version


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


membership_retry_max = 40  # REQUEST_DENIED retries of one membership change
membership_retry_delay_s = 0.05
membership_poll_s = 0.01  # while waiting for a change to be appended
close_timeout_s = 5.0
close_poll_s = 0.01
status_read_attempts_max = 5  # reads of pysyncobj's sets racing the tick thread


def _raft_now() -> float:
    """pysyncobj's clock (CLOCK_MONOTONIC_RAW, not time.monotonic's): every time compared with
    its own (election deadlines, response times) must come from it."""
    return float(_pysyncobj_monotonic())


# ---------------------------------------------------------------------------------------------
# Process-wide patches of pysyncobj


TRANSPORT_CODEC = wire.RestrictedPickle(allowed_globals=wire.TRANSPORT_GLOBALS, what="transport")
LOG_CODEC = wire.RestrictedPickle(allowed_globals=wire.LOG_GLOBALS, what="log entry")
DUMP_CODEC = wire.RestrictedPickle(allowed_globals=frozenset(), what="dump")

_patch_lock = threading.Lock()
_construct_lock = threading.Lock()
_patched = False


class _TruncationLogFilter(logging.Filter):
    """Counts pysyncobj's routine CRITICAL truncation records instead of printing them."""

    def __init__(self) -> None:
        super().__init__()
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) \
                and record.msg.startswith("truncating already-applied log entries"):
            self.suppressed += 1
            return False
        return True


TRUNCATION_LOG_FILTER = _TruncationLogFilter()


def install_pysyncobj_patches() -> None:
    """Idempotent; done by the first RaftGroup. Affects every SyncObj in the process."""
    global _patched
    with _patch_lock:
        if _patched:
            return
        if pysyncobj.version.VERSION != PYSYNCOBJ_VERSION:
            raise InvariantViolation(
                f"raftlog.raft.group was written against pysyncobj {PYSYNCOBJ_VERSION}, "
                f"found {pysyncobj.version.VERSION}: re-read its internals before upgrading")
        # Protocol 5 for anything still pickled by the module itself.
        pysyncobj.pickle.__dict__["__protocol"] = wire.pickle_protocol
        pysyncobj.tcp_connection.pickle = TRANSPORT_CODEC  # type: ignore[assignment]
        pysyncobj.syncobj.pickle = LOG_CODEC  # type: ignore[assignment]
        pysyncobj.serializer.pickle = DUMP_CODEC  # type: ignore[assignment]
        pysyncobj.journal.loads = DUMP_CODEC.loads
        logging.getLogger("pysyncobj.syncobj").addFilter(TRUNCATION_LOG_FILTER)
        _patched = True


# ---------------------------------------------------------------------------------------------
# pysyncobj subclasses

PREVOTE = "raftlog_prevote"  # message types raftlog adds to pysyncobj's (raft/elections.py)
PREVOTE_REPLY = "raftlog_prevote_reply"
TRANSFER_FLAG = "raftlog_transfer"


class _DurableTransport(TCPTransport):  # type: ignore[misc]
    """TCPTransport that makes the journal durable before acknowledging entries, and refuses
    the connections a member never needs (utility commands, read-only observers)."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        self._journal: RocksJournal = syncObj._raftlog_journal
        super().__init__(syncObj, selfNode, otherNodes)
        # Runs after the tick's own work: the leader's appends of this tick are durable before
        # the next tick counts the leader in a commit quorum.
        syncObj.addOnTickCallback(self._journal.sync)

    def send(self, node: Any, message: Any) -> bool:
        if isinstance(message, dict):
            kind = message.get("type")
            if kind == "next_node_idx" and message.get("success"):
                self._journal.sync()
                if self._journal.dirty:
                    raise InvariantViolation(
                        "raft journal still dirty before acknowledging entries")
                self._journal.counters["acks_after_sync"] += 1
            elif kind == "request_vote" and self._syncObj._raftlog_group._transferring():
                message[TRANSFER_FLAG] = True  # a leadership transfer: voters let it through
        return bool(super().send(node, message))

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        group: RaftGroup = self._syncObj._raftlog_group
        if isinstance(message, dict) and getattr(group, "_obj", None) is not None:
            kind = message.get("type")
            if kind in (PREVOTE, PREVOTE_REPLY):
                group._on_prevote_message(self, node, message)
                return
            if kind == "request_vote" and group._ignores_vote(node, message):
                return
            if kind == "append_entries":
                group._on_append_entries(message)
            elif kind == "timeout_now":
                group._on_timeout_now(node)
        super()._onMessageReceived(node, message)

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:
        handshaking = self._syncObj.encryptor is not None and not conn.sendRandKey
        if not handshaking and (isinstance(message, list) or message == "readonly"):
            log.warning("raft: refused a %s connection",
                        "utility" if isinstance(message, list) else "read-only")
            self._unknownConnections.discard(conn)
            conn.disconnect()
            return
        super()._onIncomingMessageReceived(conn, message)


class _MetaSyncObj(SyncObj):  # type: ignore[misc]
    """Attributes set before `super().__init__()` are pysyncobj's "internal" ones (never dumped;
    dumps are ours anyway)."""

    def __init__(self, *, group: RaftGroup, journal: RocksJournal, self_address: str,
                 peers: Sequence[str], conf: Any) -> None:
        self._raftlog_group = group
        self._raftlog_journal = journal
        super().__init__(self_address, list(peers), conf, transportClass=_DurableTransport)

    def _onTick(self, timeToWait: float = 0.0) -> None:
        # The election guard runs first: pysyncobj checks the election deadline at the start of
        # its tick, and after a pause (SIGSTOP, a starved thread) the deadline is already past.
        group = getattr(self, "_raftlog_group", None)
        if group is not None and getattr(group, "_obj", None) is not None:
            group._guard_elections(_raft_now())
        super()._onTick(timeToWait)

    @replicated  # type: ignore[untyped-decorator]
    def apply_command(self, data: bytes) -> raft_pb2.RaftResult:
        # raftLastApplied is incremented after this returns: this entry's index is one above.
        return self._raftlog_group._apply_entry(self.raftLastApplied + 1, data)


# ---------------------------------------------------------------------------------------------
# Snapshot entries


def _entry_pb(entry: Any) -> raft_pb2.JournalEntry:
    command, index, term = entry
    return raft_pb2.JournalEntry(index=index, term=term, command=bytes(command))


def _entry_tuple(entry: raft_pb2.JournalEntry) -> tuple[bytes, int, int]:
    return (entry.command, entry.index, entry.term)


_FAILURES: dict[int, tuple[Reason, str, str]] = {
    FAIL_REASON.QUEUE_FULL: (Reason.OVERLOADED, "too many metadata proposals waiting",
                             OUTCOME_NOT_COMMITTED),
    FAIL_REASON.MISSING_LEADER: (Reason.NO_LEADER, "the metadata group has no leader",
                                 OUTCOME_NOT_COMMITTED),
    FAIL_REASON.DISCARDED: (Reason.NO_LEADER, "another leader's entry replaced the command",
                            OUTCOME_NOT_COMMITTED),
    FAIL_REASON.NOT_LEADER: (Reason.NO_LEADER, "the command reached a node that is not leader",
                             OUTCOME_NOT_COMMITTED),
    FAIL_REASON.LEADER_CHANGED: (Reason.NO_LEADER, "the leader changed; the command may or "
                                 "may not commit", OUTCOME_UNKNOWN),
    FAIL_REASON.REQUEST_DENIED: (Reason.MEMBERSHIP_CHANGE_IN_PROGRESS,
                                 "another membership change is in progress",
                                 OUTCOME_NOT_COMMITTED),
    FAIL_REASON.UNKNOWN_OUTCOME: (Reason.NO_LEADER, "the command's outcome is unknown; it may "
                                  "or may not commit", OUTCOME_UNKNOWN),
}


def failure_error(fail_reason: int) -> RaftlogError:
    reason, message, outcome = _FAILURES.get(
        fail_reason, (Reason.INTERNAL, "unexpected raft failure", OUTCOME_UNKNOWN))
    return RaftlogError(reason, message, outcome=outcome, raft_fail_reason=fail_reason)


class _Completions:
    """Settles futures of one event loop from pysyncobj's tick thread, in order, with one
    loop wake-up per batch rather than one per command (a wake-up is a syscall)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: collections.deque[tuple[asyncio.Future[Any], Any, int]] = \
            collections.deque()
        self._scheduled = False

    def push(self, future: asyncio.Future[Any], result: Any, fail_reason: int) -> None:
        with self._lock:
            self._items.append((future, result, fail_reason))
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, collections.deque()
            self._scheduled = False
        for future, result, fail_reason in items:
            if future.done():
                continue  # timed out or cancelled: the outcome is reported as unknown
            if fail_reason == FAIL_REASON.SUCCESS:
                future.set_result(result)
            else:
                future.set_exception(failure_error(fail_reason))


class _Bridge:
    """A pysyncobj callback (tick thread, or the caller's thread for QUEUE_FULL) that settles
    an asyncio future on its loop."""

    __slots__ = ("_completions", "_future")

    def __init__(self, completions: _Completions, future: asyncio.Future[Any]) -> None:
        self._completions = completions
        self._future = future

    def __call__(self, result: Any, fail_reason: int) -> None:
        self._completions.push(self._future, result, fail_reason)


def _expire(future: asyncio.Future[Any], what: str, timeout_s: float) -> None:
    if not future.done():
        future.set_exception(RaftlogError(
            Reason.TIMEOUT, f"metadata {what} timed out after {timeout_s} s; it may or may not "
            "commit", outcome=OUTCOME_UNKNOWN))


# ---------------------------------------------------------------------------------------------
# RaftGroup


class RaftGroup:
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
    ) -> None:
        """Binds the Raft port and starts pysyncobj's tick thread; raises RaftlogError
        (INVALID_CONFIG) for a bad address, a port that cannot be bound, or a non-loopback bind
        without a secret. `peers` are the other members' Raft addresses (self is ignored).
        `journal_cfs` = (log CF, meta CF) of `journal_db`. Call from the node's main thread."""
        self.self_address = self_address
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
        self._state = MetaState()
        self._state_lock = threading.Lock()
        self._failure = ""
        self._closed = False
        self._pending: set[asyncio.Future[Any]] = set()
        self._completions: dict[asyncio.AbstractEventLoop, _Completions] = {}
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
            self._stop(close_timeout_s)
            raise RaftlogError(Reason.INVALID_CONFIG, f"cannot listen on raft address {bind}",
                               bind_address=bind) from err

    def _construct(self, *, peers: list[str], bind: str, secret: str) -> _MetaSyncObj:
        t = self._timings
        conf = self._conf = SyncObjConf(
            autoTickPeriod=t.tick_period_s,
            appendEntriesPeriod=t.append_entries_period_s,
            raftMinTimeout=t.election_timeout_min_s,
            raftMaxTimeout=t.election_timeout_max_s,
            leaderFallbackTimeout=t.leader_fallback_timeout_s,
            connectionTimeout=t.connection_timeout_s,
            connectionRetryTime=t.connection_retry_s,
            commandsQueueSize=t.commands_queue_max,
            logCompactionMinEntries=t.log_compaction_entries_min,
            logCompactionMinTime=t.log_compaction_interval_s,
            bindRetryTime=t.bind_retry_s,
            maxBindRetries=t.bind_attempts_max,
            appendEntriesUseBatch=True,
            commandsWaitLeader=True,
            dynamicMembershipChange=True,
            useFork=False,
            bindAddress=bind,
            password=secret or None,
            journalFile=None,
            fullDumpFile=self._snapshot_path,
            serializer=self._serialize,
            deserializer=self._deserialize,
            serializeChecker=self._check_serialized,
        )
        journal = self.journal
        with _construct_lock:
            original = pysyncobj.syncobj.createJournal
            pysyncobj.syncobj.createJournal = lambda journalFile=None: journal
            try:
                return _MetaSyncObj(group=self, journal=journal, self_address=self.self_address,
                                    peers=peers, conf=conf)
            finally:
                pysyncobj.syncobj.createJournal = original

    # -- the public API ------------------------------------------------------------------------

    async def propose(self, command: raft_pb2.RaftCommand, *, timeout_s: float
                      ) -> raft_pb2.RaftResult:
        """Replicates and applies the command; returns the state machine's result (see
        `raftlog.raft.api` for what the errors mean). Stamps `now_ms` when 0."""
        self._check_usable()
        data = encode_command(stamped(command, now_ms=self._clock.wall_ms()))
        result = await self._call(lambda cb: self._obj.apply_command(data, callback=cb),
                                  timeout_s=timeout_s, what="proposal")
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

    @property
    def state(self) -> MetaState:
        return self._state

    @contextlib.contextmanager
    def read_state(self) -> Iterator[MetaState]:
        with self._state_lock:
            yield self._state

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
            sent: list[int] = []
            obj = self._obj
            obj.transferLeadership(callback=lambda _, fail_reason: sent.append(fail_reason))
            if sent == [FAIL_REASON.SUCCESS]:
                obj._SyncObj__setState(_RAFT_STATE.FOLLOWER)
                obj._SyncObj__raftLeader = None
                obj._SyncObj__raftElectionDeadline = (
                    _raft_now() + self._timeouts.current.election_max_s)

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
            commit_index=raw["commit_idx"], applied_index=raw["last_applied"],
            log_entries=raw["log_len"], has_quorum=raw["has_quorum"], ready=self.is_ready(),
            peers=peers,
            journal={**self.journal.counters,
                     "truncation_logs_suppressed": TRUNCATION_LOG_FILTER.suppressed,
                     "refused_frames": TRANSPORT_CODEC.refused + LOG_CODEC.refused,
                     "events_dropped": self._events.dropped, **self.election_counters},
            failure=self._failure,
        )

    def close(self, *, timeout_s: float = close_timeout_s) -> None:
        """Stops the tick thread (waits up to timeout_s), syncs and lets go of the journal, and
        fails pending calls with SHUTTING_DOWN. The database stays open (the caller owns it)."""
        if self._closed:
            return
        self._closed = True
        self._stop(timeout_s)
        for future in list(self._pending):
            self._fail_later(future, RaftlogError(Reason.SHUTTING_DOWN,
                                                  "the metadata group is closing"))

    def _stop(self, timeout_s: float) -> None:
        with contextlib.suppress(ValueError):
            LOG_CODEC.on_refused.remove(self._on_log_entry_refused)
        self._obj.destroy()
        waited = threading.Event()
        for _ in range(max(1, int(timeout_s / close_poll_s))):
            if not self._obj.tick_thread_alive():
                break
            waited.wait(close_poll_s)
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

    async def _call(self, submit: Callable[[_Bridge], None], *, timeout_s: float,
                    what: str) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, future, what, timeout_s)
        self._pending.add(future)
        try:
            submit(_Bridge(self._completions_for(loop), future))
            return await future
        finally:
            timer.cancel()
            self._pending.discard(future)

    def _completions_for(self, loop: asyncio.AbstractEventLoop) -> _Completions:
        completions = self._completions.get(loop)
        if completions is None:
            completions = self._completions[loop] = _Completions(loop)
        return completions

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
            for attempt in range(membership_retry_max + 1):
                if loop.time() >= deadline:
                    break
                try:
                    await self._submit_membership(address, add=add, deadline=deadline,
                                                  appended_is_enough=appended_is_enough)
                    return
                except RaftlogError as err:
                    if err.reason is not Reason.MEMBERSHIP_CHANGE_IN_PROGRESS \
                            or attempt == membership_retry_max:
                        raise
                await asyncio.sleep(membership_retry_delay_s)
        raise RaftlogError(Reason.TIMEOUT, f"membership change of {address} timed out",
                           outcome=OUTCOME_UNKNOWN)

    async def _submit_membership(self, address: str, *, add: bool, deadline: float,
                                 appended_is_enough: bool) -> None:
        change = self._obj.addNodeToCluster if add else self._obj.removeNodeFromCluster
        loop = asyncio.get_running_loop()
        if not appended_is_enough:
            await self._call(lambda cb: change(address, callback=cb),
                             timeout_s=deadline - loop.time(), what="membership change")
            return
        future: asyncio.Future[Any] = loop.create_future()
        future.add_done_callback(lambda done: done.cancelled() or done.exception())
        change(address, callback=_Bridge(self._completions_for(loop), future))
        while not future.done() and address not in self._raft_members():
            if loop.time() >= deadline:
                raise RaftlogError(Reason.TIMEOUT, f"adding {address} timed out",
                                   outcome=OUTCOME_UNKNOWN)
            await asyncio.sleep(membership_poll_s)
        if future.done():
            future.result()  # raises the failure, if it failed

    def _fail_later(self, future: asyncio.Future[Any], error: RaftlogError) -> None:
        def fail() -> None:
            if not future.done():
                future.set_exception(error)
        with contextlib.suppress(RuntimeError):
            future.get_loop().call_soon_threadsafe(fail)

    def _raft_members(self) -> set[str]:
        others = self._read_racy(lambda: self._obj.otherNodes)
        return {self.self_address} | {str(node.id) for node in others}

    @staticmethod
    def _read_racy(read: Callable[[], Any]) -> Any:
        """Reads a pysyncobj structure the tick thread may resize meanwhile."""
        for _ in range(status_read_attempts_max - 1):
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

    # -- internals: elections (raft/elections.py has the rules) --------------------------------

    def _guard_elections(self, now: float) -> None:
        """Tick thread: a follower stands for election only after a pre-vote majority and
        never while its serving loop is stuck; a leader whose loop is stuck steps down."""
        obj = self._obj
        state = obj._SyncObj__raftState
        stuck = self._stuck()
        if state == _RAFT_STATE.LEADER:
            if stuck:
                self._step_down(now)
            return
        if obj._SyncObj__transferInProgress:
            return
        others = obj._SyncObj__otherNodes
        if obj._SyncObj__raftElectionDeadline > now + 2 * self._timings.tick_period_s:
            return
        if stuck:
            obj._SyncObj__raftElectionDeadline = now + self._timeouts.current.election_max_s
            return
        if not others or self._prevote.granted(now):
            return  # the election may start on the next tick
        # No word from a leader for an election timeout: say there is none (callers fail fast)
        # while the pre-vote decides whether to stand.
        obj._SyncObj__raftLeader = None
        obj._SyncObj__raftElectionDeadline = now + elections.prevote_retry_s
        if self._prevote.due(now):
            term = int(obj.raftCurrentTerm) + 1
            self._prevote.start(term=term, now_s=now)
            self.election_counters["prevotes_asked"] += 1
            for node in list(others):
                obj._SyncObj__transport.send(node, {
                    "type": PREVOTE, "term": term,
                    "last_log_index": obj._SyncObj__getCurrentLogIndex(),
                    "last_log_term": obj._SyncObj__getCurrentLogTerm()})

    def _step_down(self, now: float) -> None:
        obj = self._obj
        log.warning("raft: this node's serving loop is stuck; giving up Raft leadership")
        self.election_counters["stepped_down_stuck"] += 1
        obj.transferLeadership()  # best effort: needs a follower that is fully caught up
        obj._SyncObj__setState(_RAFT_STATE.FOLLOWER)
        obj._SyncObj__raftLeader = None
        obj._SyncObj__raftElectionDeadline = now + self._timeouts.current.election_max_s

    def _sticky(self, now: float) -> bool:
        return elections.sticky(
            now_s=now, last_leader_contact_s=self._last_leader_contact_s,
            election_min_s=self._timeouts.current.election_min_s,
            is_leader_with_quorum=self._obj._SyncObj__raftState == _RAFT_STATE.LEADER)

    def _ignores_vote(self, node: Any, message: dict[str, Any]) -> bool:
        """Tick thread: a vote request while this member has a working leader is dropped
        before pysyncobj sees it (it would adopt the higher term and depose the leader).
        Except on the leader, from a member that has stopped answering it: that member may
        have raised its term past the leader's (two candidates raced) and then ignores the
        leader's lower-term entries for good; letting its request through makes the leader
        adopt the term and a new election include it (what a Raft reply's term would do)."""
        now = _raft_now()
        if message.get(TRANSFER_FLAG) or not self._sticky(now):
            return False
        obj = self._obj
        if obj._SyncObj__raftState == _RAFT_STATE.LEADER:
            answered = obj._SyncObj__lastResponseTime.get(node, now)
            if now - answered > self._timeouts.current.election_min_s:
                self.election_counters["votes_from_silent_members"] += 1
                return False
        self.election_counters["votes_ignored"] += 1
        return True

    def _on_timeout_now(self, node: Any) -> None:
        """The leader hands leadership to this node (pysyncobj starts the election on the
        next tick, and clears its own flag before sending the vote requests)."""
        if node == self._obj._getLeader():
            self._transfer_asked_s = _raft_now()

    def _transferring(self) -> bool:
        """Tick thread: this node's vote requests are those of a leadership transfer."""
        return _raft_now() - self._transfer_asked_s < self._timeouts.current.election_max_s

    def _on_append_entries(self, message: dict[str, Any]) -> None:
        if int(message.get("term", 0)) >= int(self._obj.raftCurrentTerm):
            self._last_leader_contact_s = _raft_now()

    def _on_prevote_message(self, transport: Any, node: Any, message: dict[str, Any]) -> None:
        """Tick thread: answers a pre-vote request, or counts an answer to ours."""
        obj = self._obj
        now = _raft_now()
        term = int(message.get("term", 0))
        if message["type"] == PREVOTE:
            granted = (term > int(obj.raftCurrentTerm) and not self._sticky(now)
                       and elections.up_to_date(
                           candidate_term=int(message.get("last_log_term", 0)),
                           candidate_index=int(message.get("last_log_index", 0)),
                           own_term=int(obj._SyncObj__getCurrentLogTerm()),
                           own_index=int(obj._SyncObj__getCurrentLogIndex())))
            self.election_counters["prevotes_granted" if granted else "prevotes_denied"] += 1
            transport.send(node, {"type": PREVOTE_REPLY, "term": term, "granted": granted})
            return
        if message.get("granted") and self._prevote.grant(
                voter=str(node.id), term=term, members=len(obj._SyncObj__otherNodes) + 1,
                now_s=now):
            obj._SyncObj__raftElectionDeadline = 0  # stand for election on the next tick
            self.election_counters["elections_started"] += 1

    def leader_contact_age_s(self) -> float:
        """Seconds since this node last heard from a Raft leader (0 while it leads)."""
        if self._obj._isLeader():
            return 0.0
        return _raft_now() - self._last_leader_contact_s

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

    def _serialize(self, tmp_path: str, data: Any) -> None:
        """pysyncobj serializer (tick thread): the state as of the last applied entry."""
        last_entry, prev_entry, cluster = data
        self._snapshot_written, self._snapshot_failed = None, False
        try:
            with self._state_lock:
                if self._state.applied_index > last_entry[1]:
                    raise InvariantViolation(
                        f"raft: state at {self._state.applied_index} is past the snapshot "
                        f"entry {last_entry[1]}")
                # The state as of last_entry: entries after the last command (NO_OPs,
                # membership changes) do not change it.
                payload = encode_snapshot(self._state, last_applied_index=last_entry[1])
            payload += raft_pb2.RaftSnapshot(
                last_entry=_entry_pb(last_entry), prev_entry=_entry_pb(prev_entry),
                raft_nodes=sorted(str(node.id) for node in cluster)).SerializeToString()
            self._snapshot_written = write_snapshot_file(tmp_path, payload)
        except Exception:
            self._snapshot_failed = True
            log.exception("raft: writing the snapshot failed")
            raise

    def _check_serialized(self) -> int:
        """pysyncobj serializeChecker (tick thread, every tick). pysyncobj renames the file
        right after the serializer returns; success is reported only once that rename is
        durable, since pysyncobj then drops the journal prefix the snapshot replaces."""
        if self._snapshot_failed:
            self._snapshot_failed = False
            return int(SERIALIZER_STATE.FAILED)
        inode = self._snapshot_written
        if inode is None:
            return int(SERIALIZER_STATE.NOT_SERIALIZING)
        self._snapshot_written = None
        try:
            if os.stat(self._snapshot_path).st_ino != inode:
                return int(SERIALIZER_STATE.FAILED)
            fsync_directory(os.path.dirname(os.path.abspath(self._snapshot_path)))
        except OSError:
            log.exception("raft: checking the snapshot failed")
            return int(SERIALIZER_STATE.FAILED)
        return int(SERIALIZER_STATE.SUCCESS)

    def _deserialize(self, path: str) -> tuple[Any, Any, set[Any]]:
        """pysyncobj deserializer (tick thread): at start, and when a snapshot was received.
        Replaces the state; returns (last entry, previous entry, Raft members)."""
        try:
            snapshot = read_snapshot_file(path)
            state = from_snapshot(snapshot)
            if snapshot.last_entry.index != snapshot.last_applied_index:
                raise InvariantViolation("raft: snapshot index does not match its last entry")
        except Exception as err:
            self._halt(f"loading snapshot {path} failed: {err!r}")
            raise
        with self._state_lock:
            self._state = state
        self.journal.applied_index = state.applied_index
        self._events.applied(Applied(index=state.applied_index, command=None, result=None))
        # Node objects, not ids: pysyncobj compares them with its own node to drop itself.
        nodes = {TCPNode(address) for address in snapshot.raft_nodes}
        return _entry_tuple(snapshot.last_entry), _entry_tuple(snapshot.prev_entry), nodes
