"""Scale benchmark (issue 17, item 4): throughput, CPU and memory of a 3-node cluster as the
number of R3 streams grows (default 1, 10, 100, 1,000), primaries on every node.

Each count N gets a FRESH local cluster (free loopback ports, a temp dir, stopped by pid at the
end) rather than the previous N's cluster with its streams deleted: deleted streams leave state
behind (RocksDB tombstones, heap a Python process does not hand back), which would inflate the
next N's memory figures and put compaction work into its CPU figures. Per N:

    1. RSS of each node before any stream exists;
    2. N R3 streams, names picked on the ring so the primaries spread evenly over the nodes,
       created concurrently (UNAVAILABLE retried); ExplainRoute then says where each primary is;
    3. --idle-s idle: CPU and RSS of each node; then one idle consumer per stream, RSS again.
       KiB per idle stream copy = (sum RSS after - before) / (3 N); KiB per idle consumer =
       (sum RSS with consumers - without) / N (all three nodes' share of it), for every N;
    4. timed publish: PublishBatch of --batch 128-byte messages, each call to one stream, sent to
       its primary (one grpc.aio channel per node), --inflight calls per node, for --seconds or
       --messages: msgs/s, call p50/p99 ms, CPU cores and RSS of each node;
    5. timed fetch(100)+ack on the consumers (--no-fetch skips it), --inflight rounds per node,
       until every stream is drained or the bounds: msgs/s, round p50/p99, CPU of each node.

"cores_busy" = the nodes' CPU / os.cpu_count(); "client_cores" = this process's own CPU, which
shares the machine. A phase stops at its first failed message and is reported failed with its
text. A table goes to stderr, ONE JSON document to stdout; exit status 1 when a phase failed.

    scripts/bench-scale                                   1, 10, 100, 1000 streams, 10 s phases
    scripts/bench-scale --streams 10,100 --seconds 5 --no-fetch
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import grpc

from raftlog.chaos import procstat
from raftlog.chaos.cluster import LocalCluster
from raftlog.node.cli.loadgen import percentile
from raftlog.node.cluster.ring import Ring
from raftlog.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    consumers_pb2,
    consumers_pb2_grpc,
    streams_pb2,
    streams_pb2_grpc,
    types_pb2,
)

SCHEMA = "raftlog-bench-scale/1"
payload_bytes = 128
fetch_batch = 100
consumer_name = "idle"
consumer_max_ack_pending = 10_000
setup_concurrency = 32  # CreateStream, CreateConsumer and ExplainRoute calls in flight
names_tried_per_stream_max = 4  # bound on the ring lookups while picking names: 4 N
call_timeout_s = 30.0
attempts_max = 50  # of one setup call
retry_pause_s = 0.05  # times the attempt number
ready_timeout_s = 120.0
retried_codes = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
settle_timeout_s = 20.0  # until every node has applied the metadata (before RSS is read)


@dataclass(frozen=True)
class Settings:
    batch: int = 100
    inflight: int = 8  # per node: PublishBatch calls, or fetch+ack rounds
    seconds: float = 10.0  # bound of each timed phase
    messages: int = 100_000_000  # bound of each timed phase
    fetch: bool = True
    idle_s: float = 3.0


@dataclass
class Tally:
    """One timed phase across all its workers; `claim` hands out messages until a bound."""

    left: int
    deadline: float
    msgs: int = 0
    calls: int = 0
    failed_msgs: int = 0
    first_error: str = ""
    latencies_ms: list[float] = field(default_factory=list)

    def claim(self, wanted: int) -> int:
        if self.first_error or time.monotonic() >= self.deadline:
            return 0
        granted = min(wanted, self.left)
        self.left -= granted
        return granted

    def fail(self, count: int, text: str) -> None:
        self.failed_msgs += count
        self.first_error = self.first_error or text


def _log(text: str) -> None:
    print(f"[bench-scale] {text}", file=sys.stderr, flush=True)


def _name(k: int) -> str:
    return f"scale-{k:06d}"


class Nodes:
    """One grpc.aio channel per node, and its stubs, by node id."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.channels = {cluster.node(i).node_id: grpc.aio.insecure_channel(cluster.address(i))
                         for i in sorted(cluster.running)}
        self.ids: list[str] = list(self.channels)
        self.streams: dict[str, Any] = {
            n: streams_pb2_grpc.StreamsStub(c) for n, c in self.channels.items()}
        self.consumers: dict[str, Any] = {
            n: consumers_pb2_grpc.ConsumersStub(c) for n, c in self.channels.items()}
        self.cluster: dict[str, Any] = {
            n: cluster_pb2_grpc.ClusterStub(c) for n, c in self.channels.items()}

    def via(self, k: int) -> str:
        """The nodes in turn, for calls any node answers."""
        return self.ids[k % len(self.ids)]

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close(None)


