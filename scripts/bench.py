"""Benchmark of raftlog, side by side with NATS JetStream at the same replica count, in one run.

Starts its own `raftlog node` (or, with --replicas 3|5, a local cluster of that many nodes, the
client talking to the stream's primary) on free loopback ports with fresh data directories,
measures with a grpc.aio client (128-byte messages):

    unary publish, 1 and 8 callers        msgs/s, per-call p50/p99 ms
    batch publish, 100 and 1000 per call  msgs/s, several calls in flight
    client-streaming publish              msgs/s (one message per stream item)
    frame streaming (PublishFrames)       msgs/s, frames of 100, 16 unanswered, per-frame p50
    fetch + ack, batch 100 and 1000       msgs/s, one Ack call per fetch (pipelined)
    fetch carrying acks, 100 and 1000     msgs/s, each fetch acks the batch before it
                                          (FetchRequest.ack_seqs); one Ack call at the end

then stops the node (by its pid), measures the floor under those figures (a bare grpc.aio
server and client doing the same call shapes with nothing else: scripts/bench_grpc_floor.py),
with --replicas 3 the R3 skeleton (three processes doing only what the contract asks of a
publish, a batch publish and fetch + ack, with the same load loops: scripts/bench_skeleton.py,
which says whether each target is within reach of any design on this stack in this run),
and runs `../shared/peers/jetstream/run --replicas R --phases
pub` (`pub,failover` with --failover, which also runs scripts/bench_failover.py), and prints
the ratio raftlog/JetStream for each comparable figure with its target. A table
goes to stderr, ONE JSON document to stdout. Every phase is bounded in messages and in time; the
peer has a hard time limit. Exit status 1 when a phase or the peer failed (the JSON says which).
The peer run, the ratios and the table live in scripts/bench_report.py.

    scripts/bench                 full run, about 4 minutes with the peer
    scripts/bench --quick         small counts (about 30 s without the peer)
    scripts/bench --no-peer       skip JetStream
    scripts/bench --replicas 3 --failover   R3 and the failover trials (issue 4), ~10 minutes
    scripts/bench --replicas 3 --repeat 3   each raftlog phase on 3 fresh clusters: medians,
                                  and the spread (max - min) / median of every figure
    scripts/bench --replicas 3 --no-peer --profile 'fetch+ack, batch 100'
                                  py-spy flame graphs of each node for that phase
                                  (scripts/bench_profile.py; into ./bench-profiles)
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import bench_breakdown  # scripts/ is sys.path[0]
import bench_failover
import bench_grpc_floor
import bench_profile
import bench_report
import bench_skeleton
import grpc

from raftlog.chaos import procstat
from raftlog.chaos import workload as wl
from raftlog.node.cli import format as fmt
from raftlog.node.cli import loadgen, localcluster
from raftlog.node.cli.client import Client, describe_failure
from raftlog.v1 import cluster_pb2, cluster_pb2_grpc, consumers_pb2, streams_pb2, types_pb2

ROOT = Path(os.environ.get("RAFTLOG_ROOT") or Path(__file__).resolve().parents[1])
SCHEMA = "raftlog-bench/1"

payload_bytes = 128
stream_name = "bench"
subject = "bench.data"
warmup_msgs = 200
settle_s = 0.5  # pause after os.sync() before each timed phase, as the JetStream peer does
node_start_timeout_s = 30.0
node_stop_timeout_s = 15.0
# The fetch loops: (results group, loop, phase label); each reads the whole stream through a
# consumer of its own.
FETCH_LOOPS = (("fetch_ack", loadgen.fetch_ack, "fetch+ack"),
               ("fetch_carried", loadgen.fetch_carrying_acks, "fetch carrying acks"))
consumer_max_ack_pending = 50_000  # room for the pipelined acks of a fetch loop
repeat_max = 10  # --repeat: runs of the raftlog phases, each on a fresh node or cluster


@dataclass(frozen=True)
class Plan:
    """Messages per phase (the first bound) and seconds per phase (the second)."""

    unary_1_msgs: int
    unary_8_msgs: int
    batch_100_msgs: int
    batch_1000_msgs: int
    stream_msgs: int
    fetch_msgs: int
    phase_time_s: float
    batch_inflight: int = 4
    stream_per_call: int = 10_000
    stream_inflight: int = 2
    breakdown_calls: int = 1000  # sequential calls per step of the unary breakdown
    frame_messages: int = 100  # per PublishFrames frame
    frames_window: int = 16  # frames a PublishFrames call keeps unanswered


FULL = Plan(
    unary_1_msgs=10_000,
    unary_8_msgs=30_000,
    batch_100_msgs=300_000,
    batch_1000_msgs=600_000,
    stream_msgs=200_000,
    fetch_msgs=300_000,
    phase_time_s=20.0,
)
QUICK = Plan(
    unary_1_msgs=500,
    unary_8_msgs=2_000,
    batch_100_msgs=20_000,
    batch_1000_msgs=50_000,
    stream_msgs=20_000,
    fetch_msgs=30_000,
    phase_time_s=5.0,
    stream_per_call=5_000,
    breakdown_calls=100,
)


# ---------------------------------------------------------------------------------------------
# The node under test.


class BenchNode:
    """A `raftlog node` child process; stopped by its pid (SIGTERM, then SIGKILL)."""

    def __init__(self, workdir: Path) -> None:
        self.data_dir = workdir / "data"
        self.log_path = workdir / "node.log"
        self.address = f"127.0.0.1:{_free_port()}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.profiler: bench_profile.PhaseProfiler | None = None

    def pids(self) -> dict[str, int]:
        return {} if self.proc is None else {"node": self.proc.pid}

    def start(self) -> BenchNode:
        command = [
            sys.executable,
            "-m",
            "raftlog.node.cli",
            "node",
            "--data",
            str(self.data_dir),
            "--grpc",
            self.address,
            "--log-level",
            "WARNING",
        ]
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        if not asyncio.run(self._wait_serving()):
            self.stop()
            raise RuntimeError(f"the node did not start; its log:\n{self.log_tail()}")
        return self

    async def _wait_serving(self) -> bool:
        deadline = time.monotonic() + node_start_timeout_s
        async with Client(self.address, timeout_s=1.0) as client:
            while time.monotonic() < deadline:
                if self.proc is None or self.proc.poll() is not None:
                    return False
                if await client.wait_serving(timeout_s=1.0):
                    return True
        return False

    def cpu_s(self) -> float:
        """User + system CPU seconds of the node so far (from /proc)."""
        return 0.0 if self.proc is None else procstat.cpu_s(self.proc.pid)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=node_stop_timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=node_stop_timeout_s)
        return self.proc.returncode

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class BenchCluster:
    """A local cluster (node/cli/localcluster.py) for replicated runs; the client talks to the
    stream's primary, as the JetStream peer talks to the stream leader."""

    def __init__(self, workdir: Path, *, nodes: int) -> None:
        self.data_dir = workdir / "cluster"
        self.nodes = nodes
        self.base_port = _free_base_port(localcluster.ports_per_node * nodes)
        self.address = f"127.0.0.1:{self.base_port}"
        self.started: list[localcluster.LocalNode] = []
        self.profiler: bench_profile.PhaseProfiler | None = None

    def pids(self) -> dict[str, int]:
        return {node.node_id: node.pid for node in self.started}

    def start(self) -> BenchCluster:
        self.started = localcluster.up(nodes=self.nodes, base_port=self.base_port,
                                       data_dir=self.data_dir, secret_file=None)
        try:
            localcluster.wait_ready(self.started, node_start_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def cpu_s(self) -> float:
        return sum(procstat.cpu_s(node.pid) for node in self.started)

    def stop(self) -> int | None:
        localcluster.down(self.data_dir, timeout_s=node_stop_timeout_s)
        return 0

    def log_tail(self) -> str:
        return "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-2000:]
                         for p in sorted(self.data_dir.glob("*.log")))


