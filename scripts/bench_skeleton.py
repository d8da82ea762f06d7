"""The most any R3 design on Python gRPC, RocksDB and pysyncobj can do here (issue 17): a skeleton
cluster that does only what raftlog's contract asks of a publish, a batch publish and of fetch +
ack, and nothing else, measured with raftlog's own load loops (node/cli/loadgen.py) and protos.

Three processes on loopback. The first serves raftlog.v1 PublishBatch, Fetch and Ack (the real
messages; an answer in the compact form); the other two are its replicas. All three run one
pysyncobj group (no journal file: cheaper than raftlog's, which saves each entry in RocksDB).

    Publish        one message, as a batch of one (the unary p50 is held to raftlog's absolute
                   target, 1.3 ms)
    PublishBatch   the entries' own bytes stored at consecutive seqs in RocksDB, fsynced (group
                   commit: every call waiting shares one fsync and one replication item); each
                   replica gets the batch as one raftlog.internal ReplicateRequest on a
                   long-lived gRPC bidi call, stores and fsyncs it (group commit too) and acks;
                   the call is answered once the primary and one replica hold it (a majority)
    Fetch          the next `batch` messages of the consumer's cursor read from RocksDB, each
                   decoded and answered as a raftlog.v1 Message; their seqs noted as pending;
                   `ack_seqs` settled first and proposed to the Raft group without waiting
    Ack            the seqs settled and proposed as one pysyncobj command; answered once it is
                   committed

What it leaves out and raftlog does: fencing epochs, msg_id dedupe, checksums, leases,
redelivery timers, retention, subjects' filters, interceptors (auth, quotas, metrics), routing,
the record format and its headers. So its figures are a ceiling, not a target: a design with
the same contract cannot do more on this machine, in the same run.

    python scripts/bench_skeleton.py          figures as JSON, a table on stderr (~1 minute)
    python scripts/bench_skeleton.py --quick  small counts

`scripts/bench --replicas 3` runs it after raftlog's phases and prints it beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import bench_report  # scripts/ is sys.path[0]
import grpc
from pysyncobj import SyncObj, SyncObjConf, replicated
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from raftlog.base import children
from raftlog.chaos import procstat
from raftlog.chaos.nodeproc import free_port
from raftlog.internal import replication_pb2
from raftlog.node.cli import loadgen
from raftlog.node.cli.client import Client
from raftlog.v1 import consumers_pb2, streams_pb2, types_pb2

stream_name = "skeleton"
subject = "skeleton.data"
payload_bytes = 128
nodes = 3
primary_id = "s0"
start_timeout_s = 30.0
stop_timeout_s = 10.0
tick_period_s = 0.005  # raftlog's RaftTimings
append_entries_period_s = 0.01
call_timeout_s = 30.0
# (phase, loop, batch, messages in the full run, in a quick run)
PHASES: tuple[tuple[str, str, int, int, int], ...] = (
    ("unary_1", "unary", 1, 10_000, 500),
    ("batch_100", "publish", 100, 300_000, 20_000),
    ("batch_1000", "publish", 1000, 600_000, 50_000),
    ("fetch_ack_100", "fetch_ack", 100, 300_000, 20_000),
    ("fetch_carried_100", "fetch_carried", 100, 300_000, 20_000),
)
phase_time_s = 20.0
batch_inflight = 4  # scripts/bench's Plan.batch_inflight
# Each phase's comparison in bench_report.COMPARISONS (raftlog's figure, JetStream's, target);
# unary_1's p50 is held to bench_report.ABSOLUTE_TARGETS' instead (UNARY_TARGET).
UNARY_TARGET = "unary_p50_ms"
SKELETON_COMPARISONS = {
    "batch_100": "batch_100_vs_publish_async",
    "batch_1000": "batch_1000_vs_publish_async",
    "fetch_ack_100": "fetch_ack_100_vs_pull_consume",
    "fetch_carried_100": "fetch_carried_100_vs_pull_consume",
}

_seq_key = struct.Struct(">Q").pack
_unsynced = WriteOptions()
_unsynced.sync = False  # written unsynced, then one WAL fsync per group (raftlog's group commit)


# ---------------------------------------------------------------------------------------------
# What every node has: a RocksDB with group commit.


# Records at consecutive seqs from the first, and what is done when they are stored or sent.
Waiting = tuple[int, list[bytes], asyncio.Future[None]]


class Gathering:
    """Records handed over while their consumer is busy, taken by it all together: the group
    commit of a store and the one replication item of the calls waiting on the primary."""

    def __init__(self) -> None:
        self._waiting: list[Waiting] = []
        self._wake = asyncio.Event()

    def add(self, first_seq: int, records: list[bytes]) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((first_seq, records, done))
        self._wake.set()
        return done

    async def take(self) -> list[Waiting]:
        """Every record waiting, once there is one."""
        while not self._waiting:
            self._wake.clear()
            await self._wake.wait()
        group, self._waiting = self._waiting, []
        return group


class Store:
    """Batches of records at consecutive seqs; `put` returns once they are fsynced, and every
    put waiting at that moment shares one fsync."""

    def __init__(self, path: Path) -> None:
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self.db = Rdict(str(path), options)
        self._puts = Gathering()
        self._task = asyncio.get_running_loop().create_task(self._commit())

    async def put(self, first_seq: int, records: list[bytes]) -> None:
        await self._puts.add(first_seq, records)

    async def _commit(self) -> None:
        while True:
            group = await self._puts.take()
            batch = WriteBatch(raw_mode=True)
            for first_seq, records, _ in group:
                for offset, record in enumerate(records):
                    batch.put(_seq_key(first_seq + offset), record)
            await asyncio.to_thread(self._write, batch)
            for _, _, done in group:
                done.set_result(None)

    def _write(self, batch: WriteBatch) -> None:
        self.db.write(batch, _unsynced)
        self.db.flush_wal(True)

    def read(self, from_seq: int, limit: int) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        it = self.db.iter()
        it.seek(_seq_key(from_seq))
        while it.valid() and len(out) < limit:
            out.append((struct.unpack(">Q", it.key())[0], it.value()))
            it.next()
        return out


class Acks(SyncObj):  # type: ignore[misc]
    """The consumer state in the Raft group: each consumer's acked seqs, as a count."""

    def __init__(self, self_address: str, partners: list[str]) -> None:
        super().__init__(self_address, partners, SyncObjConf(
            autoTickPeriod=tick_period_s, appendEntriesPeriod=append_entries_period_s,
            appendEntriesUseBatch=True, commandsWaitLeader=True, useFork=False))
        self.acked: dict[str, int] = {}

    @replicated  # type: ignore[untyped-decorator]
    def ack(self, consumer: str, seqs: list[int]) -> int:
        self.acked[consumer] = self.acked.get(consumer, 0) + len(seqs)
        return len(seqs)


