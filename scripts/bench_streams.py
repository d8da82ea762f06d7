"""Many-streams benchmark (issue 10, item 11): thousands of R3 streams on a 3-node cluster.

    1. create --streams R3 streams (default 10,000) at a steady rate with --concurrency
       CreateStream calls in flight (default 32), through all three nodes; the seconds each
       block of 1,000 took (the cost must not grow with the count);
    2. idle for --idle-s seconds: CPU each node uses (and per stream), RSS each node holds (and
       per stream);
    3. every stream takes one publish (each must be acknowledged);
    4. Raft elections (the rise of the Raft term) and failovers (the rise of the fence epochs)
       during 1-3: target none;
    5. kill -9 of one node that is not the Raft leader: the time until every stream it led
       (about a third) takes writes again, and the count of streams writable afterwards.

A table goes to stderr, ONE JSON document to stdout; the cluster is stopped by pid at the end.

    scripts/bench-streams                    10,000 streams (about 10-20 minutes)
    scripts/bench-streams --streams 1000     a smaller run
    scripts/bench-streams --tls              the same over TLS (compare with a plain run)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import grpc

from raftlog.chaos import procstat
from raftlog.chaos.cluster import LocalCluster
from raftlog.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    streams_pb2,
    streams_pb2_grpc,
    types_pb2,
)

ROOT = Path(os.environ.get("RAFTLOG_ROOT") or Path(__file__).resolve().parents[1])

SCHEMA = "raftlog-bench-streams/1"
block = 1_000
call_timeout_s = 30.0
publish_timeout_s = 5.0
failover_timeout_s = 60.0
cpu_sample_s = 1.0
ready_timeout_s = 120.0
attempts_max = 50  # one create or publish, retried on UNAVAILABLE


def _log(text: str) -> None:
    print(f"[bench-streams] {text}", file=sys.stderr, flush=True)


class Nodes:
    """grpc.aio stubs of the cluster's nodes."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.indexes = sorted(cluster.running)
        self.channels = {i: (grpc.aio.secure_channel(cluster.address(i),
                                                     cluster.tls_credentials())
                             if cluster.tls else grpc.aio.insecure_channel(cluster.address(i)))
                         for i in self.indexes}

    def streams(self, i: int) -> Any:
        return streams_pb2_grpc.StreamsStub(self.channels[i])  # type: ignore[no-untyped-call]

    def cluster(self, i: int) -> Any:
        return cluster_pb2_grpc.ClusterStub(self.channels[i])  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close(None)


async def _retrying(call: Callable[[], Awaitable[Any]]) -> Any:
    for attempt in range(attempts_max):
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAVAILABLE,
                                  grpc.StatusCode.DEADLINE_EXCEEDED) \
                    or attempt == attempts_max - 1:
                raise
            await asyncio.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


async def _in_parallel(count: int, concurrency: int, job: Callable[[int], Awaitable[None]],
                       *, on_done: Callable[[int], None] | None = None) -> None:
    next_index = 0
    done = 0

    async def worker() -> None:
        nonlocal next_index, done
        while next_index < count:
            index = next_index
            next_index += 1
            await job(index)
            done += 1
            if on_done is not None:
                on_done(done)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def _name(k: int) -> str:
    return f"many-{k:05d}"


async def create_all(cluster: LocalCluster, count: int, concurrency: int
                     ) -> list[dict[str, float]]:
    nodes = Nodes(cluster)
    blocks: list[dict[str, float]] = []
    started = time.monotonic()
    block_started = [started]
    pids = {i: cluster.node(i).pid for i in nodes.indexes}
    cpu0 = {i: procstat.cpu_s(pid) for i, pid in pids.items()}

    def on_done(done: int) -> None:
        if done % block == 0 or done == count:
            now = time.monotonic()
            cpu = {i: procstat.cpu_s(pid) for i, pid in pids.items()}
            blocks.append({"up_to": done, "seconds": round(now - block_started[0], 2),
                           "cpu_s": round(sum(cpu[i] - cpu0[i] for i in cpu), 1),
                           "rss_mib": round(sum(procstat.rss_mib(p) for p in pids.values()), 0)})
            cpu0.update(cpu)
            _log(f"created {done} streams; last block {blocks[-1]}")
            block_started[0] = now

    async def create(k: int) -> None:
        via = nodes.indexes[k % len(nodes.indexes)]
        request = streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(
            name=_name(k), replicas=3, subjects=[f"{_name(k)}.>"]))
        await _retrying(lambda: nodes.streams(via).CreateStream(request,
                                                                timeout=call_timeout_s))

    try:
        await _in_parallel(count, concurrency, create, on_done=on_done)
    finally:
        await nodes.close()
    return blocks


