"""Source tails (node/ops/source_tail.py, sources.py, reads.py) on a node on its own, over the
in-memory engine: what they copy, where a new tail goes on, the on-drop policies, dead-letter
records, and ReadMessages' bounds. No disk, no sockets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from raftlog.base import limits
from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.memory_store import MemoryMessageStore
from raftlog.node.engine.stream_publish import draft
from raftlog.node.engine.streams import NoConsumers, StreamEngine
from raftlog.node.ops.metadata import LocalStreamMetadata
from raftlog.node.ops.route import LocalRoute
from raftlog.node.ops.source_tail import SOURCE_SEQ_HEADER, SOURCE_STREAM_HEADER
from raftlog.node.ops.sources import SourceRunner
from raftlog.node.ops.streams import StreamOps
from raftlog.node.transport.calls import Call
from raftlog.v1 import streams_pb2, types_pb2

WAIT_S = 10.0


class Node:
    """One node on its own: the engine, its stream operations and a source runner."""

    def __init__(self) -> None:
        self.engine = StreamEngine(store=MemoryMessageStore(), clock=FakeClock(),
                                   consumers=NoConsumers())
        self.engine.load()
        self.ops = StreamOps(self.engine, metadata=LocalStreamMetadata(self.engine),
                             where=LocalRoute())
        self.runner: SourceRunner | None = None

    def start_tails(self) -> None:
        self.runner = SourceRunner(streams=self.ops, engine=self.engine, clock=FakeClock(),
                                   node_id="")
        self.runner.reconcile()

    async def stop_tails(self) -> None:
        if self.runner is not None:
            await self.runner.stop()
            self.runner = None

    async def create(self, name: str, *sources: types_pb2.StreamSource, **fields: Any) -> None:
        await self.engine.create(types_pb2.StreamConfig(name=name, sources=list(sources),
                                                        **fields))

    async def publish(self, stream: str, *subjects: str) -> None:
        results = await self.engine.publish(stream, [draft(s, s.encode()) for s in subjects])
        assert not any(isinstance(r, RaftlogError) for r in results), results

    def messages(self, stream: str) -> list[types_pb2.Message]:
        s = self.engine.get(stream)
        return [s.get_message(e.seq) for e in s.scan(from_seq=1, limit=100_000)]

    def sourced(self, stream: str, source: str = "orders") -> list[int]:
        seqs = []
        for m in self.messages(stream):
            headers = {h.key: h.value for h in m.headers}
            if headers.get(SOURCE_STREAM_HEADER) == source:
                assert m.msg_id == f"src:{source}:{headers[SOURCE_SEQ_HEADER]}"
                seqs.append(int(headers[SOURCE_SEQ_HEADER]))
        return seqs

    def status(self, stream: str = "audit", source: str = "orders") -> types_pb2.SourceStatus:
        (status,) = [s for s in self.ops.tails.statuses(stream) if s.source_stream == source]
        return status


def run(body: Callable[[Node], Awaitable[None]]) -> None:
    async def main() -> None:
        node = Node()
        try:
            await asyncio.wait_for(body(node), 30)
        finally:
            await node.stop_tails()

    asyncio.run(main())


async def until(predicate: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def source(**fields: Any) -> types_pb2.StreamSource:
    fields.setdefault("stream", "orders")
    return types_pb2.StreamSource(**fields)


EU_US = ["orders.eu.a", "orders.us.b", "orders.eu.c.d"] * 4  # seqs 1..12; eu: all but 2,5,8,11


def test_filter_transform_and_start_seq_copy_exactly_the_matching_messages() -> None:
    async def body(node: Node) -> None:
        await node.create("orders")
        await node.create("audit", source(
            filter_subject="orders.eu.>", start_seq=3,
            subject_transform=types_pb2.SubjectTransform(
                source_pattern="orders.*.>", destination="audit.{{wildcard(1)}}.{{wildcard(2)}}")))
        await node.publish("orders", *EU_US[:6])
        node.start_tails()
        await until(lambda: node.sourced("audit") == [3, 4, 6], "the first copies")
        await node.publish("orders", *EU_US[6:])
        await until(lambda: node.sourced("audit") == [3, 4, 6, 7, 9, 10, 12], "the rest")
        copies = node.messages("audit")
        assert [m.subject for m in copies[:3]] == ["audit.eu.c.d", "audit.eu.a", "audit.eu.c.d"]
        headers = {h.key: h.value for h in copies[0].headers}
        assert headers["Raftlog-Source-Subject"] == "orders.eu.c.d"
        assert copies[0].payload == b"orders.eu.c.d"
        status = node.status()
        assert (status.last_sourced_seq, status.appended_total, status.last_error) == (12, 7, "")
        info = await node.ops.info(streams_pb2.GetStreamInfoRequest(name="audit"), Call())
        assert [s.source_stream for s in info.sources] == ["orders"]

    run(body)


def test_a_new_tail_goes_on_after_the_last_copied_message() -> None:
    async def body(node: Node) -> None:
        await node.create("orders")
        await node.create("other")
        await node.create("audit", source(filter_subject="orders.eu.>"), source(stream="other"))
        await node.publish("orders", *EU_US[:6])
        await node.publish("other", "x")
        node.start_tails()
        await until(lambda: node.sourced("audit") == [1, 3, 4, 6], "the first copies")
        await until(lambda: node.sourced("audit", "other") == [1], "the other source")
        await node.stop_tails()
        # Messages that are not from the source, newer than its last copy: skipped over.
        await node.publish("audit", *(["local"] * 50))
        await node.publish("other", "y")
        await node.publish("orders", *EU_US[6:])
        node.start_tails()
        await until(lambda: node.sourced("audit") == [1, 3, 4, 6, 7, 9, 10, 12], "the rest")
        await until(lambda: node.sourced("audit", "other") == [1, 2], "the other's rest")
        assert node.status().pulled_total == 4  # counters start again with the tail

    run(body)


def test_a_retried_append_is_absorbed_by_the_dedupe_window() -> None:
    async def body(node: Node) -> None:
        await node.create("orders")
        await node.create("audit", source())
        await node.publish("orders", "a", "b", "c")
        node.start_tails()
        await until(lambda: node.sourced("audit") == [1, 2, 3], "the copies")
        await node.stop_tails()
        await node.publish("audit", "local")  # the copies are no longer the newest
        # A tail that believed it stopped earlier re-sends 2 and 3: stored once.
        results = await node.engine.publish("audit", [
            draft("b", b"b", msg_id="src:orders:2"), draft("c", b"c", msg_id="src:orders:3")])
        assert [getattr(r, "duplicate", None) for r in results] == [True, True]
        assert node.sourced("audit") == [1, 2, 3]

    run(body)


def test_backfill_bounds_the_first_copy_and_start_time_picks_the_first_message() -> None:
    async def body(node: Node) -> None:
        await node.create("orders")
        await node.publish("orders", *(f"o.{i}" for i in range(10)))
        times = [m.ts_ms for m in node.messages("orders")]
        await node.create("audit", source(max_initial_backfill=3))
        await node.create("later", source(start_time_ms=times[7]))
        node.start_tails()
        await until(lambda: node.sourced("audit") == [8, 9, 10], "the backfill")
        await until(lambda: node.sourced("later")[:1] == [times.index(times[7]) + 1],
                    "the start time")

    run(body)


def test_a_missing_source_is_reported_until_it_exists() -> None:
    async def body(node: Node) -> None:
        await node.create("audit", source())
        node.start_tails()
        await until(lambda: "does not exist" in node.status().last_error, "the error")
        assert node.status().last_error == "source stream 'orders' does not exist"
        await node.create("orders")
        await node.publish("orders", "a")
        await until(lambda: node.sourced("audit") == [1], "the copy")
        await until(lambda: node.status().last_error == "", "the error cleared")

    run(body)


def test_a_transform_mismatch_is_dead_lettered_and_the_rest_copied() -> None:
    async def body(node: Node) -> None:
        await node.create("orders")
        await node.create("errors")
        await node.create("audit", source(
            dlq_stream="errors", subject_transform=types_pb2.SubjectTransform(
                source_pattern="orders.*", destination="audit.{{wildcard(1)}}")))
        await node.publish("orders", "orders.a", "orders.b.c", "orders.d")
        node.start_tails()
        await until(lambda: node.sourced("audit") == [1, 3], "the copies")
        (record,) = node.messages("errors")
        assert record.subject == "sources.audit.orders.transform_mismatch"
        document = json.loads(record.payload)
        assert (document["kind"], document["source_seq"], document["subject"]) == (
            "transform_mismatch", 2, "orders.b.c")
        assert "does not match" in node.status().last_error
        assert node.status().errors_total == 1

    run(body)


def test_a_message_the_sourcing_stream_refuses_is_dead_lettered() -> None:
    async def body(node: Node) -> None:
        await node.create("orders")
        await node.create("errors")
        await node.create("audit", source(dlq_stream="errors"), subjects=["ok.>"])
        await node.publish("orders", "ok.1", "bad.2", "ok.3")
        node.start_tails()
        await until(lambda: node.sourced("audit") == [1, 3], "the copies")
        (record,) = node.messages("errors")
        assert json.loads(record.payload)["kind"] == "append_failed"
        assert "SUBJECT_NOT_IN_STREAM" in node.status().last_error

    run(body)


async def _copy_then_purge(node: Node, on_drop: int) -> None:
    await node.create("orders")
    await node.create("errors")
    await node.create("audit", source(on_drop=on_drop, dlq_stream="errors"))
    await node.publish("orders", "a", "b")
    node.start_tails()
    await until(lambda: node.sourced("audit") == [1, 2], "the first copies")
    await node.stop_tails()
    await node.publish("orders", "c", "d", "e")
    await node.engine.purge(streams_pb2.PurgeStreamRequest(name="orders", below_seq=4))
    await node.publish("orders", "f")
    node.start_tails()


def test_on_drop_halt_stops_the_tail_and_says_why() -> None:
    async def body(node: Node) -> None:
        await _copy_then_purge(node, types_pb2.SOURCE_ON_DROP_HALT)
        await until(lambda: node.status().halted, "the halt")
        assert "removed seqs 3..3" in node.status().last_error
        await asyncio.sleep(limits.source_retry_ms / 1000 * 2)
        assert node.sourced("audit") == [1, 2]
        assert node.status().halted and node.status().last_error
        (record,) = node.messages("errors")
        assert json.loads(record.payload)["kind"] == "on_drop_halt"

    run(body)


def test_on_drop_skip_goes_on_from_the_first_available_seq() -> None:
    async def body(node: Node) -> None:
        await _copy_then_purge(node, types_pb2.SOURCE_ON_DROP_SKIP_TO_FIRST_AVAILABLE)
        await until(lambda: node.sourced("audit") == [1, 2, 4, 5, 6], "the copies after the gap")
        assert not node.status().halted
        (record,) = node.messages("errors")
        assert json.loads(record.payload)["kind"] == "on_drop_skip"
        await node.publish("orders", "g")
        await until(lambda: node.status().last_error == "", "the warning cleared")

    run(body)


def test_read_messages_reports_where_to_go_on_past_filtered_messages() -> None:
    async def body(node: Node) -> None:
        await node.create("orders")
        await node.publish("orders", *(["x"] * 5), "y", *(["x"] * 3))
        read = node.ops.read_messages
        reply = await read(streams_pb2.ReadMessagesRequest(stream="orders", filter_subject="y"),
                           Call())
        assert [m.seq for m in reply.messages] == [6]
        assert (reply.next_seq, reply.first_seq, reply.last_seq) == (10, 1, 9)
        reply = await read(streams_pb2.ReadMessagesRequest(stream="orders", from_seq=2, limit=2),
                           Call())
        assert ([m.seq for m in reply.messages], reply.next_seq) == ([2, 3], 4)
        started = asyncio.get_running_loop().time()
        reply = await read(streams_pb2.ReadMessagesRequest(stream="orders", from_seq=10,
                                                           max_wait_ms=200), Call())
        assert not reply.messages and reply.next_seq == 10
        assert asyncio.get_running_loop().time() - started >= 0.15
        waiting = asyncio.ensure_future(read(streams_pb2.ReadMessagesRequest(
            stream="orders", from_seq=10, max_wait_ms=5_000), Call()))
        await asyncio.sleep(0.05)
        await node.publish("orders", "z")
        reply = await asyncio.wait_for(waiting, 2)
        assert [m.subject for m in reply.messages] == ["z"]
        try:
            await read(streams_pb2.ReadMessagesRequest(stream="orders", limit=10**6), Call())
        except RaftlogError as err:
            assert err.reason is Reason.INVALID_ARGUMENT
        else:
            raise AssertionError("a limit above the maximum was accepted")

    run(body)
