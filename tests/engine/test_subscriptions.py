"""Subscribe bounds without node processes: the subscription slots (node/transport/subscriptions.py)
on an in-process grpc.aio server with two slots (a call beyond them is refused with
TOO_MANY_SUBSCRIPTIONS before its handler runs, and a slot comes back however a call ends), and the
bytes cap a Subscribe passes to ConsumerManager.fetch; and a stream's max_subscriptions, counted by
the consumer operations that serve a Subscribe (StreamSubscriptions). The multi-process versions
are in tests/process/test_subscribe_bounds.py and test_quotas.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from raftlog.base import limits
from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.consumers.manager import ConsumerManager
from raftlog.node.consumers.store import MemoryConsumerStore
from raftlog.node.engine.log import MemoryStreamLog
from raftlog.node.ops.consumers import ConsumerOps
from raftlog.node.ops.metadata import LocalConsumerMetadata
from raftlog.node.ops.route import LocalRoute
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.node.transport.subscriptions import (
    StreamSubscriptions,
    SubscriptionLimitInterceptor,
    SubscriptionSlots,
)
from raftlog.v1 import consumers_pb2, types_pb2

METHOD = "/test.Subs/Subscribe"
OTHER = "/test.Subs/Other"
slots_max = 2
step_timeout_s = 5.0


class Feed:
    """A server-streaming handler that sends one event, then what the test tells it."""

    def __init__(self) -> None:
        self.started = 0
        self.release: asyncio.Queue[str] = asyncio.Queue()

    async def subscribe(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        self.started += 1
        yield b"hello"
        if await self.release.get() == "fail":
            raise RaftlogError(Reason.INTERNAL, "the handler failed")


async def _with_server(body: Callable[[grpc.aio.Channel, Feed, SubscriptionSlots],
                                      Awaitable[None]]) -> None:
    feed, slots = Feed(), SubscriptionSlots(slots_max)
    server = grpc.aio.server(interceptors=[
        SubscriptionLimitInterceptor(slots, methods=frozenset({METHOD}))])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Subs", {
        "Subscribe": grpc.unary_stream_rpc_method_handler(feed.subscribe),
        "Other": grpc.unary_stream_rpc_method_handler(feed.subscribe),
    }),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await body(channel, feed, slots)
    finally:
        await server.stop(None)


def run(body: Callable[[grpc.aio.Channel, Feed, SubscriptionSlots], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(_with_server(body), timeout=30))


async def _open(channel: grpc.aio.Channel, method: str = METHOD) -> Any:
    """A call that has received its first event (so the server holds it)."""
    call: Any = channel.unary_stream(method)(b"")
    assert await asyncio.wait_for(call.read(), step_timeout_s) == b"hello"
    return call


async def _refused(channel: grpc.aio.Channel) -> None:
    call: Any = channel.unary_stream(METHOD)(b"")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(call.read(), step_timeout_s)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    parsed = rpc.from_rpc_error(caught.value)
    assert parsed is not None and parsed.reason is Reason.TOO_MANY_SUBSCRIPTIONS
    assert parsed.metadata["limit"] == str(slots_max)


async def _until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(step_timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


def test_a_call_beyond_the_slots_is_refused_before_its_handler_runs() -> None:
    async def body(channel: grpc.aio.Channel, feed: Feed, slots: SubscriptionSlots) -> None:
        held = [await _open(channel) for _ in range(slots_max)]
        await _refused(channel)
        assert feed.started == slots_max and slots.taken == slots_max
        for call in held:
            call.cancel()

    run(body)


@pytest.mark.parametrize("ending", ["client cancels", "handler ends", "handler fails"])
def test_a_slot_comes_back_however_the_call_ends(ending: str) -> None:
    async def body(channel: grpc.aio.Channel, feed: Feed, slots: SubscriptionSlots) -> None:
        held = [await _open(channel) for _ in range(slots_max)]
        if ending == "client cancels":
            held[0].cancel()
        else:
            await feed.release.put("end" if ending == "handler ends" else "fail")
        await _until(lambda: slots.taken == slots_max - 1)
        held.append(await _open(channel))  # the freed slot is usable
        for call in held:
            call.cancel()
        await _until(lambda: slots.taken == 0)

    run(body)


def test_other_methods_take_no_slot() -> None:
    async def body(channel: grpc.aio.Channel, feed: Feed, slots: SubscriptionSlots) -> None:
        held = [await _open(channel) for _ in range(slots_max)]
        other = [await _open(channel, OTHER) for _ in range(3)]
        assert slots.taken == slots_max
        for call in held + other:
            call.cancel()

    run(body)


@pytest.mark.parametrize(("sizes", "expected"), [
    ([4_000] * 40, 16),  # 16 x (4,000 + subject) fit in 64 KiB; the 17th would not
    ([100_000, 10], 1),  # the first message always goes, even over the cap
    ([10] * 100, 64),  # small messages: the batch is the limit
])
def test_fetch_with_bytes_max_stops_at_the_cap(sizes: list[int], expected: int) -> None:
    async def scenario() -> int:
        log = MemoryStreamLog(name="s")
        for size in sizes:
            log.append("s.x", b"x" * size)
        manager = ConsumerManager(store=MemoryConsumerStore(), clock=FakeClock())
        manager.attach_stream(log, retention=types_pb2.RETENTION_POLICY_LIMITS, subjects=())
        await manager.create("s", consumers_pb2.ConsumerConfig(name="c"))
        messages = await manager.fetch("s", "c", batch=64, max_wait_ms=0,
                                       bytes_max=limits.subscribe_buffer_bytes_max)
        return len(messages)

    assert asyncio.run(asyncio.wait_for(scenario(), timeout=10)) == expected


def test_a_streams_subscriptions_are_counted_while_served_and_bounded() -> None:
    """With max_subscriptions 1: a second Subscribe of the stream is refused before any
    event, another stream's is served, a refused or invalid one holds nothing, and the slot
    comes back when the first ends, whether it is closed or its task is cancelled."""
    limits_by_stream = {"s": 1, "t": 0}

    async def scenario() -> None:
        manager = ConsumerManager(store=MemoryConsumerStore(), clock=FakeClock())
        for name in limits_by_stream:
            manager.attach_stream(MemoryStreamLog(name=name),
                                  retention=types_pb2.RETENTION_POLICY_LIMITS, subjects=())
            await manager.create(name, consumers_pb2.ConsumerConfig(name="c"))
        counts = StreamSubscriptions(lambda stream: limits_by_stream[stream])
        ops = ConsumerOps(manager, metadata=LocalConsumerMetadata(manager), where=LocalRoute(),
                          subscriptions=counts)

        def events(stream: str, heartbeat_ms: int = 100) -> Any:
            return ops.subscribe(consumers_pb2.SubscribeRequest(
                stream=stream, consumer="c", heartbeat_ms=heartbeat_ms), Call())

        first = events("s")
        assert (await anext(first)).HasField("heartbeat") and counts.open("s") == 1
        with pytest.raises(RaftlogError) as caught:
            await anext(events("s"))
        assert caught.value.reason is Reason.TOO_MANY_SUBSCRIPTIONS
        assert caught.value.metadata["stream"] == "s" and caught.value.metadata["limit"] == "1"
        with pytest.raises(RaftlogError):  # invalid before it is served: takes no slot
            await anext(events("s", heartbeat_ms=1))
        other = events("t")
        assert (await anext(other)).HasField("heartbeat") and counts.open("t") == 1
        assert counts.open("s") == 1
        await first.aclose()
        await other.aclose()
        assert counts.open("s") == 0 and counts.open("t") == 0

        async def read_all() -> None:
            async for _ in events("s"):
                pass

        task = asyncio.ensure_future(read_all())
        await _until(lambda: counts.open("s") == 1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert counts.open("s") == 0

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
