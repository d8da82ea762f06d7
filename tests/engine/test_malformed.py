"""The malformed-request guard (node/transport/malformed.py) on an in-process grpc.aio server: each
call shape answers unparseable bytes with INVALID_ARGUMENT / MALFORMED_REQUEST, no handler sees the
bad request, and nothing is logged with a traceback. Multi-process tests against a real node are in
tests/process/test_bad_input.py."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from raftlog.base.errors import Reason
from raftlog.node.transport import rpc
from raftlog.node.transport.malformed import MalformedRequestInterceptor
from raftlog.v1 import streams_pb2

call_timeout_s = 5.0
# Field 1 (subject, a string) holding bytes that are not UTF-8: no protobuf parser accepts it.
GARBAGE = b"\x0a\x02\xff\xfe"
GOOD = streams_pb2.PublishRequest(subject="a.b", stream="s").SerializeToString()
SERVICE = "test.Echo"


class Recorder:
    """What the handlers saw."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def unary(self, request: Any, context: Any) -> bytes:
        self.requests.append(request)
        return b""

    async def server_stream(self, request: Any, context: Any) -> AsyncIterator[bytes]:
        self.requests.append(request)
        yield b""

    async def client_stream(self, requests: AsyncIterator[Any], context: Any) -> bytes:
        async for request in requests:
            self.requests.append(request)
        return b""

    async def bidi(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            self.requests.append(request)
            yield b""


    async def bidi_read_aside(self, requests: AsyncIterator[Any], context: Any, *,
                              swallow: bool) -> AsyncIterator[bytes]:
        """Reads in a task of its own and answers from the handler task, as PublishFrames
        does. The reader's error goes no further than the reader when `swallow` (Telemetry's
        way); else the handler raises it when it awaits the reader (PublishFrames' way)."""
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def read() -> None:
            try:
                async for request in requests:
                    self.requests.append(request)
                    queue.put_nowait(request)
            except Exception:
                if not swallow:
                    raise
            finally:
                queue.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while await queue.get() is not None:
                yield b"answer"
        finally:
            await reader


def _handlers(recorder: Recorder) -> grpc.GenericRpcHandler:
    parse = streams_pb2.PublishRequest.FromString
    return grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(recorder.unary, request_deserializer=parse),
        "ServerStream": grpc.unary_stream_rpc_method_handler(recorder.server_stream,
                                                             request_deserializer=parse),
        "ClientStream": grpc.stream_unary_rpc_method_handler(recorder.client_stream,
                                                             request_deserializer=parse),
        "Bidi": grpc.stream_stream_rpc_method_handler(recorder.bidi, request_deserializer=parse),
        "BidiAside": grpc.stream_stream_rpc_method_handler(
            functools.partial(recorder.bidi_read_aside, swallow=True),
            request_deserializer=parse),
        "BidiAsideRaising": grpc.stream_stream_rpc_method_handler(
            functools.partial(recorder.bidi_read_aside, swallow=False),
            request_deserializer=parse),
    })


async def _serve(recorder: Recorder, body: Callable[[grpc.aio.Channel], Awaitable[None]],
                 *, guarded: bool = True) -> None:
    interceptors = [MalformedRequestInterceptor()] if guarded else []
    server = grpc.aio.server(interceptors=interceptors)
    server.add_generic_rpc_handlers((_handlers(recorder),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await body(channel)
    finally:
        await server.stop(None)


def _expect_malformed(err: grpc.aio.AioRpcError) -> None:
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    parsed = rpc.from_rpc_error(err)
    assert parsed is not None and parsed.reason is Reason.MALFORMED_REQUEST, err


async def _call(channel: grpc.aio.Channel, shape: str, frames: list[bytes]) -> None:
    path = f"/{SERVICE}/{shape}"
    if shape == "Unary":
        await channel.unary_unary(path)(frames[0], timeout=call_timeout_s)
    elif shape == "ServerStream":
        async for _ in channel.unary_stream(path)(frames[0], timeout=call_timeout_s):
            pass
    elif shape == "ClientStream":
        await channel.stream_unary(path)(iter(frames), timeout=call_timeout_s)
    else:
        async for _ in channel.stream_stream(path)(iter(frames), timeout=call_timeout_s):
            pass


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout=30))  # type: ignore[arg-type]


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """Records with a traceback, less grpc's poller noise from an earlier test's loop.

    grpc.aio's completion-queue poller is one per process; each test runs its own event
    loop, and a poll that completes after an earlier loop closed is logged by asyncio as
    "Event loop is closed". That is about the earlier loop, not the call under test.
    """
    return [r for r in caplog.records if r.exc_info and not _closed_loop_noise(r)]