def _committed(acks: Acks, consumer: str, seqs: list[int]) -> Awaitable[Any]:
    """Proposes the ack; the future is done when pysyncobj's thread applied it."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def applied(result: Any, error: Any) -> None:
        loop.call_soon_threadsafe(_settle, done, result, error)

    acks.ack(consumer, seqs, callback=applied)
    return done


def _settle(done: asyncio.Future[Any], result: Any, error: Any) -> None:
    if done.done():
        return
    if error:
        done.set_exception(RuntimeError(f"ack not committed: {error}"))
    else:
        done.set_result(result)


# ---------------------------------------------------------------------------------------------
# The primary.


class Link:
    """One long-lived Replicate call to a replica; `send` returns when the replica acked."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.aio.insecure_channel(address)
        call = self._channel.stream_stream(
            "/raftlog.internal.Replication/Replicate",
            request_serializer=replication_pb2.ReplicateRequest.SerializeToString,
            response_deserializer=replication_pb2.ReplicateAck.FromString)
        self._queue: asyncio.Queue[replication_pb2.ReplicateRequest] = asyncio.Queue()
        self._call = call(self._requests(), wait_for_ready=True)
        self._waiting: dict[int, asyncio.Future[None]] = {}
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _requests(self) -> AsyncIterator[replication_pb2.ReplicateRequest]:
        while True:
            yield await self._queue.get()

    async def _read(self) -> None:
        """Settles each item at its ack; when the call breaks, fails every item waiting (and
        so the publishes waiting on them) rather than leaving them to their deadlines."""
        try:
            async for ack in self._call:
                self._waiting.pop(ack.request_id).set_result(None)
        except grpc.aio.AioRpcError as err:
            for done in self._waiting.values():
                done.set_exception(RuntimeError(f"replication link broken: {err.details()}"))
            self._waiting.clear()

    def send(self, request_id: int, first_seq: int, records: list[bytes]) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = done
        self._queue.put_nowait(replication_pb2.ReplicateRequest(
            stream=stream_name, first_seq=first_seq, messages=records, request_id=request_id))
        return done