async def publish_all(cluster: LocalCluster, names: list[str], concurrency: int
                      ) -> tuple[int, list[str]]:
    """One publish to every stream; (acknowledged, failures)."""
    nodes = Nodes(cluster)
    acked = 0
    failures: list[str] = []

    async def publish(k: int) -> None:
        nonlocal acked
        name = names[k]
        via = nodes.indexes[k % len(nodes.indexes)]
        request = streams_pb2.PublishRequest(stream=name, subject=f"{name}.x", payload=b"p",
                                             msg_id=f"{name}-1")
        try:
            await _retrying(lambda: nodes.streams(via).Publish(request,
                                                               timeout=publish_timeout_s))
            acked += 1
        except grpc.aio.AioRpcError as exc:
            failures.append(f"{name}: {exc.code().name} {exc.details()}")

    try:
        await _in_parallel(len(names), concurrency, publish)
    finally:
        await nodes.close()
    return acked, failures


async def routes(cluster: LocalCluster, names: list[str], concurrency: int
                 ) -> dict[str, cluster_pb2.RouteExplanation]:
    nodes = Nodes(cluster)
    found: dict[str, cluster_pb2.RouteExplanation] = {}

    async def explain(k: int) -> None:
        via = nodes.indexes[k % len(nodes.indexes)]
        found[names[k]] = await _retrying(lambda: nodes.cluster(via).ExplainRoute(
            cluster_pb2.ExplainRouteRequest(stream=names[k]), timeout=call_timeout_s))

    try:
        await _in_parallel(len(names), concurrency, explain)
    finally:
        await nodes.close()
    return found


def idle(cluster: LocalCluster, seconds: float, streams: int) -> dict[str, Any]:
    pids = {cluster.node(i).node_id: cluster.node(i).pid for i in sorted(cluster.running)}
    cpu0 = {n: procstat.cpu_s(p) for n, p in pids.items()}
    time.sleep(seconds)
    cpu = {n: round((procstat.cpu_s(p) - cpu0[n]) / seconds, 3) for n, p in pids.items()}
    rss = {n: round(procstat.rss_mib(p), 1) for n, p in pids.items()}
    return {"seconds": seconds, "cpu_cores": cpu, "rss_mib": rss,
            "cpu_core_per_1000_streams": round(sum(cpu.values()) / 3 / streams * 1000, 4),
            "rss_kib_per_stream_copy": round(sum(rss.values()) * 1024 / (3 * streams), 1)}


async def until_writable(cluster: LocalCluster, names: list[str], *, since: float,
                         concurrency: int) -> tuple[float, int, list[str]]:
    """Publishes to each stream until acknowledged; (seconds until the last one, count,
    failures)."""
    nodes = Nodes(cluster)
    last = [0.0]
    ok = 0
    failures: list[str] = []
    deadline = since + failover_timeout_s

    async def probe(k: int) -> None:
        nonlocal ok
        name = names[k]
        request = streams_pb2.PublishRequest(stream=name, subject=f"{name}.x", payload=b"f",
                                             msg_id=f"{name}-after")
        attempt = 0
        while time.monotonic() < deadline:
            via = nodes.indexes[(k + attempt) % len(nodes.indexes)]
            attempt += 1
            try:
                await nodes.streams(via).Publish(request, timeout=publish_timeout_s)
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.05)
                continue
            ok += 1
            last[0] = max(last[0], time.monotonic() - since)
            return
        failures.append(name)

    try:
        await _in_parallel(len(names), concurrency, probe)
    finally:
        await nodes.close()
    return last[0], ok, failures


def run(streams: int, concurrency: int, idle_s: float, *, tls: bool = False
        ) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="raftlog-bench-streams-") as workdir:
        return run_in(Path(workdir), streams, concurrency, idle_s, tls=tls)


