"""What a consumer sees of its stream: the `StreamLog` protocol and its in-memory twin.

The stream engine (`Stream`, stream.py) implements it over its `MessageStore` (store.py);
consumers (`consumers.py`) use only this. All methods run on the node's event loop thread; none
blocks.

Seq rules: seqs are 1..last_seq without gaps when assigned; removed messages leave holes that
`read` reports as None. Only seqs <= `commit_seq` may be handed to a consumer (G4).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from raftlog.base import subjects
from raftlog.v1 import types_pb2

Answer = RepeatedCompositeFieldContainer[types_pb2.Message]  # the messages field of an answer


class LogEntry(NamedTuple):
    """One message as the log holds it. A named tuple: every read makes one (a fetch of 100
    makes 100), and a tuple is built in a third of a frozen dataclass's time."""

    seq: int
    subject: str
    ts_ms: int
    payload: bytes
    headers: tuple[tuple[str, str], ...] = ()
    msg_id: str = ""

    @property
    def size_bytes(self) -> int:
        size = len(self.payload) + len(self.subject)
        if self.headers:
            size += sum(len(k) + len(v) for k, v in self.headers)
        return size


class NewRun(NamedTuple):
    """What `StreamLog.fill_new` added to an answer."""

    seqs: list[int]  # ascending
    payload_bytes: int  # of their payloads together
    full: bool  # it stopped at the payload room, with messages left


def fill_message(message: types_pb2.Message, stream: str, entry: LogEntry, *,
                 deliver_count: int) -> types_pb2.Message:
    """`message` (new, or just added to an answer) set to `entry` as delivered to a consumer."""
    message.seq = entry.seq
    message.subject = entry.subject
    message.ts_ms = entry.ts_ms
    message.payload = entry.payload
    if entry.msg_id:
        message.msg_id = entry.msg_id
    message.deliver_count = deliver_count
    message.stream = stream
    if entry.headers:  # most messages have none (a hot path: fetch)
        message.headers.extend(types_pb2.Header(key=key, value=value)
                               for key, value in entry.headers)
    return message