def _free_base_port(count: int) -> int:
    for base in range(20000, 30000, 100):
        if not any(localcluster.port_in_use(port) for port in range(base, base + count)):
            return base
    raise RuntimeError("no free loopback ports for the bench cluster")


async def _primary_address(client: Client, stream: str) -> str:
    stub: Any = cluster_pb2_grpc.ClusterStub(client.channel)  # type: ignore[no-untyped-call]
    route = await stub.ExplainRoute(cluster_pb2.ExplainRouteRequest(stream=stream),
                                    timeout=client.deadline_s())
    return str(route.primary_grpc_address)


# ---------------------------------------------------------------------------------------------
# raftlog phases.

Phase = Callable[[], Awaitable[loadgen.LoadResult]]


async def _measure(name: str, node: BenchNode | BenchCluster, phase: Phase
                   ) -> dict[str, Any]:
    """Runs one timed phase after a machine-wide sync and a pause; adds CPU figures."""
    os.sync()
    await asyncio.sleep(settle_s)
    node_cpu_s, client_cpu_s = node.cpu_s(), time.process_time()
    if node.profiler is None:
        result = await phase()
    else:
        async with node.profiler.around(name, node.pids()):
            result = await phase()
    node_cpu_s, client_cpu_s = node.cpu_s() - node_cpu_s, time.process_time() - client_cpu_s
    summary = result.summary()
    if result.elapsed_s > 0:
        summary["server_cpu_pct"] = round(100 * node_cpu_s / result.elapsed_s, 1)
        summary["client_cpu_pct"] = round(100 * client_cpu_s / result.elapsed_s, 1)
        messages = result.msgs_per_s * result.elapsed_s
        if messages:  # per message: the client's is the same work in every run
            summary["server_cpu_us_per_msg"] = round(1e6 * node_cpu_s / messages, 1)
            summary["client_cpu_us_per_msg"] = round(1e6 * client_cpu_s / messages, 1)
    line = f"{name:<22} {result.msgs_per_s:>10,.0f} msgs/s  p50 {summary['p50_ms']:.3f} ms"
    _log(line + (f"  {result.first_error}" if result.first_error else ""))
    return summary


