"""The KV watch loop (node/ops/kv_watch.py) over an in-memory bucket: what it sends first (live
values, the whole history, or nothing), that it follows one key or a pattern as revisions come,
skips what retention removed before it read it, reports an expiry once, and ends with the
bucket's NOT_FOUND. No sockets, no disk; the clock is a FakeClock."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from raftlog.base import subjects
from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.ops import kv_entries as kv
from raftlog.node.ops.kv_watch import Watch
from raftlog.node.transport.calls import Call
from raftlog.v1 import kv_pb2, types_pb2

BUCKET = "b"
event_timeout_s = 5.0


class MemoryBucket:
    """A bucket's stream as a dict of seq -> message (BucketReads)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.stored: dict[int, types_pb2.Message] = {}
        self.last_seq = 0
        self.deleted = False
        self.appended = asyncio.Event()

    def put(self, key: str, value: bytes = b"v", *, ttl_ms: int = 0) -> int:
        expires = kv.expires_ms(ttl=ttl_ms, now_ms=self.clock.wall_ms())
        return self._append(key, value, kv.value_headers(expires=expires))

    def delete(self, key: str) -> int:
        return self._append(key, b"", kv.marker_headers(kv_pb2.KV_OPERATION_DELETE))

    def _append(self, key: str, value: bytes, headers: Sequence[types_pb2.Header]) -> int:
        self.last_seq += 1
        self.stored[self.last_seq] = types_pb2.Message(
            seq=self.last_seq, subject=kv.key_subject(BUCKET, key), payload=value,
            headers=headers, ts_ms=self.clock.wall_ms())
        self.appended.set()
        return self.last_seq

    def _check(self) -> None:
        if self.deleted:
            raise RaftlogError(Reason.BUCKET_NOT_FOUND, "gone", bucket=BUCKET)

    async def revision_range(self, bucket: str, via: Call) -> tuple[int, int]:
        self._check()
        return min(self.stored, default=self.last_seq + 1), self.last_seq

    async def latest_revisions(self, bucket: str, pattern: str, via: Call, *, limit: int
                               ) -> tuple[list[tuple[str, int]], bool]:
        self._check()
        latest: dict[str, int] = {}
        wanted = kv.filter_subject(bucket, pattern)
        for seq, message in sorted(self.stored.items()):
            if subjects.matches(wanted, message.subject):
                latest[message.subject[len(kv.subject_prefix(bucket)):]] = seq
        return sorted(latest.items())[:limit], len(latest) > limit

    async def latest_message(self, bucket: str, key: str, via: Call
                             ) -> types_pb2.Message | None:
        self._check()
        found = [m for m in self.stored.values() if m.subject == kv.key_subject(bucket, key)]
        return max(found, key=lambda m: m.seq) if found else None

    async def messages(self, bucket: str, revisions: Sequence[int], via: Call
                       ) -> list[types_pb2.Message]:
        self._check()
        return [self.stored[seq] for seq in revisions if seq in self.stored]

    async def read_revisions(self, bucket: str, pattern: str, via: Call, *,
                             from_revision: int, limit: int, wait_ms: int
                             ) -> tuple[list[types_pb2.Message], int]:
        self._check()
        if from_revision > self.last_seq and wait_ms:
            self.appended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.appended.wait(), wait_ms / 1000)
            self._check()
        wanted = kv.filter_subject(bucket, pattern)
        found = []
        for seq in range(max(from_revision, 1), self.last_seq + 1):
            message = self.stored.get(seq)
            if message is None or not subjects.matches(wanted, message.subject):
                continue
            if len(found) == limit:
                return found, seq
            found.append(message)
        return found, max(from_revision, self.last_seq + 1)


def _watch(bucket: MemoryBucket, **fields: object) -> AsyncIterator[kv_pb2.KvWatchEvent]:
    request = kv_pb2.KvWatchRequest(bucket=BUCKET, **fields)  # type: ignore[arg-type]
    return Watch(bucket, request, Call(), clock=bucket.clock).events()


def _seen(event: kv_pb2.KvWatchEvent) -> tuple[str, int, int] | tuple[str, int]:
    if event.HasField("caught_up"):
        return ("caught_up", event.caught_up.revision)
    return (event.entry.key, event.entry.revision, event.entry.operation)


async def _take(events: AsyncIterator[kv_pb2.KvWatchEvent], count: int
                ) -> list[tuple[str, int, int] | tuple[str, int]]:
    return [_seen(await asyncio.wait_for(anext(events), event_timeout_s)) for _ in range(count)]


PUT, DEL, EXPIRED = kv_pb2.KV_OPERATION_PUT, kv_pb2.KV_OPERATION_DELETE, \
    kv_pb2.KV_OPERATION_EXPIRED


