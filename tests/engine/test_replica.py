"""Replica-side rules (issue 4 item 7): batches with wrong epochs, gaps, duplicates or bad
checksums are refused with a reason and change nothing stored; newer epochs truncate an old
uncommitted tail; a re-seed replaces the copy. In-process, real RocksDB, no sockets."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
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


def heartbeat(*, epoch: int, commit_seq: int) -> replication_pb2.ReplicateRequest:
    """A link heartbeat carrying one commit notice for stream "s"."""
    return replication_pb2.ReplicateRequest(
        primary="p", request_id=8,
        commits=[replication_pb2.StreamCommit(stream="s", epoch=epoch, commit_seq=commit_seq)])


def batch(*, epoch: int, first_seq: int, payloads: list[bytes],
          commit_seq: int) -> replication_pb2.ReplicateRequest:
    values = [stored(p, epoch=epoch) for p in payloads]
    return replication_pb2.ReplicateRequest(
        stream="s", epoch=epoch, first_seq=first_seq, messages=values,
        checksum=zlib.crc32(b"".join(values)), commit_seq=commit_seq, primary="p",
        history=[raft_pb2.EpochStart(fence_epoch=1, start_seq=1)], request_id=7)


def test_a_commit_notice_grouped_with_the_batch_it_covers_applies_after_its_fsync(
        tmp_path: Path) -> None:
    """The batch (sent before seq 3 was committed) and the heartbeat that tells commit seq 3
    share one fsync: the notice is applied once the batch is durable, not capped below it
    and lost (the primary tells a commit seq once; an idle stream would lag for good)."""
    async def body(r: Replica, stream: Stream) -> None:
        async def requests() -> AsyncIterator[replication_pb2.ReplicateRequest]:
            yield batch(epoch=1, first_seq=1, payloads=[b"a", b"b", b"c"], commit_seq=0)
            yield heartbeat(epoch=1, commit_seq=3)

        acks = [ack async for ack in r.service.replicate(requests())]
        assert [(ack.stream, ack.last_seq, ack.refused) for ack in acks] == [
            ("s", 3, ""), ("", 0, "")]
        assert stream.durable_seq == 3
        assert stream.commit_seq == 3

    run(tmp_path, body)


def test_a_commit_notice_above_what_is_durable_applies_once_the_batches_arrive(
        tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await r.service.apply(batch(epoch=1, first_seq=1, payloads=[b"a"], commit_seq=0))
        await r.service.apply(heartbeat(epoch=1, commit_seq=3))
        assert stream.commit_seq == 1  # never above what is durable here
        await r.service.apply(batch(epoch=1, first_seq=2, payloads=[b"b", b"c"],
                                    commit_seq=1))
        assert stream.commit_seq == 3

    run(tmp_path, body)


def test_a_commit_notice_of_another_epoch_is_dropped(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await r.service.apply(batch(epoch=1, first_seq=1, payloads=[b"a"], commit_seq=0))
        await r.service.apply(heartbeat(epoch=2, commit_seq=3))
        await r.service.apply(batch(epoch=1, first_seq=2, payloads=[b"b", b"c"],
                                    commit_seq=1))
        assert stream.commit_seq == 1

    run(tmp_path, body)