class Primary:
    def __init__(self, store: Store, links: list[Link], acks: Acks) -> None:
        self._store, self._links, self._acks = store, links, acks
        self._next_seq = 1
        self._request_id = 0
        self._outgoing = Gathering()
        self._sender = asyncio.get_running_loop().create_task(self._send())
        self._cursor: dict[str, int] = {}
        self._pending: dict[str, set[int]] = {}

    async def publish_batch(self, request: streams_pb2.PublishBatchRequest, context: Any
                            ) -> streams_pb2.PublishBatchResponse:
        records = [entry.SerializeToString() for entry in request.entries]
        first_seq = self._next_seq
        self._next_seq += len(records)
        await asyncio.gather(self._store.put(first_seq, records),
                             self._outgoing.add(first_seq, records))
        return streams_pb2.PublishBatchResponse(acked=len(records), first_seq=first_seq,
                                                stream=stream_name, epoch=1, primary=primary_id)

    async def publish(self, request: streams_pb2.PublishRequest, context: Any
                      ) -> streams_pb2.PublishAck:
        """One message: a batch of one, on the same path."""
        entry = streams_pb2.PublishEntry(subject=request.subject, payload=request.payload)
        answer = await self.publish_batch(
            streams_pb2.PublishBatchRequest(stream=request.stream, entries=[entry]), context)
        return streams_pb2.PublishAck(stream=stream_name, seq=answer.first_seq, epoch=1,
                                      primary=primary_id)

    async def _send(self) -> None:
        """Every call waiting goes to the replicas as one item; done at the first replica's
        ack (with the primary's own copy, a majority of three)."""
        while True:
            group = await self._outgoing.take()
            self._request_id += 1
            records = [record for _, batch, _ in group for record in batch]
            sent = [link.send(self._request_id, group[0][0], records) for link in self._links]
            asyncio.get_running_loop().create_task(_first_of(sent, [d for _, _, d in group]))

    async def fetch(self, request: consumers_pb2.FetchRequest, context: Any
                    ) -> consumers_pb2.FetchResponse:
        consumer = request.consumer
        pending = self._pending.setdefault(consumer, set())
        response = consumers_pb2.FetchResponse()
        if request.ack_seqs:
            seqs = list(request.ack_seqs)
            response.acks.CopyFrom(_settled(pending, seqs))
            _committed(self._acks, consumer, seqs)  # saved behind the answer
        cursor = self._cursor.get(consumer, 0)
        found = self._store.read(cursor + 1, request.batch or 1)
        for seq, record in found:
            entry = streams_pb2.PublishEntry.FromString(record)
            response.messages.add(seq=seq, subject=entry.subject, payload=entry.payload,
                                  stream=stream_name, deliver_count=1)
            pending.add(seq)
        if found:
            self._cursor[consumer] = found[-1][0]
        return response

    async def ack(self, request: consumers_pb2.AckRequest, context: Any
                  ) -> consumers_pb2.AckResponse:
        seqs = list(request.seqs)
        answer = _settled(self._pending.setdefault(request.consumer, set()), seqs)
        await _committed(self._acks, request.consumer, seqs)
        return answer


async def _first_of(sent: list[asyncio.Future[None]], calls: list[asyncio.Future[None]]) -> None:
    """Settles the calls of one item when a replica holds it; fails them when none can."""
    waiting, failure = set(sent), None
    while waiting:
        done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        failure = next((f.exception() for f in done if f.exception() is not None), failure)
        if any(f.exception() is None for f in done):
            failure = None
            break
    for call in calls:
        if failure is None:
            call.set_result(None)
        else:
            call.set_exception(failure)


