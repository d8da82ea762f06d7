"""One KV watch: the start (the live values of the matching keys, or their whole stored history,
or nothing), a `caught_up` event, then every later revision as it commits, and an EXPIRED event
when a value it sent reaches its TTL while it is still the key's latest.

It reads through the bucket's stream operations only (ReadMessages from the revision it reached,
filtered to the watched keys, waiting on the stream's primary for the next commit; no
consumer), so it works wherever the stream's primary is and carries on across a failover:
revisions are seqs, and the tail resumes at the next one. A read waits at most
limits.kv_watch_wait_ms (less when an expiry comes due sooner), returns at most
kv_watch_batch_max revisions, and the watch sends each event before it reads on (gRPC's flow
control holds it while the client does not read), so a slow client costs the node one batch.
A bucket UNAVAILABLE (failover) is retried for limits.kv_watch_retry_s_max.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from raftlog.base import limits
from raftlog.base.clock import Clock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import kv_entries as kv
from raftlog.node.transport.calls import Call
from raftlog.v1 import kv_pb2, types_pb2

T = TypeVar("T")


class BucketReads(Protocol):
    """What a watch reads of a bucket (KVOps in kv.py)."""

    async def revision_range(self, bucket: str, via: Call) -> tuple[int, int]:
        """(first stored revision, highest committed revision)."""
        ...

    async def latest_revisions(self, bucket: str, pattern: str, via: Call, *, limit: int
                               ) -> tuple[list[tuple[str, int]], bool]: ...

    async def latest_message(self, bucket: str, key: str, via: Call
                             ) -> types_pb2.Message | None: ...

    async def messages(self, bucket: str, revisions: Sequence[int], via: Call
                       ) -> list[types_pb2.Message]: ...

    async def read_revisions(self, bucket: str, pattern: str, via: Call, *,
                             from_revision: int, limit: int, wait_ms: int
                             ) -> tuple[list[types_pb2.Message], int]:
        """The committed revisions of keys matching `pattern` from `from_revision` (at most
        `limit`, waiting up to `wait_ms` for one when none is committed yet), and the revision
        to read next (every one below it was looked at)."""
        ...


def _event(entry: kv_pb2.KvEntry) -> kv_pb2.KvWatchEvent:
    return kv_pb2.KvWatchEvent(entry=entry)


def _caught_up(revision: int) -> kv_pb2.KvWatchEvent:
    return kv_pb2.KvWatchEvent(caught_up=kv_pb2.KvWatchCaughtUp(revision=revision))


class Expiries:
    """The values sent that have a TTL, while each is its key's latest: which are due."""

    def __init__(self) -> None:
        self._latest: dict[str, kv_pb2.KvEntry] = {}  # key -> its latest entry with a TTL
        self._due: list[tuple[int, int, str]] = []  # (expires_ms, revision, key), a heap

    def sent(self, entry: kv_pb2.KvEntry) -> None:
        """Any entry sent for a key replaces what was tracked for it."""
        self._latest.pop(entry.key, None)
        if entry.operation == kv_pb2.KV_OPERATION_PUT and entry.expires_ms:
            self._latest[entry.key] = entry
            heapq.heappush(self._due, (entry.expires_ms, entry.revision, entry.key))
            if len(self._due) > 2 * len(self._latest) + 64:  # drop replaced ones
                self._due = [(e.expires_ms, e.revision, k) for k, e in self._latest.items()]
                heapq.heapify(self._due)

    def due(self, now_ms: int) -> list[kv_pb2.KvEntry]:
        """The values whose TTL passed by `now_ms` (each reported once)."""
        found = []
        while self._due and self._due[0][0] <= now_ms:
            _, revision, key = heapq.heappop(self._due)
            entry = self._latest.get(key)
            if entry is not None and entry.revision == revision:
                del self._latest[key]
                found.append(entry)
        return found

    def next_ms(self) -> int | None:
        return self._due[0][0] if self._due else None


