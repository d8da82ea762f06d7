"""The reaches into pysyncobj 0.3.17 that `RaftGroup` (raft/group.py) is built on: the
process-wide patches, the SyncObj and transport subclasses, and the construction of a SyncObj
over our journal. Each reach is covered by tests/process/test_raft_group.py.

It owns:
- the journal: `pysyncobj.syncobj.createJournal` is replaced by a function returning our
  `RocksJournal` while the SyncObj is constructed (`construct_syncobj`, under a lock, restored
  in `finally`); it is called exactly once, in `SyncObj.__init__`;
- durability: `_DurableTransport`, a `TCPTransport` subclass, syncs the journal before a follower
  acknowledges entries (`next_node_idx` with success) and at the end of every tick;
- no frame runs code: `pysyncobj.tcp_connection.pickle`, `pysyncobj.syncobj.pickle`,
  `pysyncobj.serializer.pickle` (and `pysyncobj.journal.loads`) are replaced by restricted
  codecs (`wire.py`) that pickle with protocol 5 and unpickle with an allowlist; the transport
  refuses utility commands (add/remove/status/transfer from anyone who can connect) and
  read-only peers;
- message interception for the election guard (raft/election_guard.py): the pre-vote message
  types raftlog adds, vote requests dropped before pysyncobj sees them, the guard run at the
  start of every tick;
- latency: pysyncobj's batched mode picks a command up at the next tick and sends entries when
  the append-entries timer expires, so a commit took about `append_entries_period_s` plus a
  tick (11-15 ms here). `_MetaSyncObj` wakes the tick thread when a command arrives (one pipe
  write while no wake is pending) and, at the end of a tick, sends the new entries at once when
  enough followers to make a majority have acknowledged everything sent to them, or when the
  commit index moved and a follower is idle, so that a follower waiting for its command's
  commit hears of it at once (`_send_early`). While entries are in flight, new ones gather and
  go with the next ack or the timer, so under load an append still carries many commands (one
  follower fsync each); alone, a command commits in about a round trip and two fsyncs;
- one replicated method, `_MetaSyncObj.apply_command(data: bytes)` (pysyncobj numbers
  replicated methods by sorted name; a second one would renumber this one);
- the CRITICAL "truncating already-applied log entries" records are counted, not printed
  (`TRUNCATION_LOG_FILTER`): they are routine under pipelining; the journal tells identical
  re-adds from conflicting ones, and `RaftGroup` logs a conflicting re-add of an applied index as
  the divergence it would be;
- `_raft_now`, pysyncobj's clock.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pysyncobj
import pysyncobj.journal
import pysyncobj.pickle
import pysyncobj.serializer
import pysyncobj.syncobj
import pysyncobj.tcp_connection
import pysyncobj.version
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.monotonic import monotonic as _pysyncobj_monotonic
from pysyncobj.pipe_notifier import PipeNotifier
from pysyncobj.transport import TCPTransport

from raftlog.base.errors import InvariantViolation
from raftlog.internal import raft_pb2
from raftlog.raft import wire
from raftlog.raft.journal import RocksJournal

if TYPE_CHECKING:
    from raftlog.raft.group import RaftGroup, RaftTimings

log = logging.getLogger(__name__)

PYSYNCOBJ_VERSION = "0.3.17"  # every reach into pysyncobj below was read from this version
_LEADER = pysyncobj.syncobj._RAFT_STATE.LEADER


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
NEWER_TERM = "raftlog_newer_term"  # a member's answer to append_entries below its term
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

    def _connectIfNecessarySingle(self, node: Any) -> bool:
        """pysyncobj's own, except that a member may be reached through another address (the
        group's `dial`: a proxy on the link) while it keeps its identity, its Raft address."""
        via = self._syncObj._raftlog_group.dial_address(node.address)
        if via == node.address:
            return bool(super()._connectIfNecessarySingle(node))
        connection = self._connections.get(node)
        if connection is not None and \
                connection.state != pysyncobj.tcp_connection.CONNECTION_STATE.DISCONNECTED:
            return True
        if not self._shouldConnect(node) or connection is None:
            return False
        last = self._lastConnectAttempt.get(node)
        if last is not None and \
                _pysyncobj_monotonic() - last < self._syncObj.conf.connectionRetryTime:
            return False
        self._lastConnectAttempt[node] = _pysyncobj_monotonic()
        host, _, port = via.rpartition(":")
        return bool(connection.connect(host, int(port)))

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
            if kind == NEWER_TERM:
                group._on_newer_term(node, message)
                return
            if kind == "request_vote" and group._ignores_vote(node, message):
                return
            if kind == "append_entries":
                group._on_append_entries(self, node, message)
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
        self._raftlog_wake_pending = False
        self._raftlog_waker: PipeNotifier | None = None
        self.raftlog_early_sends = 0  # appends sent by `_send_early` (status counters)
        self._raftlog_commit_sent = 0  # the commit index the last early send carried
        super().__init__(self_address, list(peers), conf, transportClass=_DurableTransport)
        self._raftlog_waker = PipeNotifier(self._poller)
        # After the transport's journal sync (registered while the transport was built).
        self.addOnTickCallback(self._send_early)

    def _onTick(self, timeToWait: float = 0.0) -> None:
        # Commands that arrive from here on find no wake pending and wake the next poll.
        self._raftlog_wake_pending = False
        # The election guard runs first: pysyncobj checks the election deadline at the start of
        # its tick, and after a pause (SIGSTOP, a starved thread) the deadline is already past.
        group = getattr(self, "_raftlog_group", None)
        if group is not None and getattr(group, "_obj", None) is not None:
            group._guard_elections(_raft_now())
        super()._onTick(timeToWait)

    def _applyCommand(self, command: Any, callback: Any, commandType: Any = None) -> None:
        super()._applyCommand(command, callback, commandType)
        waker = self._raftlog_waker
        if waker is not None and not self._raftlog_wake_pending:
            self._raftlog_wake_pending = True
            with contextlib.suppress(BlockingIOError):  # full of wakes: the poll will return
                waker.notify()

    def _send_early(self) -> None:
        """On the leader, at the end of a tick, sends appends before the timer when
        - enough followers for a majority have nothing in flight (their acknowledged index is
          the last one sent to them) and have entries they were not sent yet, or
        - the commit index moved since the last early send and a follower has nothing in
          flight: a follower that proposed a command (or serves reads) learns the commit now
          rather than at the next timed append.
        Otherwise the acks or the timer send what is new."""
        if self._SyncObj__raftState != _LEADER:
            return
        followers = self._SyncObj__otherNodes
        if not followers:
            return
        last = self._SyncObj__getCurrentLogIndex()
        connected = self._SyncObj__connectedNodes
        next_index, match_index = self._SyncObj__raftNextIndex, self._SyncObj__raftMatchIndex
        idle = [node for node in followers if node in connected
                and match_index.get(node, 0) >= next_index.get(node, 0) - 1]
        with_news = sum(1 for node in idle if next_index.get(node, 0) <= last)
        commit = self._SyncObj__raftCommitIndex
        if with_news >= (len(followers) + 1) // 2 or (idle and commit > self._raftlog_commit_sent):
            self._SyncObj__sendAppendEntries()
            self._raftlog_commit_sent = commit
            self.raftlog_early_sends += 1

    @replicated  # type: ignore[untyped-decorator]
    def apply_command(self, data: bytes) -> raft_pb2.RaftResult:
        # raftLastApplied is incremented after this returns: this entry's index is one above.
        return self._raftlog_group._apply_entry(self.raftLastApplied + 1, data)


