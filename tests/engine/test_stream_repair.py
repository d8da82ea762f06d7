"""The audit's repair of a local copy (node/engine/stream_repair.py, the peer `Repair` call):
truncate, put (fill a hole, replace differing bytes), reset; refusals change nothing; what a
repair wrote is what the copy holds after a restart. And the consumer step on the node's own
consumer store (the peer `RepairConsumer` call): the record goes, durably, unless it moved.
In-process, real RocksDB, no sockets."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import replication_pb2, storage_pb2
from raftlog.node.engine.stream import Stream
from raftlog.node.replication.service import ReplicationService
from raftlog.v1 import consumers_pb2
from tests.engine.replica_harness import Replica, stored

Body = Callable[[Replica, Stream], Awaitable[None]]


def run(path: Path, body: Body, *, after_restart: Body | None = None) -> None:
    async def main() -> None:
        replica = Replica(path)
        stream = await replica.open()
        try:
            await body(replica, stream)
        finally:
            replica.close()
        del replica, stream
        gc.collect()  # the store's column family handles keep the database's lock until freed
        if after_restart is not None:
            again = Replica(path)
            again.committer.start(asyncio.get_running_loop())
            again.engine.load()
            try:
                await after_restart(again, again.engine.get("s"))
            finally:
                again.close()

    asyncio.run(main())


async def repair(replica: Replica, request: replication_pb2.RepairRequest
                 ) -> replication_pb2.RepairReply:
    """The service's Repair without gRPC: a refusal is raised as the RaftlogError."""
    undecorated: Any = ReplicationService.Repair.__wrapped__  # type: ignore[attr-defined]
    reply: replication_pb2.RepairReply = await undecorated(replica.service, request, None)
    return reply


async def five(replica: Replica) -> None:
    """Seqs 1-5, epoch 1 for 1-3 and epoch 2 for 4-5; subjects a, b alternating."""
    await replica.send(epoch=1, first_seq=1, payloads=[b"1", b"2", b"3"])
    await replica.send(epoch=2, first_seq=4, payloads=[b"4", b"5"], history=[(1, 1), (2, 4)])


