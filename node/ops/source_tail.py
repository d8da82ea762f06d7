"""One source tail: copies the messages of one source stream into a sourcing stream, on the
sourcing stream's primary (sources.py starts and stops it).

Where it stands is recorded with what it copies, never beside it: every copied message gets the
msg_id `src:<source>:<seq>` (and the headers Raftlog-Source-Stream / -Seq / -Ts-Ms, plus
-Subject when the subject was transformed and -Msg-Id when the source message had one). A
starting tail reads its sourcing stream backwards from the end for the newest message with its
source's msg_id (at most limits.source_position_scan_max messages, a page of
limits.source_position_page per turn of the event loop) and goes on from the seq after it; a
retried append of a message already stored is absorbed by the stream's dedupe window. So a tail
that moves to another node, or restarts, neither skips nor repeats a message.

A round: ReadMessages on the source (through the operations, so forwarded to the source's
primary, waiting up to limits.source_read_wait_ms when caught up), the subject transform, then
one append of the batch to the local engine. The append goes to the engine directly, never
forwarded: a tail on a node that lost the stream is refused (NOT_PRIMARY) instead of writing
through the new primary beside that primary's own tail.

Errors: a message the transform does not match, or that the sourcing stream refuses for good
(subject not accepted, too large), is left out, recorded in the status and sent to the
dead-letter stream as a JSON record; the next ones are copied. A read that fails (source
missing or failing over) is retried from the same position; an append that fails (this node
failing over) makes the tail find its position again. When the source removed messages the
tail had not read yet, on_drop decides: halt (the tail stops, last_error says why, until the
stream moves or the node restarts and finds the gap again) or skip to the source's first seq.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.base.subject_transform import TransformMismatch
from raftlog.node.engine.log import LogEntry
from raftlog.node.engine.stream_config import source_transform
from raftlog.node.engine.streams import StreamEngine
from raftlog.node.ops.source_status import EVENT, TRANSIENT, TailStatus
from raftlog.node.ops.streams import StreamOps
from raftlog.node.transport import logctx
from raftlog.node.transport.calls import Call
from raftlog.v1 import streams_pb2, types_pb2

log = logging.getLogger(__name__)

SOURCE_STREAM_HEADER = "Raftlog-Source-Stream"
SOURCE_SEQ_HEADER = "Raftlog-Source-Seq"
SOURCE_TS_HEADER = "Raftlog-Source-Ts-Ms"
SOURCE_SUBJECT_HEADER = "Raftlog-Source-Subject"
SOURCE_MSG_ID_HEADER = "Raftlog-Source-Msg-Id"
_OWN_HEADERS = frozenset(name.lower() for name in (
    SOURCE_STREAM_HEADER, SOURCE_SEQ_HEADER, SOURCE_TS_HEADER, SOURCE_SUBJECT_HEADER,
    SOURCE_MSG_ID_HEADER))
DEAD_LETTER_SUBJECT_PREFIX = "sources"  # a record's subject: sources.<sourcing>.<source>.<kind>

KIND_TRANSFORM_MISMATCH = "transform_mismatch"
KIND_APPEND_FAILED = "append_failed"
KIND_ON_DROP_HALT = "on_drop_halt"
KIND_ON_DROP_SKIP = "on_drop_skip"
KIND_POSITION_UNKNOWN = "position_unknown"


def source_msg_id(source: str, seq: int) -> str:
    return f"src:{source}:{seq}"


def sourced_seq(entry: LogEntry, source: str) -> int | None:
    """The source seq a stored message was copied from, if it was copied from `source`."""
    prefix = f"src:{source}:"
    if entry.msg_id.startswith(prefix):
        rest = entry.msg_id[len(prefix):]
        if rest.isdigit():
            return int(rest)
    return None


def copy_entry(message: types_pb2.Message, *, source: str, subject: str
               ) -> streams_pb2.PublishEntry:
    """The message as the sourcing stream stores it: payload and headers kept (but for an
    earlier hop's source headers, replaced by this one's), the origin in headers."""
    headers = [h for h in message.headers if h.key.lower() not in _OWN_HEADERS]
    headers.append(types_pb2.Header(key=SOURCE_STREAM_HEADER, value=source))
    headers.append(types_pb2.Header(key=SOURCE_SEQ_HEADER, value=str(message.seq)))
    headers.append(types_pb2.Header(key=SOURCE_TS_HEADER, value=str(message.ts_ms)))
    if subject != message.subject:
        headers.append(types_pb2.Header(key=SOURCE_SUBJECT_HEADER, value=message.subject))
    if message.msg_id:
        headers.append(types_pb2.Header(key=SOURCE_MSG_ID_HEADER, value=message.msg_id))
    return streams_pb2.PublishEntry(subject=subject, payload=message.payload, headers=headers,
                                    msg_id=source_msg_id(source, message.seq))


def _refused_for_good(error: RaftlogError) -> bool:
    """An append error that a retry would meet again (the message itself is the problem)."""
    return error.status_name == "INVALID_ARGUMENT"


def _call(wait_ms: int = 0) -> Call:
    return Call(deadline=time.monotonic() + wait_ms / 1000 + limits.forward_timeout_s_default)


class _Halted(Exception):
    """The tail stops until it is started again (on_drop=halt, position unknown)."""


class _AppendFailed(Exception):
    def __init__(self, error: RaftlogError) -> None:
        super().__init__(error.message)
        self.error = error


class SourceTail:
    def __init__(self, *, streams: StreamOps, engine: StreamEngine, sourcing: str,
                 source: types_pb2.StreamSource, status: TailStatus, clock: Clock) -> None:
        self._streams = streams
        self._engine = engine
        self._sourcing = sourcing
        self.source = source
        self.status = status
        self._clock = clock
        self._transform = source_transform(source)  # checked when the stream was created

    @property
    def _name(self) -> str:
        return self.source.stream

    async def run(self) -> None:
        """Copies until cancelled; its lines carry the sourcing stream (the one it writes)."""
        with logctx.bind(stream=self._sourcing):
            await self._run()

    async def _run(self) -> None:
        cursor: int | None = None
        pause_ms = limits.source_retry_ms
        while True:
            try:
                if cursor is None:
                    cursor = await self._start_seq()
                cursor = await self._round(cursor)
                pause_ms = limits.source_retry_ms
                continue
            except _Halted:
                self.status.halted = True
                await asyncio.Event().wait()  # until cancelled
            except _AppendFailed as exc:
                cursor = None  # the stream itself says where to go on
                self._error(f"appending to {self._sourcing!r} failed: "
                            f"{exc.error.reason.name}: {exc.error.message}", kind=TRANSIENT)
            except RaftlogError as err:
                self._error(err.message if err.reason == Reason.STREAM_NOT_FOUND
                            else f"{err.reason.name}: {err.message}", kind=TRANSIENT)
            # Doubling: a source that does not exist costs its confirmation (a Raft barrier)
            # once per pause.
            await asyncio.sleep(pause_ms / 1000)
            pause_ms = min(pause_ms * 2, limits.source_retry_ms_max)

    def _error(self, text: str, *, kind: str) -> None:
        self.status.record_error(text, now_ms=self._clock.wall_ms(), kind=kind)
        log.warning("source tail %s <- %s: %s", self._sourcing, self._name, text)

    # ------------------------------------------------------------------ position

    async def _start_seq(self) -> int:
        recorded = await self._recorded_seq()
        if recorded is not None:
            self.status.last_sourced_seq = recorded
            return recorded + 1
        return await self._initial_seq()

    async def _recorded_seq(self) -> int | None:
        """The source seq of the newest message copied from the source, read back from the
        sourcing stream (stored copies count: on its primary they commit or the tail is
        stopped); None when the whole stream holds none."""
        stream = self._engine.get(self._sourcing)
        stream.check_readable()
        seq, lowest, looked_at = stream.last_seq, max(stream.first_seq, 1), 0
        while seq >= lowest:
            if looked_at >= limits.source_position_scan_max:
                await self._fail(KIND_POSITION_UNKNOWN, seq=0, subject="", text=(
                    f"none of the newest {limits.source_position_scan_max} messages of "
                    f"{self._sourcing!r} was copied from {self._name!r}: the tail cannot tell "
                    "where it stopped and halts rather than copy messages twice"))
                raise _Halted
            entry = stream.peek_stored(seq)
            found = None if entry is None else sourced_seq(entry, self._name)
            if found is not None:
                return found
            seq -= 1
            looked_at += 1
            if looked_at % limits.source_position_page == 0:
                await asyncio.sleep(0)
                stream = self._engine.get(self._sourcing)
                stream.check_readable()
        return None

    async def _initial_seq(self) -> int:
        """Nothing copied yet: the configured start (the first message at or after start_seq
        or start_time_ms), no further back than max_initial_backfill from the source's end."""
        spec = self.source
        probe = await self._read(from_seq=spec.start_seq or 1, start_time_ms=spec.start_time_ms,
                                 limit=1, wait_ms=0)
        start = probe.messages[0].seq if probe.messages else probe.next_seq
        if spec.max_initial_backfill:
            start = max(start, probe.last_seq - spec.max_initial_backfill + 1)
        return max(start, 1)

    # ------------------------------------------------------------------ rounds

    async def _read(self, *, from_seq: int, limit: int, wait_ms: int, start_time_ms: int = 0
                    ) -> streams_pb2.ReadMessagesResponse:
        request = streams_pb2.ReadMessagesRequest(
            stream=self._name, from_seq=from_seq, start_time_ms=start_time_ms,
            filter_subject=self.source.filter_subject, limit=limit, max_wait_ms=wait_ms)
        try:
            return await self._streams.read_messages(request, _call(wait_ms))
        except RaftlogError as err:
            if err.reason == Reason.STREAM_NOT_FOUND:
                raise RaftlogError(Reason.STREAM_NOT_FOUND,
                                   f"source stream {self._name!r} does not exist",
                                   stream=self._name) from None
            raise

    async def _round(self, cursor: int) -> int:
        """Reads from `cursor`, copies what it got; returns where the next round starts."""
        status = self.status
        status.next_seq = cursor
        reply = await self._read(from_seq=cursor, limit=limits.source_read_batch_max,
                                 wait_ms=limits.source_read_wait_ms)
        status.source_last_seq = reply.last_seq
        if cursor < reply.first_seq:
            await self._dropped(cursor, first_seq=reply.first_seq)
        elif cursor > reply.last_seq + 1:
            raise RaftlogError(Reason.SEQ_GAP, f"source stream {self._name!r} ends at seq "
                               f"{reply.last_seq}, before this tail's position {cursor} (was it "
                               "deleted and created again?)", stream=self._name)
        errors_before = status.errors_total
        entries: list[streams_pb2.PublishEntry] = []
        seqs: list[int] = []
        for message in reply.messages:
            subject = message.subject
            if self._transform is not None:
                try:
                    subject = self._transform.apply(subject)
                except TransformMismatch as exc:
                    await self._fail(KIND_TRANSFORM_MISMATCH, seq=message.seq,
                                     subject=message.subject, text=str(exc))
                    continue
            entries.append(copy_entry(message, source=self._name, subject=subject))
            seqs.append(message.seq)
        status.pulled_total += len(reply.messages)
        copied = await self._append(entries, seqs) if entries else 0
        status.next_seq = reply.next_seq
        if status.errors_total == errors_before:
            status.clear_error(copied=copied > 0)
        return reply.next_seq

    async def _append(self, entries: list[streams_pb2.PublishEntry], seqs: list[int]) -> int:
        """Appends the copies here; returns how many were stored (new or already there)."""
        try:
            outcomes = await self._engine.publish(self._sourcing, entries)
        except RaftlogError as err:
            raise _AppendFailed(err) from None
        stored = 0
        for entry, seq, outcome in zip(entries, seqs, outcomes, strict=True):
            if isinstance(outcome, RaftlogError):
                if not _refused_for_good(outcome):
                    raise _AppendFailed(outcome)
                await self._fail(KIND_APPEND_FAILED, seq=seq, subject=entry.subject,
                                 text=f"{outcome.reason.name}: {outcome.message}")
                continue
            stored += 1
            self.status.appended_total += 0 if outcome.duplicate else 1
            self.status.last_sourced_seq = seq
        return stored

    async def _dropped(self, cursor: int, *, first_seq: int) -> None:
        """The source removed seqs cursor..first_seq-1 before the tail read them."""
        gap = (f"source stream {self._name!r} removed seqs {cursor}..{first_seq - 1} before "
               "they were copied")
        if self.source.on_drop == types_pb2.SOURCE_ON_DROP_SKIP_TO_FIRST_AVAILABLE:
            await self._fail(KIND_ON_DROP_SKIP, seq=cursor, subject="",
                             text=f"{gap}; skipped to seq {first_seq} (on_drop=skip)")
            return
        await self._fail(KIND_ON_DROP_HALT, seq=cursor, subject="",
                         text=f"{gap}; halted (on_drop=halt)")
        raise _Halted

    # ------------------------------------------------------------------ errors

    async def _fail(self, kind: str, *, seq: int, subject: str, text: str) -> None:
        """Records an error of one message (or gap) and sends it to the dead-letter stream."""
        self._error(text, kind=EVENT)
        dlq = self.source.dlq_stream
        if not dlq:
            return
        record = {
            "kind": kind, "sourcing_stream": self._sourcing, "source_stream": self._name,
            "source_seq": seq, "subject": subject,
            "error": text[:limits.source_error_chars_max],
            "ts_ms": self._clock.wall_ms(), "node": self.status.node,
        }
        request = streams_pb2.PublishRequest(
            stream=dlq, subject=f"{DEAD_LETTER_SUBJECT_PREFIX}.{self._sourcing}.{self._name}."
                                f"{kind}",
            payload=json.dumps(record, sort_keys=True).encode(),
            msg_id=f"dlq:{self._sourcing}:{self._name}:{seq}:{kind}")
        try:
            await self._streams.publish(request, _call())
        except RaftlogError as err:
            self.status.last_error = (f"{self.status.last_error} (not recorded in dead-letter "
                                      f"stream {dlq!r}: {err.message})"
                                      )[:limits.source_error_chars_max]
            log.warning("source tail %s <- %s: dead-letter stream %s: %s", self._sourcing,
                        self._name, dlq, err.message)
