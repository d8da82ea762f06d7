"""Replica-side rules (issue 4 item 7): batches with wrong epochs, gaps, duplicates or bad
checksums are refused with a reason and change nothing stored; newer epochs truncate an old
uncommitted tail; a re-seed replaces the copy. In-process, real RocksDB, no sockets."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from raftlog.internal import raft_pb2, replication_pb2
from raftlog.node.engine.stream import Stream
from tests.engine.replica_harness import Replica, stored

T = TypeVar("T")


def run(path: Path, body: Callable[[Replica, Stream], Awaitable[T]]) -> T:
    async def main() -> T:
        replica = Replica(path)
        stream = await replica.open()
        try:
            return await body(replica, stream)
        finally:
            replica.close()

    return asyncio.run(main())


def test_accepts_the_next_seq_at_the_current_epoch_and_acks_durably(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        ack = await r.send(epoch=1, first_seq=1, payloads=[b"a", b"b"], commit_seq=1)
        assert (ack.refused, ack.last_seq, ack.request_id, ack.epoch) == ("", 2, 7, 1)
        assert stream.durable_seq == 2 and stream.commit_seq == 1
        assert r.payloads(stream) == {1: b"a", 2: b"b"}

    run(tmp_path, body)


def test_a_gap_is_refused_with_the_replicas_position(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await r.send(epoch=1, first_seq=1, payloads=[b"a"])
        ack = await r.send(epoch=1, first_seq=5, payloads=[b"e"])
        assert (ack.refused, ack.last_seq) == ("SEQ_GAP", 1)
        assert r.payloads(stream) == {1: b"a"}

    run(tmp_path, body)


def test_duplicates_are_skipped_not_stored_twice(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await r.send(epoch=1, first_seq=1, payloads=[b"a", b"b"])
        ack = await r.send(epoch=1, first_seq=2, payloads=[b"b", b"c"])
        assert (ack.refused, ack.last_seq) == ("", 3)
        assert r.payloads(stream) == {1: b"a", 2: b"b", 3: b"c"}
        assert stream.record.messages == 3

    run(tmp_path, body)


def test_an_older_epoch_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await r.send(epoch=2, first_seq=1, payloads=[b"a"], history=[(1, 1), (2, 1)])
        ack = await r.send(epoch=1, first_seq=2, payloads=[b"old"])
        assert (ack.refused, ack.replica_epoch, ack.last_seq) == ("STALE_EPOCH", 2, 1)
        assert r.payloads(stream) == {1: b"a"}

    run(tmp_path, body)


def test_a_bad_checksum_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        ack = await r.send(epoch=1, first_seq=1, payloads=[b"a"], checksum=12345)
        assert ack.refused == "CORRUPT_RECORD"
        assert r.payloads(stream) == {} and stream.last_seq == 0

    run(tmp_path, body)


def test_a_newer_epoch_truncates_the_old_uncommitted_tail(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await r.send(epoch=1, first_seq=1, payloads=[b"a", b"b", b"x3", b"x4"])
        # Epoch 2 started at seq 3: seqs 3-4 of epoch 1 were never committed.
        ack = await r.send(epoch=2, first_seq=3, payloads=[b"c"], history=[(1, 1), (2, 3)])
        assert (ack.refused, ack.last_seq) == ("", 3)
        assert r.payloads(stream) == {1: b"a", 2: b"b", 3: b"c"}
        assert stream.record.messages == 3 and stream.record.epoch == 2

    run(tmp_path, body)


def test_truncation_starts_at_the_first_epoch_after_the_replicas_last(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await r.send(epoch=1, first_seq=1, payloads=[b"a", b"stale2", b"stale3"])
        # This replica missed epoch 2 (started at 2) entirely; epoch 3 started at 4.
        ack = await r.send(epoch=3, first_seq=2, payloads=[b"b", b"c", b"d"], msg_epoch=2,
                           history=[(1, 1), (2, 2), (3, 4)])
        assert (ack.refused, ack.last_seq) == ("", 4)
        assert r.payloads(stream) == {1: b"a", 2: b"b", 3: b"c", 4: b"d"}

    run(tmp_path, body)


def test_a_fence_refuses_the_old_epoch_before_the_new_one_exists(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await r.send(epoch=1, first_seq=1, payloads=[b"a"])
        await stream.fence(2)
        ack = await r.send(epoch=1, first_seq=2, payloads=[b"late"])
        assert (ack.refused, ack.last_seq) == ("STALE_EPOCH", 1)
        ack = await r.send(epoch=2, first_seq=2, payloads=[b"b"], history=[(1, 1), (2, 2)])
        assert (ack.refused, ack.last_seq) == ("", 2)

    run(tmp_path, body)


def test_reseed_replaces_the_copy_and_removals_follow_the_primary(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await r.send(epoch=1, first_seq=1, payloads=[b"a", b"b", b"c"])
        ack = await r.send(epoch=1, first_seq=2, payloads=[], removed=[(2, 2)])
        assert r.payloads(stream) == {1: b"a", 3: b"c"} and ack.last_seq == 3
        ack = await r.send(epoch=1, first_seq=10, payloads=[b"j"], reseed=True)
        assert (ack.refused, ack.last_seq) == ("", 10)
        assert r.payloads(stream) == {10: b"j"} and stream.first_seq == 10

    run(tmp_path, body)


def test_removed_seqs_arrive_as_empty_values_and_still_advance(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        values = [stored(b"a", epoch=1), b"", stored(b"c", epoch=1)]
        request = replication_pb2.ReplicateRequest(
            stream="s", epoch=1, first_seq=1, messages=values,
            checksum=zlib.crc32(b"".join(values)),
            history=[raft_pb2.EpochStart(fence_epoch=1, start_seq=1)])
        ack = await r.service.apply(request)
        assert (ack.refused, ack.last_seq) == ("", 3)
        assert r.payloads(stream) == {1: b"a", 3: b"c"}

    run(tmp_path, body)