def _settled(pending: set[int], seqs: list[int]) -> consumers_pb2.AckResponse:
    answer = consumers_pb2.AckResponse()
    for seq in seqs:
        if seq in pending:
            pending.discard(seq)
            answer.applied += 1
            answer.results.add(seq=seq)
        else:
            answer.results.add(seq=seq, error=types_pb2.Error(reason="NOT_DELIVERED"))
    return answer


# ---------------------------------------------------------------------------------------------
# A replica.


def _replicate(store: Store) -> Callable[..., AsyncIterator[replication_pb2.ReplicateAck]]:
    async def replicate(requests: AsyncIterator[replication_pb2.ReplicateRequest], context: Any
                        ) -> AsyncIterator[replication_pb2.ReplicateAck]:
        # Each request is stored by the group commit while the next ones are read.
        stored: asyncio.Queue[tuple[int, int, asyncio.Future[None]] | None] = asyncio.Queue()

        async def read() -> None:
            async for request in requests:
                last_seq = request.first_seq + len(request.messages) - 1
                put = asyncio.ensure_future(store.put(request.first_seq, list(request.messages)))
                stored.put_nowait((request.request_id, last_seq, put))
            stored.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while (item := await stored.get()) is not None:
                request_id, last_seq, put = item
                await put
                yield replication_pb2.ReplicateAck(stream=stream_name, last_seq=last_seq,
                                                   request_id=request_id)
        finally:
            reader.cancel()

    return replicate


# ---------------------------------------------------------------------------------------------
# A node's process.


async def serve(index: int, grpc_ports: list[int], raft_ports: list[int], data: Path) -> None:
    store = Store(data / f"db{index}")
    raft = [f"127.0.0.1:{port}" for port in raft_ports]
    acks = Acks(raft[index], [address for i, address in enumerate(raft) if i != index])
    server = grpc.aio.server()
    if index == 0:
        links = [Link(f"127.0.0.1:{port}") for port in grpc_ports[1:]]
        primary = Primary(store, links, acks)
        server.add_generic_rpc_handlers((
            grpc.method_handlers_generic_handler("raftlog.v1.Streams", {
                "Publish": grpc.unary_unary_rpc_method_handler(
                    primary.publish,
                    request_deserializer=streams_pb2.PublishRequest.FromString,
                    response_serializer=streams_pb2.PublishAck.SerializeToString),
                "PublishBatch": grpc.unary_unary_rpc_method_handler(
                    primary.publish_batch,
                    request_deserializer=streams_pb2.PublishBatchRequest.FromString,
                    response_serializer=streams_pb2.PublishBatchResponse.SerializeToString)}),
            grpc.method_handlers_generic_handler("raftlog.v1.Consumers", {
                "Fetch": grpc.unary_unary_rpc_method_handler(
                    primary.fetch, request_deserializer=consumers_pb2.FetchRequest.FromString,
                    response_serializer=consumers_pb2.FetchResponse.SerializeToString),
                "Ack": grpc.unary_unary_rpc_method_handler(
                    primary.ack, request_deserializer=consumers_pb2.AckRequest.FromString,
                    response_serializer=consumers_pb2.AckResponse.SerializeToString)}),
        ))
    else:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "raftlog.internal.Replication", {
                "Replicate": grpc.stream_stream_rpc_method_handler(
                    _replicate(store),
                    request_deserializer=replication_pb2.ReplicateRequest.FromString,
                    response_serializer=replication_pb2.ReplicateAck.SerializeToString)}),))
    server.add_insecure_port(f"127.0.0.1:{grpc_ports[index]}")
    await server.start()
    while acks._getLeader() is None:
        await asyncio.sleep(0.05)
    print("ready", flush=True)
    await server.wait_for_termination()


# ---------------------------------------------------------------------------------------------
# The measurement.


