"""Stream engine rules, in-process (no gRPC), each over both message stores: a real RocksDB in
tmp_path and the in-memory twin (node/engine/memory_store.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.memory_store import MemoryMessageStore
from raftlog.node.engine.rocks_store import RocksMessageStore
from raftlog.node.engine.storage import GroupCommitter, Storage
from raftlog.node.engine.store import MessageStore
from raftlog.node.engine.stream_publish import Appended, Draft, draft
from raftlog.node.engine.streams import NoConsumers, StreamEngine
from raftlog.v1 import streams_pb2, types_pb2

T = TypeVar("T")


@dataclass(frozen=True)
class Place:
    """Where a harness keeps its streams: RocksDB under `path`, or `memory`, one in-memory
    store that outlives each harness (so that a second harness reopens what the first wrote)."""

    path: Path
    memory: MemoryMessageStore | None = None


@pytest.fixture(params=["rocks", "memory"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    return Place(tmp_path, MemoryMessageStore() if request.param == "memory" else None)


class Harness:
    def __init__(self, place: Place) -> None:
        self.clock = FakeClock()
        self.storage: Storage | None = None
        self.committer: GroupCommitter | None = None
        store: MessageStore
        if place.memory is not None:
            store = place.memory
        else:
            self.storage = Storage(place.path)
            self.committer = GroupCommitter(self.storage)
            store = RocksMessageStore(self.storage, self.committer)
        self.engine = StreamEngine(store=store, clock=self.clock, consumers=NoConsumers())

    async def open(self) -> None:
        if self.committer is not None:
            self.committer.start(asyncio.get_running_loop())
        self.engine.load()

    def close(self) -> None:
        if self.committer is not None and self.storage is not None:
            self.committer.stop()
            self.storage.close()


def run(place: Place, body: Callable[[Harness], Awaitable[T]]) -> T:
    async def main() -> T:
        harness = Harness(place)
        await harness.open()
        try:
            return await body(harness)
        finally:
            harness.close()

    return asyncio.run(main())


def seqs(results: list[Appended | RaftlogError]) -> list[int]:
    return [r.seq if isinstance(r, Appended) else -1 for r in results]


async def create(h: Harness, name: str = "s", **fields: object) -> None:
    await h.engine.create(types_pb2.StreamConfig(name=name, **fields))  # type: ignore[arg-type]


def drafts(*subjects: str) -> list[Draft]:
    return [draft(s, f"p{i}".encode()) for i, s in enumerate(subjects)]


def test_seqs_are_assigned_one_to_n_without_gaps(place: Place) -> None:
    async def body(h: Harness) -> None:
        await create(h)
        assert seqs(await h.engine.publish("s", drafts("a", "b", "c"))) == [1, 2, 3]
        assert seqs(await h.engine.publish("s", drafts("a"))) == [4]
        state = h.engine.info("s").state
        assert (state.first_seq, state.last_seq, state.messages, state.commit_seq) == (1, 4, 4, 4)
        assert state.num_subjects == 3

    run(place, body)


def test_everything_survives_reopen(place: Place) -> None:
    async def write(h: Harness) -> None:
        await create(h, subjects=["x.>"], max_msgs_per_subject=2)
        await h.engine.publish("s", [draft("x.a", b"1", msg_id="m1"),
                                     draft("x.b", b"2"),
                                     draft("x.a", b"3")])

    async def read(h: Harness) -> None:
        stream = h.engine.get("s")
        assert stream.get_message(3).payload == b"3"
        assert stream.latest_at_subject("x.a").seq == 3
        assert h.engine.info("s").state.messages == 3
        (dup,) = await h.engine.publish("s", [draft("x.a", b"again",
                                                    msg_id="m1")])
        assert dup == Appended(1, duplicate=True)
        assert seqs(await h.engine.publish("s", drafts("x.c"))) == [4]

    run(place, write)
    run(place, read)


@pytest.mark.parametrize(
    ("fields", "published", "expected_first", "expected_messages"),
    [
        ({"max_msgs": 3}, ["a"] * 5, 3, 3),
        ({"max_bytes": 12}, ["a"] * 5, 4, 2),  # 6 bytes a message ("a" + 5 payload bytes)
        ({"max_msgs_per_subject": 1}, ["a", "b", "a", "b", "a"], 4, 2),
    ],
)
def test_limits_remove_the_oldest_messages_on_write(
    place: Place, fields: dict[str, int], published: list[str], expected_first: int,
    expected_messages: int,
) -> None:
    async def body(h: Harness) -> None:
        await create(h, **fields)
        for subject in published:
            await h.engine.publish("s", [draft(subject, b"xxxxx")])
        state = h.engine.info("s").state
        assert state.last_seq == len(published)
        assert state.messages == expected_messages
        assert state.first_seq == expected_first

    run(place, body)


def test_lowering_a_limit_prunes_at_once(place: Place) -> None:
    async def body(h: Harness) -> None:
        await create(h)
        await h.engine.publish("s", drafts(*["a"] * 10))
        info, pruned = await h.engine.update(streams_pb2.UpdateStreamRequest(name="s", max_msgs=4))
        assert pruned == 6
        assert (info.state.first_seq, info.state.messages) == (7, 4)

    run(place, body)


def test_max_age_sweep_removes_old_messages(place: Place) -> None:
    async def body(h: Harness) -> None:
        await create(h, max_age_ms=10_000)
        await h.engine.publish("s", drafts("a", "b"))
        h.clock.advance(5)
        await h.engine.publish("s", drafts("c"))
        h.clock.advance(6)
        assert await h.engine.sweep_once() == 2
        assert h.engine.info("s").state.first_seq == 3

    run(place, body)


def test_expected_last_seq_mismatch_reports_current_value(place: Place) -> None:
    async def body(h: Harness) -> None:
        await create(h)
        await h.engine.publish("s", drafts("a", "b"))
        (err,) = await h.engine.publish("s", [draft("a", b"", expected_last_seq=1)])
        assert isinstance(err, RaftlogError) and err.reason is Reason.WRONG_LAST_SEQ
        assert err.metadata == {"last_seq": "2"}
        (err,) = await h.engine.publish(
            "s", [draft("a", b"", expected_last_subject_seq=0)])
        assert isinstance(err, RaftlogError) and err.reason is Reason.WRONG_LAST_SUBJECT_SEQ
        assert err.metadata == {"last_subject_seq": "1"}
        (ok,) = await h.engine.publish(
            "s", [draft("a", b"", expected_last_seq=2,
                        expected_last_subject_seq=1)])
        assert ok == Appended(3)

    run(place, body)


def test_dedupe_window_expires(place: Place) -> None:
    async def body(h: Harness) -> None:
        await create(h, dedupe_window_ms=1_000)
        first = await h.engine.publish("s", [draft("a", b"", msg_id="id")])
        again = await h.engine.publish("s", [draft("a", b"", msg_id="id")])
        assert first == [Appended(1)] and again == [Appended(1, duplicate=True)]
        h.clock.advance(2)
        assert await h.engine.publish("s", [draft("a", b"", msg_id="id")]) == [
            Appended(2)]

    run(place, body)


def test_purge_variants(place: Place) -> None:
    async def body(h: Harness) -> None:
        await create(h)
        await h.engine.publish("s", drafts("a.1", "b.1", "a.2", "b.2", "a.3", "c"))
        purge = h.engine.purge
        assert await purge(streams_pb2.PurgeStreamRequest(name="s", subject="a.*", keep=1)) == 2
        assert await purge(streams_pb2.PurgeStreamRequest(name="s", below_seq=3)) == 1
        state = h.engine.info("s").state
        assert (state.first_seq, state.messages) == (4, 3)
        assert await purge(streams_pb2.PurgeStreamRequest(name="s")) == 3
        state = h.engine.info("s").state
        assert (state.first_seq, state.last_seq, state.messages, state.num_subjects) == (7, 6, 0, 0)
        assert seqs(await h.engine.publish("s", drafts("a"))) == [7]

    run(place, body)


def test_subject_reads(place: Place) -> None:
    async def body(h: Harness) -> None:
        await create(h)
        await h.engine.publish("s", drafts("k.a", "k.b", "k.a", "z", "k.a"))
        stream = h.engine.get("s")
        assert stream.latest_at_subject("k.a").seq == 5
        found, truncated = stream.subjects_with_prefix("k.", limit=10)
        assert [(f.subject, f.messages, f.last_seq) for f in found] == [("k.a", 3, 5),
                                                                         ("k.b", 1, 2)]
        assert not truncated
        messages, next_seq = stream.scan_subject("k.a", from_seq=2, limit=1)
        assert [m.seq for m in messages] == [3] and next_seq == 5
        with pytest.raises(RaftlogError) as err:
            stream.latest_at_subject("nope")
        assert err.value.reason is Reason.MESSAGE_NOT_FOUND

    run(place, body)


def test_deleted_stream_leaves_nothing_and_name_can_be_reused(place: Place) -> None:
    async def body(h: Harness) -> None:
        await create(h)
        await h.engine.publish("s", drafts("a", "b"))
        await h.engine.delete("s")
        with pytest.raises(RaftlogError) as err:
            h.engine.info("s")
        assert err.value.reason is Reason.STREAM_NOT_FOUND
        await create(h)
        assert h.engine.info("s").state.messages == 0
        assert seqs(await h.engine.publish("s", drafts("a"))) == [1]

    run(place, body)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"name": ""}, Reason.INVALID_NAME),
        ({"name": "../etc"}, Reason.INVALID_NAME),
        ({"name": "x" * 129}, Reason.INVALID_NAME),
        ({"name": "s", "subjects": ["a..b"]}, Reason.INVALID_SUBJECT),
        ({"name": "s", "subjects": ["a.>.b"]}, Reason.INVALID_SUBJECT),
        ({"name": "s", "subjects": ["a", "a"]}, Reason.INVALID_CONFIG),
        ({"name": "s", "max_bytes": 10, "max_msg_bytes": 11}, Reason.INVALID_CONFIG),
        ({"name": "s", "max_age_ms": 1000, "dedupe_window_ms": 2000}, Reason.INVALID_CONFIG),
        ({"name": "s", "max_msgs": 1, "max_msgs_per_subject": 2}, Reason.INVALID_CONFIG),
        ({"name": "s", "replicas": 9}, Reason.INVALID_CONFIG),
        ({"name": "s", "max_msg_bytes": 1 << 40}, Reason.INVALID_CONFIG),
    ],
)
def test_invalid_configs_are_rejected(place: Place, fields: dict[str, object],
                                      reason: Reason) -> None:
    async def body(h: Harness) -> None:
        with pytest.raises(RaftlogError) as err:
            await h.engine.create(types_pb2.StreamConfig(**fields))  # type: ignore[arg-type]
        assert err.value.reason is reason
        assert h.engine.infos() == []

    run(place, body)


def test_create_is_idempotent_but_a_different_config_conflicts(place: Place) -> None:
    async def body(h: Harness) -> None:
        await create(h, max_msgs=5)
        await create(h, max_msgs=5)
        with pytest.raises(RaftlogError) as err:
            await create(h, max_msgs=6)
        assert err.value.reason is Reason.STREAM_EXISTS

    run(place, body)


@pytest.mark.parametrize(
    ("draft", "reason"),
    [
        (draft("", b""), Reason.INVALID_SUBJECT),
        (draft("a.*", b""), Reason.INVALID_SUBJECT),
        (draft("a b", b""), Reason.INVALID_SUBJECT),
        (draft("other", b""), Reason.SUBJECT_NOT_IN_STREAM),
        (draft("in.x", b"x" * 101), Reason.MESSAGE_TOO_LARGE),
        (draft("in.x", b"", headers=(("", "v"),)), Reason.INVALID_ARGUMENT),
    ],
)
def test_bad_messages_are_refused_and_nothing_is_stored(place: Place, draft: Draft,
                                                        reason: Reason) -> None:
    async def body(h: Harness) -> None:
        await create(h, subjects=["in.>"], max_msg_bytes=100)
        await h.engine.publish("s", drafts("in.ok"))
        (err,) = await h.engine.publish("s", [draft])
        assert isinstance(err, RaftlogError) and err.reason is reason
        state = h.engine.info("s").state
        assert (state.last_seq, state.messages) == (1, 1)

    run(place, body)
