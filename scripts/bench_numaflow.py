"""The Numaflow phase of scripts/bench_frontends.py: starts `raftlog numaflow-source` (the
sidecar, on a Unix socket, talking to the stream's primary first) and drives it with pynumaflow's
own stubs, the way numa does: ReadFn of 1 and of a batch, each read's offsets acked with AckFn.

`run` raises ImportError without pynumaflow (bench_frontends reports the phase as skipped).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from raftlog.base import children

sidecar_start_timeout_s = 20.0
sidecar_stop_timeout_s = 10.0
SERVER_INFO_END = "U+005C__END__"  # the last line numa waits for in the server-info file


@dataclass(frozen=True)
class Setup:
    """The stream and consumer the sidecar serves (filled by the caller), and the bounds."""

    stream: str
    consumer: str
    messages: int
    batch: int
    workdir: Path  # the sidecar's log goes here
    servers: list[str]  # the stream's primary first
    call_timeout_s: float
    consume_timeout_s: float


Summarize = Callable[[list[float], int, float], dict[str, Any]]


def run(setup: Setup, *, summarize: Summarize, log: Callable[[str], None]) -> dict[str, Any]:
    """The phases' figures, by phase name; the sidecar is stopped (by its pid) afterwards."""
    pb: Any = __import__("pynumaflow.proto.sourcer.source_pb2", fromlist=["x"])
    pb_grpc: Any = __import__("pynumaflow.proto.sourcer.source_pb2_grpc", fromlist=["x"])
    sockets = Path(tempfile.mkdtemp(prefix="rlbf-", dir="/tmp"))  # socket paths are short
    socket, info = sockets / "nf.sock", sockets / "nf-server-info"
    log_path = setup.workdir / "numaflow-source.log"
    output = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "raftlog.node.cli", "numaflow-source", "--stream", setup.stream,
         "--consumer", setup.consumer, "--socket", str(socket), "--server-info", str(info),
         "--server", ",".join(setup.servers)], stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + sidecar_start_timeout_s
        while not (info.exists() and info.read_text().endswith(SERVER_INFO_END)):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the numaflow-source sidecar did not start; log in {log_path}")
            time.sleep(0.05)
        log(f"numaflow-source sidecar pid {process.pid} on {socket}")
        return asyncio.run(_phases(setup, pb, pb_grpc, f"unix://{socket}", summarize, log))
    finally:
        children.end(process, timeout_s=sidecar_stop_timeout_s)
        output.close()
        for leftover in (socket, info):
            leftover.unlink(missing_ok=True)
        sockets.rmdir()


async def _phases(setup: Setup, pb: Any, pb_grpc: Any, target: str, summarize: Summarize,
                  log: Callable[[str], None]) -> dict[str, Any]:
    out = {}
    n = setup.messages
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.SourceStub(channel)
        reads, acks = stub.ReadFn(), stub.AckFn()
        await reads.write(pb.ReadRequest(handshake=pb.Handshake(sot=True)))
        await reads.read()
        await acks.write(pb.AckRequest(handshake=pb.Handshake(sot=True)))
        await acks.read()
        for phase, batch in (("consume unary", 1), ("consume batch", setup.batch)):
            latencies: list[float] = []
            got = 0
            started = time.perf_counter()
            deadline = time.monotonic() + setup.consume_timeout_s
            while got < n:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"numaflow: read {got} of {n}")
                at = time.perf_counter()
                await reads.write(pb.ReadRequest(request=pb.ReadRequest.Request(
                    num_records=min(batch, n - got), timeout_in_ms=1000)))
                offsets = []
                while True:
                    answer = await asyncio.wait_for(reads.read(), setup.call_timeout_s)
                    if answer is grpc.aio.EOF:
                        raise RuntimeError("numaflow: the read stream ended")
                    if answer.status.eot:
                        break
                    offsets.append(answer.result.offset)
                if offsets:
                    await acks.write(pb.AckRequest(request=pb.AckRequest.Request(
                        offsets=offsets)))
                    acked = await asyncio.wait_for(acks.read(), setup.call_timeout_s)
                    if not acked.result.HasField("success"):
                        raise RuntimeError(f"numaflow ack: {acked}")
                latencies.append(time.perf_counter() - at)
                got += len(offsets)
            out[phase] = summarize(latencies, got, time.perf_counter() - started)
            log(f"{'Numaflow':<12} {phase:<15} {out[phase]['msgs_per_s']:>9,.0f} msgs/s  "
                f"p50 {out[phase]['p50_ms']:.3f} ms")
        await reads.done_writing()
        await acks.done_writing()
    return out