def measure(*, quick: bool = False) -> dict[str, Any]:
    """Starts the three processes on free loopback ports, runs every phase, stops them (by
    their pids). Per phase: msgs/s and the CPU the three processes and the client spent a
    message."""
    ports: list[int] = []
    while len(ports) < 2 * nodes:  # free now, and no two the same
        if (port := free_port()) not in ports:
            ports.append(port)
    grpc_ports, raft_ports = ports[:nodes], ports[nodes:]
    with tempfile.TemporaryDirectory(prefix="raftlog-skeleton-") as data:
        started: list[subprocess.Popen[str]] = []
        try:
            for index in reversed(range(nodes)):  # replicas first: the primary dials them
                started.append(subprocess.Popen(
                    [sys.executable, str(Path(__file__)), "serve", str(index),
                     ",".join(map(str, grpc_ports)), ",".join(map(str, raft_ports)), data],
                    stdout=subprocess.PIPE, text=True))
            if not all(_ready(process) for process in started):
                return {"error": "the skeleton cluster did not start"}
            pids = [process.pid for process in started]
            return asyncio.run(_phases(f"127.0.0.1:{grpc_ports[0]}", pids, quick=quick))
        finally:
            for process in started:
                children.end(process, timeout_s=stop_timeout_s)


def _ready(process: subprocess.Popen[str]) -> bool:
    deadline = time.monotonic() + start_timeout_s
    while process.stdout is not None and time.monotonic() < deadline:
        line = process.stdout.readline()
        if line.strip() == "ready":
            return True
        if not line and process.poll() is not None:
            return False
    return False


async def _phases(address: str, pids: list[int], *, quick: bool) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    payload = os.urandom(payload_bytes)
    async with Client(address, timeout_s=call_timeout_s) as client:
        for name, loop_name, batch, full_msgs, quick_msgs in PHASES:
            count = quick_msgs if quick else full_msgs
            run: Callable[[], Awaitable[loadgen.LoadResult]]
            if loop_name == "unary":
                run = functools.partial(
                    loadgen.publish_unary, client, stream=stream_name, subject=subject,
                    payload=payload, count=count, callers=1, time_limit_s=phase_time_s)
            elif loop_name == "publish":
                run = functools.partial(
                    loadgen.publish_batch, client, stream=stream_name, subject=subject,
                    payload=payload, count=count, batch=batch, inflight=batch_inflight,
                    time_limit_s=phase_time_s)
            else:
                run = functools.partial(
                    loadgen.fetch_ack if loop_name == "fetch_ack" else loadgen.fetch_carrying_acks,
                    client, stream=stream_name, consumer=name, count=count, batch=batch,
                    time_limit_s=phase_time_s)
            figures[name] = await _phase(name, run, pids)
    return figures


async def _phase(name: str, run: Callable[[], Awaitable[loadgen.LoadResult]], pids: list[int]
                 ) -> dict[str, Any]:
    os.sync()
    cpu_s = [procstat.cpu_s(pid) for pid in pids]
    client_cpu_s = time.process_time()
    result = await run()
    cpu_s = [procstat.cpu_s(pid) - before for pid, before in zip(pids, cpu_s, strict=True)]
    client_cpu_s = time.process_time() - client_cpu_s
    summary = result.summary()
    if result.msgs:
        summary["server_cpu_us_per_msg"] = round(1e6 * sum(cpu_s) / result.msgs, 1)
        summary["client_cpu_us_per_msg"] = round(1e6 * client_cpu_s / result.msgs, 1)
    if result.elapsed_s > 0:  # cores: the primary's, then each replica's
        summary["cores"] = [round(used / result.elapsed_s, 2) for used in cpu_s[::-1]]
    print(f"[skeleton] {name:<18} {result.msgs_per_s:>10,.0f} msgs/s  "
          f"p50 {summary['p50_ms']:.3f} ms  {result.first_error or ''}",
          file=sys.stderr, flush=True)
    return summary