def run_in(workdir: Path, streams: int, concurrency: int, idle_s: float, *,
           tls: bool = False) -> dict[str, Any]:
    """The whole benchmark with the cluster's data under WORKDIR (the tests use it too).
    `tls`: the cluster serves TLS (as `raftlog cluster up --tls`), the client connects so."""
    document: dict[str, Any] = {"schema": SCHEMA, "meta": {
        "streams": streams, "concurrency": concurrency, "idle_s": idle_s,
        "nproc": os.cpu_count(), "tls": tls}}
    names = [_name(k) for k in range(streams)]
    cluster = LocalCluster(workdir / "cluster", nodes=3, tls=tls)
    try:
        cluster.start_all(timeout_s=ready_timeout_s)
        term0 = max(cluster.raft_terms(), default=0)
        started = time.monotonic()
        blocks = asyncio.run(create_all(cluster, streams, concurrency))
        created_s = time.monotonic() - started
        document["create"] = {"seconds": round(created_s, 1),
                              "streams_per_s": round(streams / created_s, 1),
                              "blocks": blocks}
        epochs0 = asyncio.run(routes(cluster, names, concurrency))
        document["idle"] = idle(cluster, idle_s, streams)
        _log(f"idle: {document['idle']}")
        acked, failures = asyncio.run(publish_all(cluster, names, concurrency))
        epochs1 = asyncio.run(routes(cluster, names, concurrency))
        term1 = max(cluster.raft_terms(), default=0)
        document["writable"] = {"acked": acked, "of": streams, "failures": failures[:10]}
        document["stable"] = {
            "elections": term1 - term0,
            "failovers": sum(epochs1[n].fence_epoch - epochs0[n].fence_epoch
                             for n in names),
            "epochs_during_create": sum(epochs0[n].fence_epoch - 1 for n in names)}
        _log(f"writable {acked}/{streams}; stability {document['stable']}")
        leader = cluster.leader_id()
        victim = next(i for i in sorted(cluster.running)
                      if cluster.node(i).node_id != leader)
        victim_id = cluster.node(victim).node_id
        led = [n for n in names if epochs1[n].primary == victim_id]
        killed_at = time.monotonic()
        cluster.kill9(victim)
        took, ok, lost = asyncio.run(until_writable(cluster, led, since=killed_at,
                                                    concurrency=concurrency))
        document["failover"] = {"killed": victim_id, "streams_led": len(led),
                                "writable_again": ok, "seconds_until_all": round(took, 2),
                                "not_writable": lost[:10]}
        _log(f"kill -9 {victim_id}: {ok}/{len(led)} of its streams writable again, the "
             f"last after {took:.2f} s")
    except BaseException:
        for i in sorted(cluster.nodes):
            _log(f"n{i} log tail:\n{cluster.log_tail(i)}")
        raise
    finally:
        cluster.stop_all()
    return document


def table(document: dict[str, Any]) -> str:
    create, idle_, fo = document["create"], document["idle"], document["failover"]
    lines = ["", f"raftlog with {document['meta']['streams']} R3 streams on 3 nodes",
             f"create: {create['streams_per_s']} streams/s over {create['seconds']} s; seconds "
             f"per block of {block}: {[b['seconds'] for b in create['blocks']]}",
             f"idle: CPU cores per node {idle_['cpu_cores']}, RSS MiB {idle_['rss_mib']} "
             f"({idle_['rss_kib_per_stream_copy']} KiB per stream copy)",
             f"writable: {document['writable']['acked']} of {document['meta']['streams']}; "
             f"elections {document['stable']['elections']}, failovers "
             f"{document['stable']['failovers']}",
             f"kill -9 of {fo['killed']}: {fo['writable_again']} of its {fo['streams_led']} "
             f"streams writable again, all within {fo['seconds_until_all']} s"]
    return "\n".join(lines)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench-streams", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--tls", action="store_true",
                        help="every port TLS (mutual on the peer listeners; docs/tls.md)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    document = run(args.streams, args.concurrency, args.idle_s, tls=args.tls)
    print(table(document), file=sys.stderr)
    print(json.dumps(document, indent=2))
    bad = (document["writable"]["acked"] < args.streams
           or document["failover"]["writable_again"] < document["failover"]["streams_led"])
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