def syncobj_conf(timings: RaftTimings, *, bind: str, secret: str, snapshot_path: str,
                 serializer: Callable[[str, Any], None],
                 deserializer: Callable[[str], tuple[Any, Any, set[Any]]],
                 serialize_checker: Callable[[], int]) -> SyncObjConf:
    """pysyncobj's configuration of a group: `timings`, batched appends, commands wait for a
    leader, dynamic membership, no fork, no journal file (`construct_syncobj` swaps ours in),
    snapshots written by the given hooks (raft/snapshot_io.py) to `snapshot_path`."""
    t = timings
    return SyncObjConf(
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
        fullDumpFile=snapshot_path,
        serializer=serializer,
        deserializer=deserializer,
        serializeChecker=serialize_checker,
    )


def construct_syncobj(*, group: RaftGroup, journal: RocksJournal, self_address: str,
                      peers: Sequence[str], conf: Any) -> _MetaSyncObj:
    """The SyncObj of `group`, with `journal` as its journal (starts the tick thread)."""
    with _construct_lock:
        original = pysyncobj.syncobj.createJournal
        pysyncobj.syncobj.createJournal = lambda journalFile=None: journal
        try:
            return _MetaSyncObj(group=group, journal=journal, self_address=self_address,
                                peers=peers, conf=conf)
        finally:
            pysyncobj.syncobj.createJournal = original