def compare(figures: dict[str, Any], raftlog: dict[str, Any] | None,
            js: dict[str, Any] | None) -> dict[str, Any]:
    """Per skeleton phase: its ratio to JetStream's figure beside the target raftlog's ratio is
    held to (`bench_report.COMPARISONS`), whether the skeleton itself reaches it ("reachable"
    on this stack, this run), and raftlog's figure as a share of the skeleton's."""
    out: dict[str, Any] = {}
    if "error" in figures:
        return out
    targets = {name: (path, js_key, target) for name, path, js_key, _, target
               in bench_report.COMPARISONS}
    for phase, comparison in SKELETON_COMPARISONS.items():
        if phase not in figures:
            continue
        path, js_key, target = targets[comparison]
        ours = figures[phase]["msgs_per_s"]
        theirs = js.get(js_key) if js else None
        raftlog_figure = bench_report.figure(raftlog, path) if raftlog else None
        ratio = ours / theirs if ours and theirs else None
        out[phase] = {
            "skeleton": ours,
            "jetstream": theirs,
            "ratio": None if ratio is None else round(ratio, 3),
            "target": target,
            "reachable": None if ratio is None or target is None else ratio >= target,
            "raftlog": raftlog_figure,
            "raftlog_share": (round(raftlog_figure / ours, 3)
                              if raftlog_figure is not None and ours else None),
        }
    if "unary_1" in figures:
        path, op, target = next((path, op, target) for name, path, op, target
                                in bench_report.ABSOLUTE_TARGETS if name == UNARY_TARGET)
        p50 = figures["unary_1"]["p50_ms"]
        out["unary_1"] = {
            "skeleton_p50_ms": p50,
            "target": f"{op} {target:g} ms",
            "reachable": p50 <= target if op == "<=" else p50 >= target,
            "raftlog_p50_ms": bench_report.figure(raftlog, path) if raftlog else None,
        }
    return out


def table(figures: dict[str, Any], comparison: dict[str, Any] | None = None) -> str:
    """The skeleton's lines for the bench table; with `compare`'s result, its ratios too."""
    if "error" in figures:
        return f"R3 skeleton: {figures['error']}"
    comparison = comparison or {}
    lines = ["R3 skeleton on this machine (only the contract's work: scripts/bench_skeleton.py)",
             f"  {'phase':<20} {'msgs/s':>9}  {'CPU/msg (nodes + client)':<26}"
             f"{'/ JetStream':>11}  {'target':>6}  {'reachable':>9}  {'raftlog':>9}  "
             f"{'share':>5}"]
    for name, figure in figures.items():
        item = comparison.get(name, {})
        if name == "unary_1":
            reachable = {True: "yes", False: "NO", None: "-"}[item.get("reachable")]
            raftlog = item.get("raftlog_p50_ms")
            lines.append(f"  {name:<20} {figure['msgs_per_s']:>9,.0f}  p50 "
                         f"{figure['p50_ms']:.3f} ms (target {item.get('target', '-')}: "
                         f"reachable {reachable}; raftlog's p50 "
                         f"{'-' if raftlog is None else f'{raftlog:.3f}'} ms)")
            continue
        cpu = (f"{figure.get('server_cpu_us_per_msg', 0)} + "
               f"{figure.get('client_cpu_us_per_msg', 0)} us")
        ratio = "-" if item.get("ratio") is None else f"{item['ratio']:.2f}x"
        target = "-" if item.get("target") is None else f"{item['target']:g}x"
        reachable = {True: "yes", False: "NO", None: "-"}[item.get("reachable")]
        raftlog = "-" if item.get("raftlog") is None else f"{item['raftlog']:,.0f}"
        share = "-" if item.get("raftlog_share") is None else f"{item['raftlog_share']:.0%}"
        lines.append(f"  {name:<20} {figure['msgs_per_s']:>9,.0f}  {cpu:<26}{ratio:>11}  "
                     f"{target:>6}  {reachable:>9}  {raftlog:>9}  {share:>5}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "serve":
        index, grpc_ports, raft_ports, data = argv[1:5]
        asyncio.run(serve(int(index), [int(p) for p in grpc_ports.split(",")],
                          [int(p) for p in raft_ports.split(",")], Path(data)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts")
    args = parser.parse_args(argv)
    figures = measure(quick=args.quick)
    print(table(figures, compare(figures, None, None)), file=sys.stderr)
    print(json.dumps(figures, indent=2))
    return 1 if "error" in figures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