def _closed_loop_noise(record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return (record.name == "asyncio" and isinstance(error, RuntimeError)
            and str(error) == "Event loop is closed")


@pytest.mark.parametrize("shape", ["Unary", "ServerStream", "ClientStream", "Bidi"])
def test_unparseable_bytes_get_invalid_argument_and_reach_no_handler(
        shape: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    recorder = Recorder()

    async def body(channel: grpc.aio.Channel) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _call(channel, shape, [GARBAGE])
        _expect_malformed(caught.value)

    run(_serve(recorder, body))
    assert recorder.requests == []
    assert not _tracebacks(caplog), caplog.text
    assert "malformed request to /test.Echo/" + shape in caplog.text


@pytest.mark.parametrize("shape", ["ClientStream", "Bidi"])
def test_a_bad_frame_mid_stream_ends_the_call_where_it_is(
        shape: str, caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()

    async def body(channel: grpc.aio.Channel) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _call(channel, shape, [GOOD, GOOD, GARBAGE, GOOD])
        _expect_malformed(caught.value)

    run(_serve(recorder, body))
    assert [r.subject for r in recorder.requests] == ["a.b", "a.b"]
    assert not _tracebacks(caplog), caplog.text


@pytest.mark.parametrize("shape", ["BidiAside", "BidiAsideRaising"])
def test_a_bad_frame_read_by_a_task_of_the_servicer_is_refused_from_the_handler(
        shape: str, caplog: pytest.LogCaptureFixture) -> None:
    """Whether the servicer swallows the reader's error or raises it, the call ends with
    MALFORMED_REQUEST; the answers to the good frames may come first."""
    recorder = Recorder()
    repeats = 50

    async def body(channel: grpc.aio.Channel) -> None:
        for _ in range(repeats):
            answers: list[bytes] = []
            call = channel.stream_stream(f"/{SERVICE}/{shape}")(
                iter([GOOD, GOOD, GARBAGE, GOOD]), timeout=call_timeout_s)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for answer in call:
                    answers.append(answer)
            _expect_malformed(caught.value)
            assert len(answers) <= 2, answers

    run(_serve(recorder, body))
    assert [r.subject for r in recorder.requests] == ["a.b", "a.b"] * repeats
    assert not _tracebacks(caplog), caplog.text


@pytest.mark.parametrize("shape", ["Unary", "ServerStream", "ClientStream", "Bidi"])
def test_good_requests_pass_through(shape: str) -> None:
    recorder = Recorder()

    async def body(channel: grpc.aio.Channel) -> None:
        await _call(channel, shape, [GOOD, GOOD])

    run(_serve(recorder, body))
    assert recorder.requests and all(r.stream == "s" for r in recorder.requests)


def test_without_the_guard_grpc_answers_unknown_with_a_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    """What the guard replaces (shows the tests above can fail)."""
    caplog.set_level(logging.WARNING)

    async def body(channel: grpc.aio.Channel) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _call(channel, "Unary", [GARBAGE])
        assert caught.value.code() == grpc.StatusCode.UNKNOWN

    run(_serve(Recorder(), body, guarded=False))
    assert _tracebacks(caplog)


def test_a_sync_not_implemented_method_is_guarded_and_answers_unimplemented_quietly(
        caplog: pytest.LogCaptureFixture) -> None:
    """Like a generated servicer base class's method (e.g. grpc.health.v1.Health/List)."""
    caplog.set_level(logging.WARNING)

    def not_implemented(request: Any, context: Any) -> bytes:
        raise NotImplementedError("Method not implemented!")

    async def body(channel: grpc.aio.Channel) -> None:
        for request, code in ((GARBAGE, grpc.StatusCode.INVALID_ARGUMENT),
                              (GOOD, grpc.StatusCode.UNIMPLEMENTED)):
            for call in (channel.unary_unary(f"/{SERVICE}/SyncUnary")(request),
                         _drain(channel.unary_stream(f"/{SERVICE}/SyncStream")(request))):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call
                assert caught.value.code() == code

    async def serve() -> None:
        server = grpc.aio.server(interceptors=[MalformedRequestInterceptor()])
        parse = streams_pb2.PublishRequest.FromString
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
            "SyncUnary": grpc.unary_unary_rpc_method_handler(not_implemented,
                                                             request_deserializer=parse),
            "SyncStream": grpc.unary_stream_rpc_method_handler(not_implemented,
                                                               request_deserializer=parse),
        }),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                await body(channel)
        finally:
            await server.stop(None)

    run(serve())
    assert not _tracebacks(caplog), caplog.text


async def _drain(call: Any) -> None:
    async for _ in call:
        pass