def test_truncate_removes_the_tail_and_the_copy_restarts_where_it_ends(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await five(r)
        reply = await repair(r, replication_pb2.RepairRequest(
            stream="s", truncate_after=3, expect_last_seq=5, expect_epoch=2))
        assert reply.changed == 2
        assert (reply.state.last_seq, reply.state.last_epoch) == (3, 1)
        assert r.payloads(stream) == {1: b"1", 2: b"2", 3: b"3"}
        assert (stream.record.messages, stream.commit_seq <= 3) == (3, True)

    async def after(r: Replica, stream: Stream) -> None:
        assert r.payloads(stream) == {1: b"1", 2: b"2", 3: b"3"}
        assert (stream.record.last_seq, stream.record.messages, stream.record.last_epoch) == (
            3, 3, 1)
        # Replication goes on from the end: the primary's seq 4 is taken.
        ack = await r.send(epoch=2, first_seq=4, payloads=[b"4"], history=[(1, 1), (2, 4)])
        assert (ack.refused, ack.last_seq) == ("", 4)

    run(tmp_path, body, after_restart=after)


def test_put_fills_a_hole_and_replaces_differing_bytes_only(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await five(r)
        await r.send(epoch=2, first_seq=6, removed=[(2, 2)], history=[(1, 1), (2, 4)])
        assert 2 not in r.payloads(stream) and stream.record.messages == 4
        bytes_before = stream.record.bytes
        put = replication_pb2.RepairPut(messages=[
            replication_pb2.LocalMessage(seq=2, stored=stored(b"2", epoch=1)),
            replication_pb2.LocalMessage(seq=3, stored=stored(b"3", epoch=1)),
            replication_pb2.LocalMessage(seq=5, stored=stored(b"five", epoch=2))])
        reply = await repair(r, replication_pb2.RepairRequest(stream="s", put=put))
        assert reply.changed == 2  # seq 3 already held those bytes
        assert r.payloads(stream) == {1: b"1", 2: b"2", 3: b"3", 4: b"4", 5: b"five"}
        assert stream.record.messages == 5 and stream.record.bytes == bytes_before + 2 + 3

    async def after(r: Replica, stream: Stream) -> None:
        assert r.payloads(stream) == {1: b"1", 2: b"2", 3: b"3", 4: b"4", 5: b"five"}
        assert stream.record.messages == 5

    run(tmp_path, body, after_restart=after)


def test_put_below_the_head_gives_the_copy_its_front_back(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await five(r)
        await r.send(epoch=2, first_seq=6, removed=[(1, 2)], history=[(1, 1), (2, 4)])
        assert (stream.record.first_seq, sorted(r.payloads(stream))) == (3, [3, 4, 5])
        put = replication_pb2.RepairPut(messages=[
            replication_pb2.LocalMessage(seq=seq, stored=stored(b"%d" % seq, epoch=1))
            for seq in (1, 2)])
        reply = await repair(r, replication_pb2.RepairRequest(stream="s", put=put))
        assert (reply.changed, reply.state.first_seq) == (2, 1)
        assert r.payloads(stream) == {1: b"1", 2: b"2", 3: b"3", 4: b"4", 5: b"5"}
        assert stream.record.messages == 5

    run(tmp_path, body)


def test_reset_drops_the_copy_and_the_primary_resends_from_the_given_seq(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await five(r)
        reply = await repair(r, replication_pb2.RepairRequest(stream="s", reset_to=3))
        assert reply.changed == 5 and r.payloads(stream) == {}
        assert (reply.state.first_seq, reply.state.last_seq) == (3, 2)
        ack = await r.send(epoch=2, first_seq=3, payloads=[b"3", b"4"], msg_epoch=2,
                           history=[(1, 1), (2, 4)])
        assert (ack.refused, ack.last_seq) == ("", 4)
        assert r.payloads(stream) == {3: b"3", 4: b"4"}

    run(tmp_path, body)


@pytest.mark.parametrize("request_, reason", [
    (replication_pb2.RepairRequest(stream="s", truncate_after=1, expect_last_seq=4),
     Reason.COPY_CHANGED),
    (replication_pb2.RepairRequest(stream="s", truncate_after=1, expect_epoch=1),
     Reason.COPY_CHANGED),
    (replication_pb2.RepairRequest(stream="s", put=replication_pb2.RepairPut(messages=[
        replication_pb2.LocalMessage(seq=2, stored=stored(b"x", epoch=1)),
        replication_pb2.LocalMessage(seq=6, stored=stored(b"past the end", epoch=2))])),
     Reason.INVALID_ARGUMENT),
    (replication_pb2.RepairRequest(stream="s", put=replication_pb2.RepairPut(messages=[
        replication_pb2.LocalMessage(seq=2, stored=b"\xff\xff not a message")])),
     Reason.CORRUPT_RECORD),
    (replication_pb2.RepairRequest(stream="s"), Reason.INVALID_ARGUMENT),
    (replication_pb2.RepairRequest(stream="other", truncate_after=1), Reason.STREAM_NOT_FOUND),
])
def test_a_refused_repair_changes_nothing(tmp_path: Path, request_: replication_pb2.RepairRequest,
                                         reason: Reason) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await five(r)
        before = (r.payloads(stream), stream.record.SerializeToString())
        with pytest.raises(RaftlogError) as raised:
            await repair(r, request_)
        assert raised.value.reason is reason
        assert (r.payloads(stream), stream.record.SerializeToString()) == before

    run(tmp_path, body)


def test_the_copy_a_serving_primary_holds_is_never_repaired(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await five(r)
        stream.become_primary(epoch=2)
        with pytest.raises(RaftlogError) as raised:
            await repair(r, replication_pb2.RepairRequest(stream="s", truncate_after=1))
        assert raised.value.reason is Reason.COPY_IS_PRIMARY
        assert stream.last_seq == 5

    run(tmp_path, body)


async def repair_consumer(replica: Replica, request: replication_pb2.RepairConsumerRequest
                          ) -> replication_pb2.RepairConsumerReply:
    """The service's RepairConsumer without gRPC: a refusal is raised as the RaftlogError."""
    undecorated: Any = ReplicationService.RepairConsumer.__wrapped__  # type: ignore[attr-defined]
    reply: replication_pb2.RepairConsumerReply = await undecorated(replica.service, request, None)
    return reply


def consumer_record(name: str, *, delivered: int, floor: int, acked: tuple[int, ...] = ()
                    ) -> storage_pb2.ConsumerRecord:
    return storage_pb2.ConsumerRecord(config=consumers_pb2.ConsumerConfig(name=name),
                                      delivered_seq=delivered, ack_floor=floor, acked=acked)


def seen(delivered: int, floor: int, acked_count: int) -> consumers_pb2.ConsumerStateExpect:
    return consumers_pb2.ConsumerStateExpect(delivered_seq=delivered, ack_floor=floor,
                                             acked_count=acked_count)


def names(replica: Replica) -> list[str]:
    return sorted(record.config.name for record in replica.consumer_copies.load("s"))


def test_repair_consumer_removes_the_store_record_for_good(tmp_path: Path) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await r.consumer_copies.save("s", consumer_record("c", delivered=9, floor=4, acked=(6,)))
        await r.consumer_copies.save("s", consumer_record("other", delivered=1, floor=1))
        reply = await repair_consumer(r, replication_pb2.RepairConsumerRequest(
            stream="s", consumer="c", expect=seen(9, 4, 1)))
        assert reply.changed == 1 and names(r) == ["other"]
        again = await repair_consumer(r, replication_pb2.RepairConsumerRequest(
            stream="s", consumer="c", expect=seen(9, 4, 1)))
        assert again.changed == 0  # nothing left to remove: already repaired

    async def after(r: Replica, stream: Stream) -> None:
        assert names(r) == ["other"]

    run(tmp_path, body, after_restart=after)


@pytest.mark.parametrize("request_, reason", [
    (replication_pb2.RepairConsumerRequest(stream="s", consumer="c", expect=seen(9, 5, 1)),
     Reason.CONSUMER_CHANGED),
    (replication_pb2.RepairConsumerRequest(stream="s", consumer="c", expect=seen(9, 4, 0)),
     Reason.CONSUMER_CHANGED),
    (replication_pb2.RepairConsumerRequest(stream="gone", consumer="c"),
     Reason.STREAM_NOT_FOUND),
    (replication_pb2.RepairConsumerRequest(stream="s", consumer="a.b"), Reason.INVALID_NAME),
], ids=["floor-moved", "acked-moved", "no-such-stream", "bad-name"])
def test_a_refused_consumer_repair_changes_nothing(
        tmp_path: Path, request_: replication_pb2.RepairConsumerRequest, reason: Reason) -> None:
    async def body(r: Replica, stream: Stream) -> None:
        await r.consumer_copies.save("s", consumer_record("c", delivered=9, floor=4, acked=(6,)))
        with pytest.raises(RaftlogError) as caught:
            await repair_consumer(r, request_)
        assert caught.value.reason is reason
        assert names(r) == ["c"]

    run(tmp_path, body)