def test_it_starts_with_the_live_values_then_follows_new_revisions() -> None:
    async def scenario() -> None:
        bucket = MemoryBucket(FakeClock())
        bucket.put("a")
        bucket.put("b")
        bucket.delete("b")  # deleted keys are not among the live values
        bucket.put("c.x")
        events = _watch(bucket)
        assert await _take(events, 3) == [("a", 1, PUT), ("c.x", 4, PUT), ("caught_up", 4)]
        bucket.put("a")
        bucket.delete("c.x")
        assert await _take(events, 2) == [("a", 5, PUT), ("c.x", 6, DEL)]
        await events.aclose()

    asyncio.run(scenario())


def test_one_key_and_patterns_see_only_their_keys() -> None:
    async def scenario() -> None:
        bucket = MemoryBucket(FakeClock())
        one, pattern = _watch(bucket, key="a.1"), _watch(bucket, key="a.*")
        assert await _take(one, 1) == [("caught_up", 0)]
        assert await _take(pattern, 1) == [("caught_up", 0)]
        for key in ("b.1", "a.1", "a.2", "a.1.deep"):
            bucket.put(key)
        assert await _take(one, 1) == [("a.1", 2, PUT)]
        assert await _take(pattern, 2) == [("a.1", 2, PUT), ("a.2", 3, PUT)]
        bucket.put("a.1")
        assert await _take(one, 1) == [("a.1", 5, PUT)]
        assert await _take(pattern, 1) == [("a.1", 5, PUT)]
        await one.aclose()
        await pattern.aclose()

    asyncio.run(scenario())


def test_history_and_updates_only() -> None:
    async def scenario() -> None:
        bucket = MemoryBucket(FakeClock())
        bucket.put("a")
        bucket.put("a")
        bucket.delete("a")
        history = _watch(bucket, include_history=True)
        assert await _take(history, 4) == [("a", 1, PUT), ("a", 2, PUT), ("a", 3, DEL),
                                           ("caught_up", 3)]
        updates = _watch(bucket, updates_only=True)
        assert await _take(updates, 1) == [("caught_up", 3)]
        bucket.put("z")
        assert await _take(updates, 1) == [("z", 4, PUT)]
        assert await _take(history, 1) == [("z", 4, PUT)]
        await history.aclose()
        await updates.aclose()

    asyncio.run(scenario())


def test_caught_up_comes_before_any_wait() -> None:
    async def scenario() -> None:
        bucket = MemoryBucket(FakeClock())
        for fields in ({}, {"include_history": True}, {"updates_only": True}):
            events = _watch(bucket, **fields)
            # Well within kv_watch_wait_ms: no read waited for a commit first.
            assert _seen(await asyncio.wait_for(anext(events), 0.5)) == ("caught_up", 0)
            await events.aclose()

    asyncio.run(scenario())


def test_a_revision_removed_before_it_was_read_is_skipped() -> None:
    async def scenario() -> None:
        bucket = MemoryBucket(FakeClock())
        events = _watch(bucket)
        assert await _take(events, 1) == [("caught_up", 0)]
        first = bucket.put("a")
        bucket.put("a")
        del bucket.stored[first]  # the history limit replaced it before the watch read it
        assert await _take(events, 1) == [("a", 2, PUT)]
        await events.aclose()

    asyncio.run(scenario())


def test_an_expiry_is_reported_once_unless_the_key_changed() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        bucket = MemoryBucket(clock)
        bucket.put("short", ttl_ms=1_000)
        bucket.put("renewed", ttl_ms=1_000)
        events = _watch(bucket)
        assert await _take(events, 3) == [("short", 1, PUT), ("renewed", 2, PUT),
                                          ("caught_up", 2)]
        bucket.put("renewed", ttl_ms=60_000)
        assert await _take(events, 1) == [("renewed", 3, PUT)]
        clock.advance(1.0)
        assert await _take(events, 1) == [("short", 1, EXPIRED)]
        bucket.put("later")
        assert await _take(events, 1) == [("later", 4, PUT)]  # no second EXPIRED of short
        await events.aclose()

    asyncio.run(scenario())


def test_a_deleted_bucket_ends_the_watch_with_its_error() -> None:
    async def scenario() -> None:
        bucket = MemoryBucket(FakeClock())
        events = _watch(bucket)
        assert await _take(events, 1) == [("caught_up", 0)]
        bucket.deleted = True
        bucket.appended.set()
        try:
            await asyncio.wait_for(anext(events), event_timeout_s)
        except RaftlogError as err:
            assert err.reason is Reason.BUCKET_NOT_FOUND
        else:
            raise AssertionError("the watch went on after its bucket was deleted")

    asyncio.run(scenario())
