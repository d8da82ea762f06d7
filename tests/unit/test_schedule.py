"""Scheduled messages (node/ops/schedule*.py) on a node on its own, over the in-memory engine
and a fake clock: what scheduling stores, when the scheduler delivers, in what order, exactly
once, cancels, listings, and the checks at publish. No disk, no sockets, no sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from raftlog.base import limits
from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.memory_store import MemoryMessageStore
from raftlog.node.engine.streams import NoConsumers, StreamEngine
from raftlog.node.ops import schedule_layout as layout
from raftlog.node.ops.batches import expand_results
from raftlog.node.ops.metadata import LocalStreamMetadata
from raftlog.node.ops.route import LocalRoute
from raftlog.node.ops.schedule import ScheduleOps
from raftlog.node.ops.schedule_runner import Scheduler
from raftlog.node.ops.streams import StreamOps
from raftlog.node.transport.calls import Call
from raftlog.v1 import streams_pb2, types_pb2

TARGET = "orders"
SCHEDULE = "SCHED_orders"


class Node:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.engine = StreamEngine(store=MemoryMessageStore(), clock=self.clock,
                                   consumers=NoConsumers())
        self.engine.load()
        self.ops = StreamOps(self.engine, metadata=LocalStreamMetadata(self.engine),
                             where=LocalRoute())
        self.ops.schedule = ScheduleOps(self.ops, engine=self.engine, where=LocalRoute(),
                                        clock=self.clock)

    @property
    def now_ms(self) -> int:
        return self.clock.wall_ms()

    def scheduler(self) -> Scheduler:
        return Scheduler(streams=self.ops, engine=self.engine, schedule=SCHEDULE, target=TARGET,
                         clock=self.clock, in_flight=self.ops.scheduled().in_flight)

    async def create(self, name: str = TARGET, **fields: Any) -> None:
        await self.engine.create(types_pb2.StreamConfig(name=name, **fields))

    async def publish(self, subject: str = "orders.eu", *, in_ms: int, **fields: Any
                      ) -> streams_pb2.PublishAck:
        return await self.ops.publish(streams_pb2.PublishRequest(
            stream=TARGET, subject=subject, payload=subject.encode(),
            deliver_at_ms=self.now_ms + in_ms, **fields), Call())

    def messages(self, name: str) -> list[types_pb2.Message]:
        if name not in self.engine.streams:
            return []
        stream = self.engine.get(name)
        return [stream.get_message(e.seq) for e in stream.scan(from_seq=1, limit=100_000)]

    def subjects(self, name: str = TARGET) -> list[str]:
        return [m.subject for m in self.messages(name)]


def run(body: Callable[[Node], Awaitable[None]]) -> None:
    async def main() -> None:
        await asyncio.wait_for(body(Node()), 30)

    asyncio.run(main())


def headers(message: types_pb2.Message) -> dict[str, str]:
    return {h.key: h.value for h in message.headers}


# ---------------------------------------------------------------------- pure functions

@pytest.mark.parametrize(("level", "ms"), [(1, 1_000), (2, 5_000), (4, 30_000), (5, 60_000),
                                           (14, 600_000), (16, 1_800_000), (17, 3_600_000),
                                           (18, 7_200_000)])
def test_delay_levels_are_rocketmqs(level: int, ms: int) -> None:
    assert layout.delay_level_ms(level) == ms


@pytest.mark.parametrize("level", [0, -1, 19])
def test_a_delay_level_out_of_range_is_invalid(level: int) -> None:
    with pytest.raises(RaftlogError) as caught:
        layout.delay_level_ms(level)
    assert caught.value.reason == Reason.INVALID_ARGUMENT


def test_schedule_stream_names_fit_and_name_their_target() -> None:
    assert layout.schedule_stream("orders") == "SCHED_orders"
    long = "t" * limits.name_bytes_max
    other = "t" * (limits.name_bytes_max - 1) + "u"
    name = layout.schedule_stream(long)
    assert len(name) == limits.name_bytes_max and name != layout.schedule_stream(other)
    for target in ("orders", long):
        config = layout.schedule_config(types_pb2.StreamConfig(name=target, replicas=3))
        assert layout.target_of(config) == target and config.replicas == 3
    # A user's stream called SCHED_x is no schedule.
    assert layout.target_of(types_pb2.StreamConfig(name="SCHED_x")) is None
    assert layout.target_of(types_pb2.StreamConfig(
        name="SCHED_x", description=layout.DESCRIPTION_PREFIX + "y")) is None


def test_a_time_too_far_ahead_is_invalid() -> None:
    now = 1_000
    assert not layout.is_future(now, now_ms=now)
    assert layout.is_future(now + 1, now_ms=now)
    assert layout.is_future(now + limits.scheduled_delay_ms_max, now_ms=now)
    with pytest.raises(RaftlogError) as caught:
        layout.is_future(now + limits.scheduled_delay_ms_max + 1, now_ms=now)
    assert caught.value.reason == Reason.INVALID_ARGUMENT


# ---------------------------------------------------------------------- scheduling

def test_a_scheduled_message_waits_in_the_schedule_stream_until_due() -> None:
    async def body(node: Node) -> None:
        await node.create()
        ack = await node.publish(in_ms=10_000, msg_id="m1",
                                 headers=[types_pb2.Header(key="k", value="v")])
        assert (ack.scheduled, ack.stream, ack.seq) == (True, SCHEDULE, 1)
        assert ack.deliver_at_ms == node.now_ms + 10_000
        assert node.subjects() == []
        (waiting,) = node.messages(SCHEDULE)
        assert waiting.msg_id == "m1"
        assert headers(waiting)[layout.DELIVER_AT_HEADER] == str(ack.deliver_at_ms)

        scheduler = node.scheduler()
        await scheduler.start()
        assert await scheduler.round() == 0
        node.clock.advance(9.999)
        assert await scheduler.round() == 0 and node.subjects() == []
        node.clock.advance(0.001)
        assert await scheduler.round() == 1
        (delivered,) = node.messages(TARGET)
        assert (delivered.subject, delivered.payload, delivered.msg_id) == (
            "orders.eu", b"orders.eu", "m1")
        assert headers(delivered) == {"k": "v", layout.SCHEDULED_AT_HEADER:
                                      str(ack.deliver_at_ms), layout.SCHEDULE_SEQ_HEADER: "1"}
        assert node.messages(SCHEDULE) == []
        assert scheduler.waiting == 0

    run(body)


def test_messages_are_delivered_in_due_order_and_picked_up_after_start() -> None:
    async def body(node: Node) -> None:
        await node.create()
        scheduler = node.scheduler()
        await node.publish("a", in_ms=3_000)
        await scheduler.start()
        await node.publish("b", in_ms=1_000)  # scheduled after the scheduler started
        await node.publish("c", in_ms=2_000)
        await scheduler.round()
        assert scheduler.wait_s() == pytest.approx(limits.scheduled_poll_ms / 1000)
        node.clock.advance(0.95)
        assert scheduler.wait_s() == pytest.approx(0.05)
        node.clock.advance(5)
        assert await scheduler.round() == 3
        assert node.subjects() == ["b", "c", "a"]
        # Ids derived from the schedule seq: a (seq 1) got sched:1.
        assert [m.msg_id for m in node.messages(TARGET)] == ["sched:2", "sched:3", "sched:1"]

    run(body)


def test_a_replayed_delivery_is_stored_once() -> None:
    """A scheduler whose removals were lost (its node died) delivers again: the target's
    dedupe window absorbs the copy; the takeover scan removes it without an append."""
    async def body(node: Node) -> None:
        await node.create()
        await node.publish("a", in_ms=1_000)
        await node.publish("b", in_ms=1_000)
        node.clock.advance(2)
        first = node.scheduler()
        await first.start()
        waiting = node.messages(SCHEDULE)
        # The copies reach the target but the schedule keeps both (removal lost).
        reply = await node.ops.publish_batch(streams_pb2.PublishBatchRequest(
            stream=TARGET, entries=[layout.delivered_copy(m, due=node.now_ms)
                                    for m in waiting]), Call())
        assert all(r.HasField("ack") for r in expand_results(reply))
        # Dedupe alone: a scheduler that skips the takeover scan appends duplicates only.
        assert await first.round() == 0
        assert node.subjects() == ["a", "b"] and node.messages(SCHEDULE) == []

        await node.publish("c", in_ms=1_000)
        node.clock.advance(2)
        (c,) = node.messages(SCHEDULE)
        copy = layout.delivered_copy(c, due=node.now_ms)  # as the dead primary appended it
        await node.ops.publish_batch(streams_pb2.PublishBatchRequest(stream=TARGET,
                                                                     entries=[copy]), Call())
        # A message that only carries the header (another msg_id) is no copy.
        alike = layout.delivered_copy(c, due=node.now_ms)
        alike.subject, alike.msg_id = "alike", "src:other:1"
        await node.ops.publish_batch(streams_pb2.PublishBatchRequest(stream=TARGET,
                                                                     entries=[alike]), Call())
        second = node.scheduler()
        await second.start()  # the takeover scan finds c's copy
        assert node.messages(SCHEDULE) == [] and second.waiting == 0
        assert await second.round() == 0
        assert node.subjects() == ["a", "b", "c", "alike"]

    run(body)


def test_past_and_present_times_publish_at_once() -> None:
    async def body(node: Node) -> None:
        await node.create()
        for in_ms in (0, -5_000):
            ack = await node.publish(f"s{-in_ms}", in_ms=in_ms)
            assert not ack.scheduled and ack.stream == TARGET
        assert node.subjects() == ["s0", "s5000"] and SCHEDULE not in node.engine.streams

    run(body)


@pytest.mark.parametrize(("setup", "fields", "reason"), [
    ({}, {"in_ms": limits.scheduled_delay_ms_max + 1_000}, Reason.INVALID_ARGUMENT),
    ({"subjects": ["orders.*"]}, {"subject": "other", "in_ms": 1_000},
     Reason.SUBJECT_NOT_IN_STREAM),
    ({"max_msg_bytes": 100}, {"subject": "x" * 200, "in_ms": 1_000}, Reason.MESSAGE_TOO_LARGE),
    ({}, {"in_ms": 1_000, "expected_last_seq": 0}, Reason.INVALID_ARGUMENT),
    (None, {"in_ms": 1_000}, Reason.STREAM_NOT_FOUND),
])
def test_what_the_target_would_refuse_is_refused_at_publish(
        setup: dict[str, Any] | None, fields: dict[str, Any], reason: Reason) -> None:
    async def body(node: Node) -> None:
        if setup is not None:
            await node.create(**setup)
        with pytest.raises(RaftlogError) as caught:
            await node.publish(**fields)
        assert caught.value.reason == reason
        assert node.messages(SCHEDULE) == [] and node.subjects() == []

    run(body)


def test_a_stream_named_like_a_schedule_is_left_alone() -> None:
    async def body(node: Node) -> None:
        await node.create()
        await node.create(SCHEDULE)  # a user's stream, no schedule description
        with pytest.raises(RaftlogError) as caught:
            await node.publish(in_ms=1_000)
        assert caught.value.reason == Reason.INVALID_ARGUMENT
        assert node.messages(SCHEDULE) == []

    run(body)


def test_publish_stream_refuses_deliver_at_per_message() -> None:
    async def body(node: Node) -> None:
        await node.create()

        async def requests() -> AsyncIterator[streams_pb2.PublishRequest]:
            yield streams_pb2.PublishRequest(stream=TARGET, subject="a")
            yield streams_pb2.PublishRequest(stream=TARGET, subject="b",
                                             deliver_at_ms=node.now_ms + 1_000)
            yield streams_pb2.PublishRequest(stream=TARGET, subject="c")

        reply = await node.ops.publish_stream(requests(), Call())
        results = expand_results(reply)
        assert [r.HasField("ack") for r in results] == [True, False, True]
        assert results[1].error.reason == "INVALID_ARGUMENT"
        assert node.subjects() == ["a", "c"]

    run(body)


# ---------------------------------------------------------------------- list and cancel

def test_list_and_cancel() -> None:
    async def body(node: Node) -> None:
        await node.create()
        schedule = node.ops.scheduled()
        empty = await schedule.list(streams_pb2.ListScheduledRequest(stream=TARGET), Call())
        assert list(empty.messages) == []
        for index in range(5):
            await node.publish(f"s{index}", in_ms=1_000 * (index + 1), msg_id=f"id{index}")
        page = await schedule.list(streams_pb2.ListScheduledRequest(stream=TARGET, limit=3),
                                   Call())
        assert page.schedule_stream == SCHEDULE
        assert [m.schedule_seq for m in page.messages] == [1, 2, 3] and page.next_seq == 4
        assert page.messages[0].deliver_at_ms == node.now_ms + 1_000
        assert (page.messages[0].subject, page.messages[0].msg_id) == ("s0", "id0")
        rest = await schedule.list(streams_pb2.ListScheduledRequest(
            stream=TARGET, from_seq=page.next_seq), Call())
        assert [m.schedule_seq for m in rest.messages] == [4, 5] and rest.next_seq == 0

        scheduler = node.scheduler()
        await scheduler.start()
        cancelled = await schedule.cancel(streams_pb2.CancelScheduledRequest(
            stream=TARGET, schedule_seq=2), Call())
        assert cancelled.message.subject == "s1"
        with pytest.raises(RaftlogError) as caught:
            await schedule.cancel(streams_pb2.CancelScheduledRequest(
                stream=TARGET, schedule_seq=2), Call())
        assert caught.value.reason == Reason.MESSAGE_NOT_FOUND
        node.clock.advance(10)
        assert await scheduler.round() == 4
        assert node.subjects() == ["s0", "s2", "s3", "s4"]
        with pytest.raises(RaftlogError) as caught:  # delivered
            await schedule.cancel(streams_pb2.CancelScheduledRequest(
                stream=TARGET, schedule_seq=1), Call())
        assert caught.value.reason == Reason.MESSAGE_NOT_FOUND

    run(body)


def test_a_cancel_holds_when_its_removal_was_lost() -> None:
    """A new primary may still hold a cancelled message (the removal had not reached it) but
    holds the cancel marker: it never delivers the message and removes both when due."""
    async def body(node: Node) -> None:
        await node.create()
        await node.publish("kept", in_ms=1_000)
        await node.publish("cancelled", in_ms=1_000)
        # As a new primary finds it: the marker committed, the message not removed.
        await node.engine.publish(SCHEDULE, [layout.cancel_marker(2)])
        scheduler = node.scheduler()
        await scheduler.start()
        listed = await node.ops.scheduled().list(
            streams_pb2.ListScheduledRequest(stream=TARGET), Call())
        assert [m.subject for m in listed.messages] == ["kept", "cancelled"]
        node.clock.advance(2)
        assert await scheduler.round() == 1
        assert node.subjects() == ["kept"] and node.messages(SCHEDULE) == []

        # A marker whose message is gone here is removed as soon as it is read.
        await node.publish("later", in_ms=1_000)
        await node.ops.scheduled().cancel(streams_pb2.CancelScheduledRequest(
            stream=TARGET, schedule_seq=4), Call())
        assert [m.subject for m in node.messages(SCHEDULE)] == [layout.CANCEL_SUBJECT]
        await scheduler.round()
        assert node.messages(SCHEDULE) == []
        node.clock.advance(2)
        assert await scheduler.round() == 0 and node.subjects() == ["kept"]

    run(body)


def test_a_cancel_and_a_delivery_never_both_take_one_message(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(node: Node) -> None:
        await node.create()
        await node.publish("a", in_ms=1_000)
        scheduler = node.scheduler()
        await scheduler.start()
        node.clock.advance(2)
        in_flight = node.ops.scheduled().in_flight
        cancel = streams_pb2.CancelScheduledRequest(stream=TARGET, schedule_seq=1)

        # A cancel holds the message: the round leaves it for later.
        assert in_flight.claim(SCHEDULE, 1)
        assert await scheduler.round() == 0 and scheduler.waiting == 1
        # A delivery holds it: the cancel waits for it, then finds it still waiting.
        task = asyncio.create_task(node.ops.scheduled().cancel(cancel, Call()))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not task.done()
        in_flight.release(SCHEDULE, 1)
        assert (await task).message.subject == "a"
        assert await scheduler.round() == 0 and node.subjects() == []

        # A holder that does not let go: TIMEOUT after the named wait.
        await node.publish("b", in_ms=1_000)
        monkeypatch.setattr(limits, "scheduled_cancel_wait_ms_max", 10)
        assert in_flight.claim(SCHEDULE, 3)
        with pytest.raises(RaftlogError) as caught:
            await node.ops.scheduled().cancel(streams_pb2.CancelScheduledRequest(
                stream=TARGET, schedule_seq=3), Call())
        assert caught.value.reason == Reason.TIMEOUT

    run(body)


@pytest.mark.parametrize(("request_fields", "reason"), [
    ({"stream": TARGET, "schedule_seq": 0}, Reason.INVALID_ARGUMENT),
    ({"stream": "bad.name", "schedule_seq": 1}, Reason.INVALID_NAME),
    ({"stream": "nope", "schedule_seq": 1}, Reason.MESSAGE_NOT_FOUND),
])
def test_bad_cancels(request_fields: dict[str, Any], reason: Reason) -> None:
    async def body(node: Node) -> None:
        await node.create()
        with pytest.raises(RaftlogError) as caught:
            await node.ops.scheduled().cancel(
                streams_pb2.CancelScheduledRequest(**request_fields), Call())
        assert caught.value.reason == reason

    run(body)


def test_list_limit_is_bounded() -> None:
    async def body(node: Node) -> None:
        await node.create()
        with pytest.raises(RaftlogError) as caught:
            await node.ops.scheduled().list(streams_pb2.ListScheduledRequest(
                stream=TARGET, limit=limits.scheduled_list_limit_max + 1), Call())
        assert caught.value.reason == Reason.INVALID_ARGUMENT

    run(body)