async def _all(calls: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Every setup call, `setup_concurrency` at a time, each retried on UNAVAILABLE and
    DEADLINE_EXCEEDED; ALREADY_EXISTS on a retry means the first attempt went through (None)."""
    slots = asyncio.Semaphore(setup_concurrency)

    async def one(call: Callable[[], Awaitable[Any]]) -> Any:
        async with slots:
            for attempt in range(attempts_max):
                try:
                    return await call()
                except grpc.aio.AioRpcError as exc:
                    if attempt > 0 and exc.code() is grpc.StatusCode.ALREADY_EXISTS:
                        return None
                    if exc.code() not in retried_codes or attempt == attempts_max - 1:
                        raise
                await asyncio.sleep(retry_pause_s * (attempt + 1))
            raise AssertionError("unreachable")

    return await asyncio.gather(*(one(call) for call in calls))


def pick_names(node_ids: list[str], count: int) -> list[str]:
    """`count` names whose ring owners (the primary a new stream gets) spread as evenly as they
    can: count // nodes each, one more on the first count % nodes. The ring is a pure function
    of the member ids, the one every node computes (node/cluster/ring.py); ExplainRoute after
    creation checks the outcome."""
    ring = Ring(node_ids)
    room = {n: count // len(node_ids) + (k < count % len(node_ids))
            for k, n in enumerate(sorted(node_ids))}
    chosen: list[str] = []
    for k in range(names_tried_per_stream_max * count):
        if room[owner := ring.owner(_name(k))] > 0:
            room[owner] -= 1
            chosen.append(_name(k))
            if len(chosen) == count:
                break
    return chosen


async def create_streams(nodes: Nodes, names: list[str]) -> None:
    """R3 streams, created through the nodes in turn."""
    await _all([functools.partial(
        nodes.streams[nodes.via(k)].CreateStream, streams_pb2.CreateStreamRequest(
            config=types_pb2.StreamConfig(name=name, replicas=3, subjects=[f"{name}.>"])),
        timeout=call_timeout_s) for k, name in enumerate(names)])


async def routes(nodes: Nodes, names: list[str]) -> dict[str, str]:
    """The primary of each stream, as ExplainRoute says."""
    answers = await _all([functools.partial(
        nodes.cluster[nodes.via(k)].ExplainRoute, cluster_pb2.ExplainRouteRequest(stream=name),
        timeout=call_timeout_s) for k, name in enumerate(names)])
    return {name: str(route.primary) for name, route in zip(names, answers, strict=True)}


async def create_consumers(nodes: Nodes, primaries: dict[str, str]) -> None:
    """One consumer per stream, created through the stream's primary."""
    config = consumers_pb2.ConsumerConfig(name=consumer_name,
                                          max_ack_pending=consumer_max_ack_pending)
    await _all([functools.partial(
        nodes.consumers[node].CreateConsumer,
        consumers_pb2.CreateConsumerRequest(stream=name, config=config), timeout=call_timeout_s)
        for name, node in primaries.items()])


def by_primary(primaries: dict[str, str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for name, primary in primaries.items():
        grouped.setdefault(primary, []).append(name)
    return grouped


Settled = tuple[int, int, str]  # (messages confirmed, messages refused, the first refusal)


async def publish_call(stub: Any, payload: bytes, name: str, size: int) -> Settled:
    entry = streams_pb2.PublishEntry(subject=f"{name}.x", payload=payload)
    reply = await stub.PublishBatch(streams_pb2.PublishBatchRequest(
        stream=name, entries=[entry] * size), timeout=call_timeout_s)
    errors = [r.error for r in reply.results if r.HasField("error")]
    return reply.acked, reply.failed, f"{errors[0].reason} {errors[0].message}" if errors else ""


async def fetch_ack_call(stub: Any, name: str, size: int) -> Settled | None:
    """Fetch(size), then one Ack of those seqs; None when the stream is drained."""
    fetched = await stub.Fetch(consumers_pb2.FetchRequest(
        stream=name, consumer=consumer_name, batch=size), timeout=call_timeout_s)
    if not (seqs := [m.seq for m in fetched.messages]):
        return None
    reply = await stub.Ack(consumers_pb2.AckRequest(stream=name, consumer=consumer_name,
                                                    seqs=seqs), timeout=call_timeout_s)
    refused = [r.error for r in reply.results if r.HasField("error")]
    return (len(seqs) - len(refused), len(refused),
            f"ack {refused[0].reason} {refused[0].message}" if refused else "")


async def worker(names: list[str], cursor: list[int], tally: Tally, step: int,
                 call: Callable[[str, int], Awaitable[Settled | None]]) -> None:
    """`call(stream, messages)` on `names` in turn (a node's workers share `names` and
    `cursor`), one call in flight, until a bound; a drained stream (None) leaves `names`; a
    failed call or a refused message stops the phase."""
    while names and (size := tally.claim(step)):
        name = names[cursor[0] % len(names)]
        cursor[0] += 1
        started = time.perf_counter()
        try:
            settled = await call(name, size)
        except grpc.aio.AioRpcError as exc:
            tally.fail(size, f"{name}: {exc.code().name} {exc.details()}")
            return
        confirmed, refused, refusal = settled or (0, 0, "")
        tally.left += size - confirmed - refused  # a fetch may bring fewer
        if settled is None:
            if name in names:
                names.remove(name)
            continue
        tally.latencies_ms.append((time.perf_counter() - started) * 1000)
        tally.calls += 1
        tally.msgs += confirmed
        if refused:
            tally.fail(refused, f"{name}: {refusal}")


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    return {n: procstat.cpu_s(pid) for n, pid in pids.items()}


def _cores(cpu0: dict[str, float], pids: dict[str, int], elapsed_s: float) -> dict[str, float]:
    return {n: round((procstat.cpu_s(pid) - cpu0[n]) / elapsed_s, 3) for n, pid in pids.items()}


def _rss(pids: dict[str, int]) -> dict[str, float]:
    return {n: round(procstat.rss_mib(pid), 1) for n, pid in pids.items()}


def _nproc() -> int:
    return os.cpu_count() or 1


async def timed(pids: dict[str, int], workers: Sequence[Awaitable[None]], tally: Tally
                ) -> dict[str, Any]:
    """Runs the workers; msgs/s, latencies, and the CPU and RSS of each node meanwhile."""
    cpu0, client0, started = _cpu(pids), time.process_time(), time.perf_counter()
    await asyncio.gather(*workers)
    elapsed_s = max(time.perf_counter() - started, 1e-9)
    cores = _cores(cpu0, pids, elapsed_s)
    return {"msgs": tally.msgs, "calls": tally.calls, "elapsed_s": round(elapsed_s, 3),
            "msgs_per_s": round(tally.msgs / elapsed_s, 1),
            "p50_ms": round(percentile(tally.latencies_ms, 0.50), 2),
            "p99_ms": round(percentile(tally.latencies_ms, 0.99), 2),
            "cpu_cores": cores, "cores_busy": round(sum(cores.values()) / _nproc(), 3),
            "client_cores": round((time.process_time() - client0) / elapsed_s, 3),
            "rss_mib": _rss(pids), "failed_msgs": tally.failed_msgs,
            "failed": bool(tally.first_error), "error": tally.first_error or None}


async def phase(nodes: Nodes, pids: dict[str, int], primaries: dict[str, str],
                settings: Settings, *, fetch: bool) -> dict[str, Any]:
    """The publish phase, or (`fetch`) the fetch+ack phase: `settings.inflight` workers per
    primary; a node's workers share one list of its streams and one cursor into it."""
    tally = Tally(left=settings.messages, deadline=time.monotonic() + settings.seconds)
    payload = os.urandom(payload_bytes)
    workers = [worker(names, cursor, tally, fetch_batch,
                      functools.partial(fetch_ack_call, nodes.consumers[node])) if fetch
               else worker(names, cursor, tally, settings.batch,
                           functools.partial(publish_call, nodes.streams[node], payload))
               for node, names in by_primary(primaries).items()
               for cursor in [[0]] for _ in range(settings.inflight)]
    return await timed(pids, workers, tally)


def memory(before: dict[str, float], streams: dict[str, float], consumers: dict[str, float],
           count: int) -> dict[str, Any]:
    streams_kib = (sum(streams.values()) - sum(before.values())) * 1024
    consumers_kib = (sum(consumers.values()) - sum(streams.values())) * 1024
    return {"rss_mib_before": before, "rss_mib_streams": streams, "rss_mib_consumers": consumers,
            "kib_per_stream_copy": round(streams_kib / (3 * count), 1),
            "kib_per_consumer": round(consumers_kib / count, 1)}


async def _settled(cluster: LocalCluster) -> None:
    """Until every node has applied the metadata (bounded; a slow one is measured as it is)."""
    await asyncio.to_thread(cluster.wait_raft_settled, settle_timeout_s)


async def setup(cluster: LocalCluster, nodes: Nodes, pids: dict[str, int], count: int,
                idle_s: float) -> tuple[dict[str, str], dict[str, Any]]:
    """Steps 1-3: the streams and their consumers; (primary of each, figures)."""
    await _settled(cluster)
    before, started = _rss(pids), time.monotonic()
    names = pick_names(sorted(pids), count)
    await create_streams(nodes, names)
    created_s = time.monotonic() - started
    primaries = await routes(nodes, names)
    await _settled(cluster)
    cpu0 = _cpu(pids)
    await asyncio.sleep(idle_s)
    idle = {"seconds": idle_s, "cpu_cores": _cores(cpu0, pids, idle_s)}
    with_streams = _rss(pids)
    await create_consumers(nodes, primaries)
    await _settled(cluster)
    return primaries, {
        "streams": count, "primaries": {n: len(by_primary(primaries).get(n, [])) for n in pids},
        "create": {"seconds": round(created_s, 2),
                   "streams_per_s": round(count / max(created_s, 1e-9), 1)},
        "idle": idle, "memory": memory(before, with_streams, _rss(pids), count)}


async def measure(cluster: LocalCluster, count: int, settings: Settings) -> dict[str, Any]:
    """Every figure for `count` streams on a started cluster of its own."""
    nodes = Nodes(cluster)
    pids = {cluster.node(i).node_id: cluster.node(i).pid for i in sorted(cluster.running)}
    try:
        primaries, result = await setup(cluster, nodes, pids, count, settings.idle_s)
        _log(f"{count} streams: {json.dumps(result)}")
        result["publish"] = await phase(nodes, pids, primaries, settings, fetch=False)
        _log(f"{count} streams, publish: {json.dumps(result['publish'])}")
        result["fetch_ack"] = None
        if settings.fetch:
            result["fetch_ack"] = await phase(nodes, pids, primaries, settings, fetch=True)
            _log(f"{count} streams, fetch+ack: {json.dumps(result['fetch_ack'])}")
        return result
    finally:
        await nodes.close()


def run_one(workdir: Path, count: int, settings: Settings) -> dict[str, Any]:
    cluster = LocalCluster(workdir / f"cluster-{count}", nodes=3)
    try:
        cluster.start_all(timeout_s=ready_timeout_s)
        return asyncio.run(measure(cluster, count, settings))
    except BaseException:
        for i in sorted(cluster.nodes):
            _log(f"n{i} log tail:\n{cluster.log_tail(i)}")
        raise
    finally:
        cluster.stop_all()


def run(counts: list[int], settings: Settings) -> dict[str, Any]:
    """The whole benchmark, one fresh cluster per count under one temp dir."""
    document: dict[str, Any] = {"schema": SCHEMA, "meta": {
        "streams": counts, **asdict(settings), "payload_bytes": payload_bytes,
        "fetch_batch": fetch_batch, "nproc": _nproc(), "fresh_cluster_per_count": True},
        "runs": []}
    with tempfile.TemporaryDirectory(prefix="raftlog-bench-scale-") as workdir:
        for count in counts:
            document["runs"].append(run_one(Path(workdir), count, settings))
    document["failed"] = [f"{run['streams']} streams, {phase}: {run[phase]['error']}"
                          for run in document["runs"] for phase in ("publish", "fetch_ack")
                          if run[phase] is not None and run[phase]["failed"]]
    return document


def _per_node(figures: dict[str, float]) -> str:
    return "/".join(f"{figures[n]:.2f}" for n in sorted(figures))


def table(document: dict[str, Any]) -> str:
    """One row per count: where msgs/s stops growing, the CPU columns say why."""
    nodes = "/".join(sorted(document["runs"][0]["primaries"]))
    lines = ["", f"raftlog, R3 streams on 3 nodes, {document['meta']['nproc']} cores; "
             f"per-node columns {nodes}; busy = node CPU / cores; cli = this client's cores",
             f"{'streams':>7} {'primaries':>11} {'pub msgs/s':>10} {'p50/p99 ms':>13} "
             f"{'pub cores':>14} {'busy':>5} {'cli':>4} {'f+a msgs/s':>10} {'f+a cores':>14} "
             f"{'busy':>5} {'cli':>4} {'idle cores':>14} {'KiB/copy':>8} {'KiB/cons':>8}"]
    for run in document["runs"]:
        pub, fa, mem = run["publish"], run["fetch_ack"], run["memory"]
        fetched = (f"{fa['msgs_per_s']:>10,.0f} {_per_node(fa['cpu_cores']):>14} "
                   f"{fa['cores_busy']:>5.2f} {fa['client_cores']:>4.2f}" if fa
                   else f"{'-':>10} {'-':>14} {'-':>5} {'-':>4}")
        lines.append(
            f"{run['streams']:>7} {'/'.join(map(str, run['primaries'].values())):>11} "
            f"{pub['msgs_per_s']:>10,.0f} {pub['p50_ms']:>6.1f}/{pub['p99_ms']:<6.1f} "
            f"{_per_node(pub['cpu_cores']):>14} {pub['cores_busy']:>5.2f} "
            f"{pub['client_cores']:>4.2f} {fetched} "
            f"{_per_node(run['idle']['cpu_cores']):>14} {mem['kib_per_stream_copy']:>8.1f} "
            f"{mem['kib_per_consumer']:>8.1f}")
    return "\n".join(lines + [f"FAILED {text}" for text in document["failed"]])


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench-scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1,10,100,1000",
                        help="stream counts, comma-separated (a fresh cluster each)")
    parser.add_argument("--batch", type=int, default=Settings.batch)
    parser.add_argument("--inflight", type=int, default=Settings.inflight, help="per node")
    parser.add_argument("--seconds", type=float, default=Settings.seconds)
    parser.add_argument("--messages", type=int, default=Settings.messages)
    parser.add_argument("--fetch", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--idle-s", type=float, default=Settings.idle_s)
    args = parser.parse_args(argv)
    counts = [int(text) for text in args.streams.split(",") if text.strip()]
    if not counts or min(counts) < 1:
        parser.error("--streams: positive counts, e.g. 1,10,100")
    signal.signal(signal.SIGTERM, _terminate)
    document = run(counts, Settings(batch=args.batch, inflight=args.inflight,
                                    seconds=args.seconds, messages=args.messages,
                                    fetch=args.fetch, idle_s=args.idle_s))
    print(table(document), file=sys.stderr)
    print(json.dumps(document, indent=2))
    return 1 if document["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
