"""transport/servers.py: a node's grpc.aio server takes each call through one pending request
call, not through an `asyncio.wait` over one per method of every service it serves.

grpc's server code (Cython) calls `asyncio.wait` through the module, so the test sees every
call of it by replacing `asyncio.wait` for the time of the calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from raftlog.node.transport.servers import aio_server
from raftlog.v1 import streams_pb2, streams_pb2_grpc
from tests.async_tests import run_async

Context = grpc.aio.ServicerContext[Any, Any]
calls = 20


class Answers(streams_pb2_grpc.StreamsServicer):
    async def Publish(self, request: streams_pb2.PublishRequest,
                      context: Context) -> streams_pb2.PublishAck:
        return streams_pb2.PublishAck(stream=request.stream, seq=7)


async def waits_per_call(make: Callable[[], grpc.aio.Server],
                         monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Serves the Streams service (every method registered by the generated function) and
    makes `calls` Publish calls; the sizes of the `asyncio.wait`s made meanwhile."""
    server = make()
    streams_pb2_grpc.add_StreamsServicer_to_server(Answers(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    sizes: list[int] = []
    real_wait = asyncio.wait

    async def counted(fs: Any, *args: Any, **kwargs: Any) -> Any:
        fs = list(fs)
        sizes.append(len(fs))
        return await real_wait(fs, *args, **kwargs)

    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = streams_pb2_grpc.StreamsStub(channel)
            with monkeypatch.context() as patch:
                patch.setattr(asyncio, "wait", counted)
                for _ in range(calls):
                    ack = await stub.Publish(streams_pb2.PublishRequest(stream="s", subject="x"))
                    assert ack.seq == 7
    finally:
        await server.stop(grace=None)
    return sizes


@run_async
async def test_each_call_is_taken_without_a_wait_over_every_method(
        monkeypatch: pytest.MonkeyPatch) -> None:
    methods = len(streams_pb2.DESCRIPTOR.services_by_name["Streams"].methods)
    plain = await waits_per_call(grpc.aio.server, monkeypatch)
    assert plain and max(plain) >= methods, (
        f"positive control: this grpcio no longer waits on every registered method ({plain}); "
        "transport/servers.py may go")
    ours = await waits_per_call(aio_server, monkeypatch)
    assert len(ours) <= calls + 1 and max(ours, default=1) == 1, ours