class Watch:
    def __init__(self, reads: BucketReads, request: kv_pb2.KvWatchRequest, via: Call, *,
                 clock: Clock) -> None:
        self._reads = reads
        self._request = request
        self._via = via
        self._clock = clock
        self._bucket = request.bucket
        self._pattern = request.key
        self._sent: dict[str, int] = {}  # key -> the latest revision sent
        self._expiries = Expiries()

    async def events(self) -> AsyncIterator[kv_pb2.KvWatchEvent]:
        first, start = await self._retrying(
            lambda: self._reads.revision_range(self._bucket, self._via))
        if self._request.include_history:
            async for event in self._tail(first, caught_up_at=start):
                yield event
            return
        if not self._request.updates_only:
            for entry in await self._live_values():
                yield self._send(entry)
        yield _caught_up(start)
        async for event in self._tail(start + 1, caught_up_at=None):
            yield event

    def _send(self, entry: kv_pb2.KvEntry) -> kv_pb2.KvWatchEvent:
        self._sent[entry.key] = entry.revision
        self._expiries.sent(entry)
        return _event(entry)

    async def _live_values(self) -> list[kv_pb2.KvEntry]:
        """The live value of each matching key, in revision order (TOO_MANY_KEYS beyond
        limits.list_subjects_limit_max keys)."""
        now_ms = self._clock.wall_ms()
        if kv.is_literal(self._pattern):
            latest = await self._retrying(
                lambda: self._reads.latest_message(self._bucket, self._pattern, self._via))
            found = [] if latest is None else [latest]
        else:
            listed, truncated = await self._retrying(lambda: self._reads.latest_revisions(
                self._bucket, self._pattern, self._via, limit=limits.list_subjects_limit_max))
            if truncated:
                raise RaftlogError(Reason.TOO_MANY_KEYS, "more than "
                                   f"{limits.list_subjects_limit_max} keys match; watch a "
                                   "narrower pattern, or with updates_only",
                                   bucket=self._bucket, limit=limits.list_subjects_limit_max)
            revisions = [revision for _, revision in listed]
            found = await self._retrying(
                lambda: self._reads.messages(self._bucket, revisions, self._via))
        live = [m for m in found if kv.read_headers(m).live(now_ms)]
        return [kv.to_entry(self._bucket, m) for m in sorted(live, key=lambda m: m.seq)]

    async def _tail(self, from_revision: int, *, caught_up_at: int | None
                    ) -> AsyncIterator[kv_pb2.KvWatchEvent]:
        """Every matching revision from `from_revision` as it commits, the expiries that come
        due meanwhile, and (when `caught_up_at` is given) the caught_up event once every
        revision up to it was sent."""
        next_revision = from_revision
        while True:
            if caught_up_at is not None and next_revision > caught_up_at:
                yield _caught_up(caught_up_at)  # before a read that may wait
                caught_up_at = None
            messages, next_revision = await self._retrying(functools.partial(
                self._reads.read_revisions, self._bucket, self._pattern, self._via,
                from_revision=next_revision, limit=limits.kv_watch_batch_max,
                wait_ms=self._wait_ms()))
            for message in messages:
                if caught_up_at is not None and message.seq > caught_up_at:
                    yield _caught_up(caught_up_at)
                    caught_up_at = None
                entry = kv.to_entry(self._bucket, message)
                if entry.revision > self._sent.get(entry.key, 0):
                    yield self._send(entry)
            for entry in self._expiries.due(self._clock.wall_ms()):
                yield _event(kv.expired_event(entry))

    def _wait_ms(self) -> int:
        """How long a read may wait for a commit: limits.kv_watch_wait_ms, or until the next
        expiry if that comes first."""
        wait_ms = limits.kv_watch_wait_ms
        next_ms = self._expiries.next_ms()
        if next_ms is not None:
            wait_ms = max(min(wait_ms, next_ms - self._clock.wall_ms()), 0)
        return wait_ms

    async def _retrying(self, read: Callable[[], Awaitable[T]]) -> T:
        """`read`, again after an UNAVAILABLE answer (a failover), for up to
        limits.kv_watch_retry_s_max."""
        deadline_s = self._clock.monotonic_s() + limits.kv_watch_retry_s_max
        pause_ms = limits.kv_watch_retry_pause_ms_min
        while True:
            try:
                return await read()
            except RaftlogError as err:
                if err.status_name != "UNAVAILABLE" or self._clock.monotonic_s() >= deadline_s:
                    raise
            await asyncio.sleep(pause_ms / 1000)
            pause_ms = min(2 * pause_ms, limits.kv_watch_retry_pause_ms_max)
