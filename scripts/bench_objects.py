"""Benchmark of raftlog's object store beside the NATS object store, in one run, both on 3 local
nodes with replicas 3: sequential puts, then gets, of 20 objects of 1 MiB and of one of 64 MiB,
one call at a time from one client, with the same chunk size on both sides (512 KiB). MiB/s.

    raftlog   a local 3-node cluster (node/cli/localcluster.py) on free loopback ports; the
              bucket `bench`; the client streams each object (PutStream, GetStream) to and
              from the bucket stream's primary, hashing it as nats-py does (SHA-256 sent on
              put, checked on get)
    NATS      3 nats-server nodes with JetStream, configured as ../shared/peers/jetstream/run
              configures them (bench_kv.NatsCluster); nats-py's object store client
              (scripts/bench_objects_nats.py, run by a venv with nats-py) talks to the node that
              leads the store's stream

Ratios raftlog/NATS and a table go to stderr, ONE JSON document to stdout. Servers started
here are stopped by pid; the NATS client is bounded in time.

    scripts/bench-objects                 20 x 1 MiB and 1 x 64 MiB each side
    scripts/bench-objects --no-peer       raftlog only
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from bench import BenchCluster  # scripts/ is sys.path[0]
from bench_kv import ratios, run_nats_client

from raftlog.node.cli.client import Client
from raftlog.v1 import cluster_pb2, cluster_pb2_grpc, objects_pb2, objects_pb2_grpc

ROOT = Path(os.environ.get("RAFTLOG_ROOT") or Path(__file__).resolve().parents[1])
SCHEMA = "raftlog-bench-objects/1"
BUCKET = "bench"
MiB = 2**20
small_count = 20
small_bytes = MiB
large_bytes = 64 * MiB
chunk_bytes = 512 * 1024
call_timeout_s = 120.0
ready_timeout_s = 30.0
nats_client_timeout_s = 600.0
nats_home_default = Path(tempfile.gettempdir()) / "raftlog-bench-objects-nats"
nats_base_port_default = 15_320  # clients +1..3, routes +2001..3, monitoring +4001..3


def _log(text: str) -> None:
    print(f"[bench-objects] {text}", file=sys.stderr, flush=True)


def _phase(name: str, count: int, size: int, elapsed_s: float) -> dict[str, Any]:
    return {"phase": name, "objects": count, "object_bytes": size,
            "elapsed_s": round(elapsed_s, 3),
            "mib_per_s": round(count * size / elapsed_s / MiB, 1) if elapsed_s else 0.0}


# ---------------------------------------------------------------------------------------------
# raftlog.


async def _make_bucket(address: str) -> str:
    """Creates the bucket (retried while the cluster settles); the primary's address."""
    async with Client(address, timeout_s=call_timeout_s) as client:
        objects: Any = objects_pb2_grpc.ObjectsStub(client.channel)  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + ready_timeout_s
        while True:
            try:
                await objects.CreateBucket(objects_pb2.CreateBucketRequest(
                    config=objects_pb2.BucketConfig(name=BUCKET, replicas=3)),
                    timeout=call_timeout_s)
                await objects.Put(objects_pb2.PutObjectRequest(
                    bucket=BUCKET, name="ready", payload=b"x"), timeout=call_timeout_s)
                break
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        cluster: Any = cluster_pb2_grpc.ClusterStub(client.channel)  # type: ignore[no-untyped-call]
        route = await cluster.ExplainRoute(cluster_pb2.ExplainRouteRequest(
            stream=f"OBJ_{BUCKET}"), timeout=call_timeout_s)
        return str(route.primary_grpc_address)


async def _frames(name: str, data: bytes) -> AsyncIterator[objects_pb2.PutObjectFrame]:
    yield objects_pb2.PutObjectFrame(start=objects_pb2.PutObjectStart(
        bucket=BUCKET, name=name, chunk_size=chunk_bytes))
    hasher = hashlib.sha256()
    for offset in range(0, len(data), chunk_bytes):
        piece = data[offset:offset + chunk_bytes]
        hasher.update(piece)
        yield objects_pb2.PutObjectFrame(data=piece)
    yield objects_pb2.PutObjectFrame(finish=objects_pb2.PutObjectFinish(
        sha256=hasher.hexdigest()))


async def _get(objects: Any, name: str) -> bytes:
    parts: list[bytes] = []
    expected = ""
    hasher = hashlib.sha256()
    async for frame in objects.GetStream(objects_pb2.GetObjectRequest(bucket=BUCKET, name=name),
                                         timeout=call_timeout_s):
        if frame.WhichOneof("frame") == "info":
            expected = frame.info.sha256
        else:
            hasher.update(frame.data)
            parts.append(frame.data)
    if hasher.hexdigest() != expected:
        raise RuntimeError(f"get {name}: the content does not hash to its sha256")
    return b"".join(parts)


