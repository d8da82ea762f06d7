"""The floor under raftlog's figures on this machine (issue 17): what Python's grpc.aio costs by
itself, with no raftlog in it. A bare grpc.aio server in a process of its own on loopback
answers the shapes raftlog's phases use, with the same messages (a 128-byte PublishRequest in,
a PublishBatchResponse out), and does nothing else:

    unary, 1 caller             one call at a time: p50, calls/s
    unary, 8 callers            calls/s when the cores are the limit
    client-streaming            items/s of one call, one message per item, no answer per item
    bidi, answer per item       items/s, 16 items unanswered (a replication link's shape)

For each, the CPU spent per call or item in the client and in the server, in microseconds, and
the ceiling: every core of the machine divided by that CPU, what any server built on grpc.aio
(with a grpc.aio client) can do here at most, whatever it does per call. For comparison,
raftlog's R3 unary publish needs one unary call and two replication items per message, its
client-streaming phase one stream item per message.

    python scripts/bench_grpc_floor.py        the figures as JSON, a table on stderr (~20 s)
    python scripts/bench_grpc_floor.py serve  the bare server alone (prints "ready PORT")

`scripts/bench` runs it after raftlog's phases and prints it with them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from raftlog.base import children
from raftlog.chaos import procstat
from raftlog.node.cli.loadgen import percentile
from raftlog.v1 import streams_pb2

service = "bench.Floor"
payload_bytes = 128
phase_s = 4.0  # each shape runs this long
phase_quick_s = 0.5  # with scripts/bench --quick
callers_max = 8
bidi_window = 16  # items unanswered on the bidi call
server_start_timeout_s = 20.0
server_stop_timeout_s = 10.0

_request = streams_pb2.PublishRequest.FromString
_answer = streams_pb2.PublishBatchResponse.SerializeToString


async def _unary(request: streams_pb2.PublishRequest, context: Any
                 ) -> streams_pb2.PublishBatchResponse:
    return streams_pb2.PublishBatchResponse(stream=request.stream)


async def _client_stream(requests: AsyncIterator[streams_pb2.PublishRequest], context: Any
                         ) -> streams_pb2.PublishBatchResponse:
    count = 0
    async for _ in requests:
        count += 1
    return streams_pb2.PublishBatchResponse(failed=count)


async def _bidi(requests: AsyncIterator[streams_pb2.PublishRequest], context: Any
                ) -> AsyncIterator[streams_pb2.PublishBatchResponse]:
    async for request in requests:
        yield streams_pb2.PublishBatchResponse(stream=request.stream)


async def serve() -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {
        "Unary": grpc.unary_unary_rpc_method_handler(
            _unary, request_deserializer=_request, response_serializer=_answer),
        "ClientStream": grpc.stream_unary_rpc_method_handler(
            _client_stream, request_deserializer=_request, response_serializer=_answer),
        "Bidi": grpc.stream_stream_rpc_method_handler(
            _bidi, request_deserializer=_request, response_serializer=_answer),
    }),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"ready {port}", flush=True)
    await server.wait_for_termination()


def _message() -> streams_pb2.PublishRequest:
    return streams_pb2.PublishRequest(stream="floor", subject="floor.x",
                                      payload=b"x" * payload_bytes)


async def _unary_callers(channel: grpc.aio.Channel, callers: int, until: float) -> list[float]:
    call = channel.unary_unary(f"/{service}/Unary",
                               request_serializer=streams_pb2.PublishRequest.SerializeToString,
                               response_deserializer=streams_pb2.PublishBatchResponse.FromString)
    message, latencies = _message(), []

    async def caller() -> None:
        while time.monotonic() < until:
            started = time.perf_counter()
            await call(message)
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(caller() for _ in range(callers)))
    return latencies


async def _client_streaming(channel: grpc.aio.Channel, until: float) -> int:
    call = channel.stream_unary(f"/{service}/ClientStream",
                                request_serializer=streams_pb2.PublishRequest.SerializeToString,
                                response_deserializer=streams_pb2.PublishBatchResponse.FromString)
    message = _message()

    async def items() -> AsyncIterator[streams_pb2.PublishRequest]:
        while time.monotonic() < until:
            yield message

    answer = await call(items())
    return int(answer.failed)


async def _bidi_window(channel: grpc.aio.Channel, until: float) -> int:
    call = channel.stream_stream(f"/{service}/Bidi",
                                 request_serializer=streams_pb2.PublishRequest.SerializeToString,
                                 response_deserializer=streams_pb2.PublishBatchResponse.FromString
                                 )()
    message, room, answered = _message(), asyncio.Semaphore(bidi_window), 0

    async def read() -> None:
        nonlocal answered
        async for _ in call:
            answered += 1
            room.release()

    reader = asyncio.get_running_loop().create_task(read())
    while time.monotonic() < until:
        await room.acquire()
        await call.write(message)
    await call.done_writing()
    await reader
    return answered


async def _measure(server_pid: int, port: int, seconds: float) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await _unary_callers(channel, 1, time.monotonic() + 0.5)  # connected and warm

        async def shape(name: str, run: Callable[[float], Awaitable[int | list[float]]]) -> None:
            server_cpu_s, client_cpu_s = procstat.cpu_s(server_pid), time.process_time()
            started = time.monotonic()
            outcome = await run(started + seconds)
            elapsed_s = time.monotonic() - started
            count = len(outcome) if isinstance(outcome, list) else outcome
            client_us = 1e6 * (time.process_time() - client_cpu_s) / count
            server_us = 1e6 * (procstat.cpu_s(server_pid) - server_cpu_s) / count
            figure: dict[str, Any] = {
                "per_s": round(count / elapsed_s),
                "client_cpu_us": round(client_us),
                "server_cpu_us": round(server_us),
                # every core of the machine spent on nothing but these calls
                "ceiling_per_s": round((os.cpu_count() or 1) * 1e6 / (client_us + server_us)),
            }
            if isinstance(outcome, list):
                figure["p50_ms"] = round(1000 * percentile(outcome, 0.5), 3)
            figures[name] = figure

        await shape("unary_1", lambda until: _unary_callers(channel, 1, until))
        await shape(f"unary_{callers_max}",
                    lambda until: _unary_callers(channel, callers_max, until))
        await shape("client_streaming", lambda until: _client_streaming(channel, until))
        await shape("bidi_window", lambda until: _bidi_window(channel, until))
    return figures


def measure(*, seconds: float = phase_s) -> dict[str, Any]:
    """Starts the bare server on a free loopback port, measures every shape for `seconds`,
    stops the server (by its pid)."""
    server = subprocess.Popen([sys.executable, str(Path(__file__)), "serve"],
                              stdout=subprocess.PIPE, text=True)
    try:
        port = _wait_ready(server)
        if port is None:
            return {"error": "the bare grpc.aio server did not start"}
        return asyncio.run(_measure(server.pid, port, seconds))
    finally:
        children.end(server, timeout_s=server_stop_timeout_s)


def _wait_ready(server: subprocess.Popen[str]) -> int | None:
    """The server's port once it says it is ready; None when it ended first or took longer
    than server_start_timeout_s."""
    deadline = time.monotonic() + server_start_timeout_s
    if server.stdout is None:
        return None
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        if line.startswith("ready "):
            return int(line.split()[1])
        if not line and server.poll() is not None:
            return None
    return None


def table(figures: dict[str, Any]) -> str:
    """The floor's lines for the bench table."""
    if "error" in figures:
        return f"grpc.aio floor: {figures['error']}"
    lines = ["bare grpc.aio on this machine (no raftlog)  per second         CPU per call "
             "or item (client + server), and the most every core could do"]
    labels = {"unary_1": "unary, 1 caller", f"unary_{callers_max}": f"unary, {callers_max} callers",
              "client_streaming": "client-streaming item", "bidi_window":
              f"bidi item, {bidi_window} unanswered"}
    for key, label in labels.items():
        figure = figures[key]
        p50 = f", p50 {figure['p50_ms']:.3f} ms" if "p50_ms" in figure else ""
        lines.append(f"  {label:<28} {figure['per_s']:>9,}{p50:<16} "
                     f"{figure['client_cpu_us']} + {figure['server_cpu_us']} us, at most "
                     f"{figure['ceiling_per_s']:,}/s")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv == ["serve"]:
        asyncio.run(serve())
        return 0
    figures = measure()
    print(table(figures), file=sys.stderr)
    print(json.dumps(figures, indent=2))
    return 1 if "error" in figures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
