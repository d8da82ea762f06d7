"""A primary's replicator sends what a publish just wrote from memory (`Stream._fresh`,
node/engine/stream_reads.py `stored_values`), never anything the store no longer holds: after
every step below, what `stored_values` gives equals what a read of the store gives."""

from __future__ import annotations

import random

from raftlog.node.engine.stream import Stream
from raftlog.node.engine.stream_publish import draft
from tests.engine.test_streams import Harness, Place, create, place, run

__all__ = ["place"]  # the fixture: a RocksDB store and the in-memory one


class _Replicator:
    """Enough of a replicator for publish_staged (it is never asked to send here)."""

    def kick(self) -> None: ...
    def on_local_durable(self) -> None: ...
    def check_lease(self) -> None: ...
    def check_writable(self) -> None: ...


def _from_store(stream: Stream, from_seq: int, to_seq: int, bytes_max: int) -> list[bytes]:
    fresh = stream._fresh
    stream._fresh = None  # the store alone
    try:
        return stream.stored_values(from_seq=from_seq, to_seq=to_seq, bytes_max=bytes_max)
    finally:
        stream._fresh = fresh


def _agree(stream: Stream, rng: random.Random) -> int:
    """Checks every range inside the stream and a little around it; returns how many came from
    memory."""
    used = 0
    last = stream.record.last_seq
    for _ in range(30):
        from_seq = rng.randint(max(1, last - 40), last + 1)
        to_seq = rng.randint(from_seq, last + 1)
        bytes_max = rng.choice([1, 50, 10**6])
        memory = stream._fresh is not None
        got = stream.stored_values(from_seq=from_seq, to_seq=min(to_seq, last),
                                   bytes_max=bytes_max)
        want = _from_store(stream, from_seq, min(to_seq, last), bytes_max)
        assert got == want, (from_seq, to_seq, bytes_max)
        used += memory and bool(got)
    return used


def test_stored_values_from_memory_equal_the_store_through_removals(place: Place) -> None:
    async def body(h: Harness) -> int:
        await create(h, "s", subjects=["s.>"], max_msgs_per_subject=25)
        stream = h.engine.get("s")
        stream.replicator = _Replicator()
        rng = random.Random(7)
        used = 0
        for step in range(60):
            size = rng.choice([1, 5, 30])
            drafts = [draft(f"s.{rng.randint(0, 3)}", b"x" * rng.randint(0, 40),
                            msg_id=f"m{step}-{k}" if k % 7 == 0 else "") for k in range(size)]
            stream.publish_staged(drafts)
            stream._advance_commit(stream.record.last_seq)  # as the replicas' acks would
            used += _agree(stream, rng)
            if step % 3 == 1:  # a work queue's acks or an interest consumer's: holes
                last = stream.record.last_seq
                await stream.remove(rng.sample(range(max(1, last - 30), last + 1), 3))
                used += _agree(stream, rng)
            if step % 10 == 9:  # the replicator has sent
                stream.forget_fresh()
                used += _agree(stream, rng)
        return used

    assert run(place, body) > 0  # memory served some ranges, and always as the store would


def test_a_limit_that_removes_inside_the_publish_is_seen(place: Place) -> None:
    async def body(h: Harness) -> tuple[list[bytes], list[bytes]]:
        await create(h, "s", subjects=["s.>"], max_msgs=3)
        stream = h.engine.get("s")
        stream.replicator = _Replicator()
        stream.publish_staged([draft("s.a", b"%d" % k) for k in range(10)])
        got = stream.stored_values(from_seq=1, to_seq=10, bytes_max=10**6)
        return got, _from_store(stream, 1, 10, 10**6)

    got, want = run(place, body)
    assert got == want
    assert [value == b"" for value in got] == [True] * 7 + [False] * 3