async def _raftlog_phases(address: str) -> list[dict[str, Any]]:
    small = [os.urandom(small_bytes) for _ in range(small_count)]
    large = os.urandom(large_bytes)
    async with Client(address, timeout_s=call_timeout_s) as client:
        objects: Any = objects_pb2_grpc.ObjectsStub(client.channel)  # type: ignore[no-untyped-call]
        await objects.PutStream(_frames("warmup", small[0]), timeout=call_timeout_s)
        results = []
        for label, batch in ((f"{small_count}x{small_bytes >> 20}MiB", small),
                             (f"1x{large_bytes >> 20}MiB", [large])):
            started = time.perf_counter()
            for n, data in enumerate(batch):
                await objects.PutStream(_frames(f"{label}-{n}", data), timeout=call_timeout_s)
            results.append(_phase(f"put {label}", len(batch), len(batch[0]),
                                  time.perf_counter() - started))
            started = time.perf_counter()
            for n, data in enumerate(batch):
                if await _get(objects, f"{label}-{n}") != data:
                    raise RuntimeError(f"get {label}-{n}: wrong content")
            results.append(_phase(f"get {label}", len(batch), len(batch[0]),
                                  time.perf_counter() - started))
            for phase in results[-2:]:
                _log(f"raftlog {phase['phase']:<16} {phase['mib_per_s']:>7.1f} MiB/s")
        return results


def run_raftlog(workdir: Path) -> dict[str, Any]:
    cluster = BenchCluster(workdir, nodes=3)
    _log(f"starting a 3-node raftlog cluster from {cluster.address}")
    cluster.start()
    try:
        primary = asyncio.run(_make_bucket(cluster.address))
        _log(f"bucket {BUCKET} (R3) has its primary at {primary}")
        return {"client": primary, "chunk_bytes": chunk_bytes,
                "phases": asyncio.run(_raftlog_phases(primary))}
    finally:
        cluster.stop()
        _log("raftlog cluster stopped")


# ---------------------------------------------------------------------------------------------
# NATS.


def run_nats(home: Path, *, base_port: int) -> dict[str, Any]:
    result = run_nats_client(home, base_port=base_port, args=[
        str(ROOT / "scripts" / "bench_objects_nats.py"), "--small-count", str(small_count),
        "--small-bytes", str(small_bytes), "--large-bytes", str(large_bytes),
        "--chunk-bytes", str(chunk_bytes)], timeout_s=nats_client_timeout_s)
    for phase in result.get("phases", []):
        _log(f"NATS    {phase['phase']:<16} {phase['mib_per_s']:>7.1f} MiB/s")
    return result


# ---------------------------------------------------------------------------------------------
# Report.


def table(document: dict[str, Any]) -> str:
    nats = document["nats"] or {}
    theirs = {phase["phase"]: phase for phase in nats.get("phases", [])}
    lines = [f"{'phase':<16} {'raftlog MiB/s':>14} {'NATS MiB/s':>11} {'ratio':>6}"]
    for phase in document["raftlog"]["phases"]:
        other = theirs.get(phase["phase"], {})
        ratio = document["ratios"].get(phase["phase"])
        lines.append(f"{phase['phase']:<16} {phase['mib_per_s']:>14.1f} "
                     f"{other.get('mib_per_s', 0):>11.1f} "
                     f"{'-' if ratio is None else f'{ratio:.2f}':>6}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench-objects", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-peer", action="store_true", help="skip NATS")
    parser.add_argument("--nats-home", type=Path, default=nats_home_default,
                        help=f"the NATS side's work directory (default {nats_home_default})")
    parser.add_argument("--nats-base-port", type=int, default=nats_base_port_default)
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="raftlog-bench-objects-") as workdir:
        raftlog = run_raftlog(Path(workdir))
    nats = None if args.no_peer else run_nats(args.nats_home, base_port=args.nats_base_port)
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "meta": {"small_objects": small_count, "small_bytes": small_bytes,
                 "large_bytes": large_bytes, "chunk_bytes": chunk_bytes, "replicas": 3,
                 "clients": 1, "in_flight": 1, "python": platform.python_version(),
                 "grpcio": grpc.__version__, "cpus": os.cpu_count(),
                 "duration_s": round(time.monotonic() - started, 1)},
        "raftlog": raftlog,
        "nats": nats,
        "ratios": ratios(raftlog, nats, key="mib_per_s"),
    }
    print(table(document), file=sys.stderr)
    if nats and "error" in nats:
        _log(f"FAILED NATS: {nats['error']}")
    print(json.dumps(document, indent=2))
    return 1 if nats and "error" in nats else 0


if __name__ == "__main__":
    raise SystemExit(main())
