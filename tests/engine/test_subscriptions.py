"""Subscribe bounds without node processes: the subscription slots (node/transport/subscriptions.py)
on an in-process grpc.aio server with two slots (a call beyond them is refused with
TOO_MANY_SUBSCRIPTIONS before its handler runs, and a slot comes back however a call ends), and the
bytes cap a Subscribe passes to ConsumerManager.fetch. The multi-process version is in
tests/process/test_subscribe_bounds.py."""

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
from raftlog.node.transport import rpc
from raftlog.node.transport.subscriptions import SubscriptionLimitInterceptor, SubscriptionSlots
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