async def run_raftlog(node: BenchNode | BenchCluster, plan: Plan, *, replicas: int = 1
                      ) -> dict[str, Any]:
    address = node.address
    async with Client(node.address, timeout_s=30.0) as client:
        await client.streams.CreateStream(
            streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(
                name=stream_name, subjects=[subject], replicas=replicas)),
            timeout=client.deadline_s(),
        )
        if isinstance(node, BenchCluster):
            address = await _primary_address(client, stream_name)
            _log(f"stream {stream_name} (R{replicas}) has its primary on {address}")
    results = await _run_phases(node, plan, address)
    results["primary"] = address
    results["unary_breakdown"] = await bench_breakdown.unary_breakdown(
        address, stream=stream_name, replicas=replicas,
        replicated_p50_ms=results["unary_publish"]["callers_1"]["p50_ms"],
        calls=plan.breakdown_calls, payload=os.urandom(payload_bytes))
    _log(bench_breakdown.table_line(results["unary_breakdown"]))
    return results


async def _run_phases(node: BenchNode | BenchCluster, plan: Plan, address: str
                      ) -> dict[str, Any]:
    payload = os.urandom(payload_bytes)
    async with Client(address, timeout_s=30.0) as client:
        common: dict[str, Any] = {
            "stream": stream_name,
            "subject": subject,
            "payload": payload,
            "time_limit_s": plan.phase_time_s,
        }
        await loadgen.publish_unary(
            client, **{**common, "time_limit_s": 10.0}, count=warmup_msgs, callers=1
        )

        unary = functools.partial(loadgen.publish_unary, client, **common)
        batch = functools.partial(
            loadgen.publish_batch, client, **common, inflight=plan.batch_inflight
        )
        frames = functools.partial(
            loadgen.publish_frames,
            client,
            **common,
            count=plan.stream_msgs,
            per_frame=plan.frame_messages,
            window=plan.frames_window,
        )
        stream = functools.partial(
            loadgen.publish_stream,
            client,
            **common,
            count=plan.stream_msgs,
            per_call=plan.stream_per_call,
            inflight=plan.stream_inflight,
        )
        results: dict[str, Any] = {
            "unary_publish": {
                "callers_1": await _measure(
                    "unary, 1 caller",
                    node,
                    functools.partial(unary, count=plan.unary_1_msgs, callers=1),
                ),
                "callers_8": await _measure(
                    "unary, 8 callers",
                    node,
                    functools.partial(unary, count=plan.unary_8_msgs, callers=8),
                ),
            },
            "batch_publish": {
                "batch_100": await _measure(
                    "batch of 100",
                    node,
                    functools.partial(batch, count=plan.batch_100_msgs, batch=100),
                ),
                "batch_1000": await _measure(
                    "batch of 1000",
                    node,
                    functools.partial(batch, count=plan.batch_1000_msgs, batch=1000),
                ),
            },
            "stream_publish": await _measure("client streaming", node, stream),
            "frames_publish": await _measure("frame streaming", node, frames),
            "fetch_ack": {},
            "fetch_carried": {},
        }
        for key in ("batch_100", "batch_1000"):
            results["batch_publish"][key]["calls_in_flight"] = plan.batch_inflight
        results["stream_publish"].update(
            per_call=plan.stream_per_call, calls_in_flight=plan.stream_inflight
        )
        results["frames_publish"].update(
            per_frame=plan.frame_messages, frames_in_flight=plan.frames_window
        )
        for (group, loop, label), fetch_batch in itertools.product(FETCH_LOOPS, (100, 1000)):
            consumer = f"{group}{fetch_batch}"
            await client.consumers.CreateConsumer(
                consumers_pb2.CreateConsumerRequest(
                    stream=stream_name,
                    config=consumers_pb2.ConsumerConfig(
                        name=consumer, max_ack_pending=consumer_max_ack_pending
                    ),
                ),
                timeout=client.deadline_s(),
            )
            fetch = functools.partial(
                loop,
                client,
                stream=stream_name,
                consumer=consumer,
                count=plan.fetch_msgs,
                batch=fetch_batch,
                time_limit_s=plan.phase_time_s,
            )
            summary = await _measure(f"{label}, batch {fetch_batch}", node, fetch)
            summary["batch"] = fetch_batch
            if group == "fetch_ack":
                summary["ack_calls_in_flight"] = loadgen.ack_calls_inflight_max
            results[group][f"batch_{fetch_batch}"] = summary
        info = await client.streams.GetStreamInfo(
            streams_pb2.GetStreamInfoRequest(name=stream_name), timeout=client.deadline_s()
        )
        results["stream_state"] = fmt.proto_dict(info.state)
    return results