class StreamLog(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def first_seq(self) -> int:
        """Lowest seq that may still be stored (last_seq + 1 when empty)."""
        ...

    @property
    def commit_seq(self) -> int:
        """Highest seq that is durable and visible."""
        ...

    @property
    def last_seq(self) -> int:
        """Highest seq stored here (committed or not; at least commit_seq on a primary)."""
        ...

    def read(self, seq: int) -> LogEntry | None:
        """The message at seq, or None if removed or never committed."""
        ...

    def peek(self, seq: int) -> LogEntry | None:
        """Like read, whatever this node's role (the stored copy, for bookkeeping)."""
        ...

    def peek_stored(self, seq: int) -> LogEntry | None:
        """The message stored at seq, committed or not, whatever this node's role: None only
        when it was removed or was never stored here (for bookkeeping: whether a message a
        consumer may hold is really gone, also on a primary whose commit seq is not yet
        re-established). Never hand it to a consumer."""
        ...

    def scan(self, *, from_seq: int, filter_subject: str = "", limit: int) -> Iterator[LogEntry]:
        """Committed messages with seq >= from_seq matching the filter, in seq order, at most
        `limit` of them (the scan may also stop early after examining a bounded number)."""
        ...

    def fill_new(self, messages: Answer, *, from_seq: int, limit: int,
                 payload_room: int) -> NewRun:
        """`scan` with no filter, straight into an answer: the committed messages from
        `from_seq` on, at most `limit` (and at most as many as a scan examines), each added to
        `messages` as a first delivery (deliver_count 1) while the payloads added fit in
        `payload_room` bytes. A message always fits into an empty `messages`. The hot path of
        a fetch: it builds no LogEntry."""
        ...

    def first_seq_at_or_after_time(self, ts_ms: int) -> int:
        """First committed seq whose ts_ms >= ts_ms; commit_seq + 1 if none."""
        ...

    def last_seqs_per_subject(self, filter_subject: str) -> list[int]:
        """For every subject matching the filter, its last committed seq, ascending."""
        ...

    def count_matching(self, *, from_seq: int, filter_subject: str) -> int:
        """Number of committed messages with seq >= from_seq matching the filter."""
        ...

    async def wait_for_commit(self, *, above_seq: int, timeout_s: float) -> bool:
        """Waits until commit_seq > above_seq; False on timeout or when the stream is closed."""
        ...

    async def remove(self, seqs: list[int]) -> int:
        """Removes messages (work-queue and interest retention); durable on return. Returns the
        number removed (missing seqs are not an error)."""
        ...

    async def publish_internal(
        self, *, subject: str, payload: bytes, headers: tuple[tuple[str, str], ...]
    ) -> int:
        """Appends a message (dead-letter republish); durable on return; returns its seq."""
        ...


@dataclass
class MemoryStreamLog:
    """In-memory twin of StreamLog, for tests: every append is committed at once."""

    name: str = "test"
    entries: dict[int, LogEntry] = field(default_factory=dict)
    last_seq: int = 0
    clock_ms: int = 1_700_000_000_000
    _changed: asyncio.Event | None = None

    @property
    def first_seq(self) -> int:
        return min(self.entries, default=self.last_seq + 1)

    @property
    def commit_seq(self) -> int:
        return self.last_seq

    def append(self, subject: str, payload: bytes = b"", *, ts_ms: int | None = None) -> int:
        self.last_seq += 1
        self.entries[self.last_seq] = LogEntry(
            seq=self.last_seq,
            subject=subject,
            ts_ms=self.clock_ms if ts_ms is None else ts_ms,
            payload=payload,
        )
        if self._changed is not None:
            self._changed.set()
        return self.last_seq

    def read(self, seq: int) -> LogEntry | None:
        return self.entries.get(seq)

    def peek(self, seq: int) -> LogEntry | None:
        return self.entries.get(seq)

    def peek_stored(self, seq: int) -> LogEntry | None:
        return self.entries.get(seq)

    def scan(self, *, from_seq: int, filter_subject: str = "", limit: int) -> Iterator[LogEntry]:
        produced = 0
        for seq in sorted(s for s in self.entries if s >= from_seq):
            if produced >= limit:
                return
            entry = self.entries[seq]
            if not filter_subject or subjects.matches(filter_subject, entry.subject):
                produced += 1
                yield entry

    def fill_new(self, messages: Answer, *, from_seq: int, limit: int,
                 payload_room: int) -> NewRun:
        seqs: list[int] = []
        taken_bytes, had = 0, len(messages)
        for entry in self.scan(from_seq=from_seq, limit=limit):
            if taken_bytes + len(entry.payload) > payload_room and (had or seqs):
                return NewRun(seqs, taken_bytes, full=True)
            taken_bytes += len(entry.payload)
            fill_message(messages.add(), self.name, entry, deliver_count=1)
            seqs.append(entry.seq)
        return NewRun(seqs, taken_bytes, full=False)

    def first_seq_at_or_after_time(self, ts_ms: int) -> int:
        for seq in sorted(self.entries):
            if self.entries[seq].ts_ms >= ts_ms:
                return seq
        return self.last_seq + 1

    def last_seqs_per_subject(self, filter_subject: str) -> list[int]:
        last: dict[str, int] = {}
        for seq in sorted(self.entries):
            entry = self.entries[seq]
            if not filter_subject or subjects.matches(filter_subject, entry.subject):
                last[entry.subject] = seq
        return sorted(last.values())

    def count_matching(self, *, from_seq: int, filter_subject: str) -> int:
        return sum(1 for _ in self.scan(from_seq=from_seq, filter_subject=filter_subject,
                                        limit=len(self.entries) + 1))

    async def wait_for_commit(self, *, above_seq: int, timeout_s: float) -> bool:
        if self._changed is None:
            self._changed = asyncio.Event()
        while self.commit_seq <= above_seq:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout_s)
            except TimeoutError:
                return self.commit_seq > above_seq
        return True

    async def remove(self, seqs: list[int]) -> int:
        return sum(1 for seq in seqs if self.entries.pop(seq, None) is not None)

    async def publish_internal(
        self, *, subject: str, payload: bytes, headers: tuple[tuple[str, str], ...]
    ) -> int:
        seq = self.append(subject, payload)
        self.entries[seq] = LogEntry(seq=seq, subject=subject, ts_ms=self.clock_ms,
                                     payload=payload, headers=headers)
        return seq
