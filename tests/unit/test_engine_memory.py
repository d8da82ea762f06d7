"""The stream engine over the in-memory message store (node/engine/memory_store.py): publish,
reads, retention, purges, a reload, and a replica's batches, with no disk and no sockets."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable

from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import raft_pb2, replication_pb2, storage_pb2
from raftlog.node.engine.memory_store import MemoryMessageStore
from raftlog.node.engine.stream_publish import Appended, draft
from raftlog.node.engine.streams import NoConsumers, StreamEngine
from raftlog.v1 import streams_pb2, types_pb2


def engine_over(store: MemoryMessageStore, *, follow_raft: bool = False) -> StreamEngine:
    engine = StreamEngine(store=store, clock=FakeClock(), consumers=NoConsumers(),
                          follow_raft=follow_raft)
    engine.load()
    return engine


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 10))


def test_a_batch_publishes_as_one_write_and_reads_back() -> None:
    async def body() -> None:
        store = MemoryMessageStore()
        engine = engine_over(store)
        await engine.create(types_pb2.StreamConfig(name="s", subjects=["k.*"]))
        writes = store.writes
        results = await engine.publish("s", [draft("k.a", b"1", msg_id="m1"), draft("k.b", b"2"),
                                             draft("other", b"x"), draft("k.a", b"3")])
        assert results[:2] == [Appended(1), Appended(2)] and results[3] == Appended(3)
        assert isinstance(results[2], RaftlogError)
        assert results[2].reason is Reason.SUBJECT_NOT_IN_STREAM
        assert store.writes == writes + 1  # the whole batch, one write
        stream = engine.get("s")
        assert stream.get_message(2).payload == b"2"
        assert [e.seq for e in stream.scan(from_seq=1, filter_subject="k.a", limit=10)] == [1, 3]
        assert stream.latest_at_subject("k.a").seq == 3
        assert stream.count_matching(from_seq=2, filter_subject="") == 2
        state = engine.info("s").state
        assert (state.first_seq, state.last_seq, state.messages, state.num_subjects) == (1, 3, 3, 2)

    run(body)


def test_limits_and_purges_remove_the_oldest_messages() -> None:
    async def body() -> None:
        engine = engine_over(MemoryMessageStore())
        await engine.create(types_pb2.StreamConfig(name="s", max_msgs=3))
        await engine.publish("s", [draft(s, b"xxxxx") for s in "abcab"])
        state = engine.info("s").state
        assert (state.first_seq, state.last_seq, state.messages) == (3, 5, 3)
        assert await engine.purge(streams_pb2.PurgeStreamRequest(name="s", subject="a")) == 1
        stream = engine.get("s")
        assert [m.seq for m in stream.scan(from_seq=1, limit=10)] == [3, 5]
        assert stream.latest_at_subject("b").seq == 5
        assert await engine.purge(streams_pb2.PurgeStreamRequest(name="s")) == 2
        state = engine.info("s").state
        assert (state.first_seq, state.last_seq, state.messages, state.num_subjects) == (6, 5, 0, 0)

    run(body)


def test_a_new_engine_over_the_same_store_finds_everything() -> None:
    async def body() -> None:
        store = MemoryMessageStore()
        first = engine_over(store)
        await first.create(types_pb2.StreamConfig(name="s"))
        await first.create(types_pb2.StreamConfig(name="t"))
        await first.publish("s", [draft("a", b"1", msg_id="m1"), draft("b", b"2")])
        await first.delete("t")
        again = engine_over(store)
        assert sorted(again.streams) == ["s"]
        assert await again.publish("s", [draft("a", b"dup", msg_id="m1")]) == [
            Appended(1, duplicate=True)]
        assert await again.publish("s", [draft("a", b"3")]) == [Appended(3)]
        assert again.get("s").latest_at_subject("a").payload == b"3"
        await again.create(types_pb2.StreamConfig(name="u"))
        assert again.get("u").stream_id == 3  # ids are never reused

    run(body)


def batch(*, epoch: int, first_seq: int, payloads: list[bytes],
          history: list[tuple[int, int]]) -> replication_pb2.ReplicateRequest:
    values = [storage_pb2.StoredMessage(subject="a", payload=p, ts_ms=1,
                                        epoch=epoch).SerializeToString() for p in payloads]
    return replication_pb2.ReplicateRequest(
        stream="s", epoch=epoch, first_seq=first_seq, messages=values,
        checksum=zlib.crc32(b"".join(values)),
        history=[raft_pb2.EpochStart(fence_epoch=e, start_seq=s) for e, s in history])


def test_a_replica_takes_batches_and_a_newer_epoch_truncates_the_old_tail() -> None:
    async def body() -> None:
        engine = engine_over(MemoryMessageStore(), follow_raft=True)
        await engine.create(types_pb2.StreamConfig(name="s"))
        stream = engine.get("s")
        stream.become_replica()
        assert stream.accept_replicated(batch(epoch=1, first_seq=1, payloads=[b"a", b"b", b"c"],
                                              history=[(1, 1)])) == 3
        assert stream.accept_replicated(batch(epoch=2, first_seq=3, payloads=[b"C"],
                                              history=[(1, 1), (2, 3)])) == 3
        stream.set_commit_seq(3)
        assert [v for v in stream.stored_values(from_seq=1, to_seq=3, bytes_max=1 << 20)] == [
            storage_pb2.StoredMessage(subject="a", payload=p, ts_ms=1, epoch=e)
            .SerializeToString() for p, e in ((b"a", 1), (b"b", 1), (b"C", 2))]
        assert stream.subject_stats["a"].count == 3 and stream.record.messages == 3

    run(body)


def test_removing_a_subjects_newest_messages_together_keeps_its_latest_right() -> None:
    """Several messages of one subject removed in one batch: the subject's latest is the
    newest one that stays (the store still holds the others until the batch is written)."""
    async def body() -> None:
        store = MemoryMessageStore()
        engine = engine_over(store)
        await engine.create(types_pb2.StreamConfig(name="s"))
        await engine.publish("s", [draft(s, b"x") for s in ("a", "b", "a", "a", "b")])
        stream = engine.get("s")
        assert await stream.remove([3, 4, 5]) == 3
        assert stream.latest_at_subject("a").seq == 1
        assert stream.latest_at_subject("b").seq == 2
        reloaded = engine_over(store).get("s")  # the counters written to the store agree
        assert reloaded.latest_at_subject("a").seq == 1
        assert {k: (v.count, v.last_seq) for k, v in reloaded.subject_stats.items()} == {
            "a": (1, 1), "b": (1, 2)}

    run(body)