def _log(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def _run_once(replicas: int, plan: Plan,
              profiler: bench_profile.PhaseProfiler | None) -> dict[str, Any] | None:
    """The raftlog phases on a fresh node or cluster, stopped at the end; None when a call
    failed (said on stderr with the node's log)."""
    with tempfile.TemporaryDirectory(prefix="raftlog-bench-") as workdir:
        node: BenchNode | BenchCluster
        if replicas == 1:
            node = BenchNode(Path(workdir))
            _log(f"starting a node on {node.address} (data in {workdir})")
        else:
            node = BenchCluster(Path(workdir), nodes=replicas)
            _log(f"starting a {replicas}-node cluster from {node.address} (data in {workdir})")
        node.profiler = profiler
        node.start()
        try:
            return asyncio.run(run_raftlog(node, plan, replicas=replicas))
        except grpc.RpcError as exc:
            _log(describe_failure(exc, address=node.address))
            _log(f"node log:\n{node.log_tail()}")
            return None
        finally:
            status = node.stop()
            _log(f"node stopped (exit status {status})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small counts (smoke test)")
    parser.add_argument("--no-peer", action="store_true", help="skip the JetStream peer")
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="stream replicas: 1 = one node; 3 or 5 = a local cluster of that many nodes",
    )
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run the raftlog phases N times, each on a fresh node or cluster; "
                             "figures are the medians, with each one's spread")
    parser.add_argument("--failover", action="store_true",
                        help="also kill -9 the primary of an R3 stream under a publisher, "
                        "10 trials (3 with --quick; issue 4)")
    parser.add_argument("--profile", metavar="PHASE", default="",
                        help="write a py-spy flame graph of each node for every phase whose "
                             "name contains PHASE, e.g. 'fetch+ack, batch 100' "
                             "(scripts/bench_profile.py)")
    parser.add_argument("--profile-dir", type=Path, default=Path("bench-profiles"),
                        help="where the profiles go (default ./bench-profiles)")
    parser.add_argument("--profile-mode", choices=bench_profile.MODES, default="cpu",
                        help="cpu (default), gil (the GIL holder only) or idle (waits too)")
    parser.add_argument("--profile-format", choices=bench_profile.FORMATS,
                        default="flamegraph",
                        help="flamegraph (.svg), raw (collapsed stacks, .txt) or both")
    args = parser.parse_args(argv)
    if args.replicas not in (1, 3, 5):
        parser.error("--replicas: 1, 3 or 5")
    if not 1 <= args.repeat <= repeat_max:
        parser.error(f"--repeat: 1 to {repeat_max}")
    profiler = None
    if args.profile:
        profiler = bench_profile.PhaseProfiler(
            phase=args.profile, out_dir=args.profile_dir, mode=args.profile_mode,
            output_format=args.profile_format, executable=bench_profile.py_spy())
    plan = QUICK if args.quick else FULL
    started = time.monotonic()
    runs = []
    for attempt in range(args.repeat):
        if args.repeat > 1:
            _log(f"run {attempt + 1} of {args.repeat}")
        run = _run_once(args.replicas, plan, profiler if attempt == 0 else None)
        if run is None:
            return 1
        runs.append(run)
    raftlog, spread = bench_report.merge_runs(runs)
    _log("bare grpc.aio floor (scripts/bench_grpc_floor.py)")
    floor = bench_grpc_floor.measure(
        seconds=bench_grpc_floor.phase_quick_s if args.quick else bench_grpc_floor.phase_s)
    skeleton = None
    if args.replicas == 3:
        _log("R3 skeleton (scripts/bench_skeleton.py)")
        skeleton = bench_skeleton.measure(quick=args.quick)
    fo_plan = bench_failover.QUICK if args.quick else bench_failover.FULL
    failover = (bench_failover.run_trials(fo_plan, seed=wl.seed_from_env(),
                                          quick=args.quick) if args.failover else None)
    peer = None if args.no_peer else bench_report.run_peer(
        quick=args.quick, replicas=args.replicas,
        failover_trials=fo_plan.trials if args.failover else 0)
    js = (None if peer is None or "error" in peer
          else bench_report.peer_figures(peer, replicas=args.replicas))
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "meta": {
            "payload_bytes": payload_bytes,
            "quick": args.quick,
            "replicas": args.replicas,
            "plan": asdict(plan),
            "fsync_before_ack": True,
            "python": platform.python_version(),
            "grpcio": grpc.__version__,
            "host": bench_report.host(),
            "duration_s": round(time.monotonic() - started, 1),
            "profiles": [] if profiler is None else [str(path) for path in profiler.written],
            "repeat": args.repeat,
        },
        "raftlog": raftlog,
        "spread": spread,
        "runs": runs if args.repeat > 1 else None,
        "jetstream": js,
        "jetstream_error": None if peer is None else peer.get("error"),
        "ratios": bench_report.ratios(raftlog, js),
        "targets": bench_report.absolute(raftlog),
        "failover": None if failover is None else bench_failover.with_peer(failover, peer),
        "grpc_floor": floor,
        "skeleton": skeleton,
        "skeleton_ratios": None if skeleton is None else bench_skeleton.compare(
            skeleton, raftlog, js),
    }
    print(bench_report.table(document), file=sys.stderr)
    print(bench_grpc_floor.table(floor), file=sys.stderr)
    if skeleton is not None:
        print(bench_skeleton.table(skeleton, document["skeleton_ratios"]), file=sys.stderr)
    if document["failover"]:
        print(bench_failover.table(document["failover"]), file=sys.stderr)
    print(json.dumps(document, indent=2))
    failures = bench_report.phase_errors(raftlog) + (
        [document["jetstream_error"]] if document["jetstream_error"] else []
    )
    if document["failover"] and bench_failover.failed(document["failover"]):
        failures.append("failover: an acknowledged message was missing or a check failed")
    for failure in failures:
        _log(f"FAILED {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
