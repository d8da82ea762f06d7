"""Benchmark of raftlog's KV buckets beside NATS KV, in one run, both on 3 local nodes with
replicas 3: sequential puts, then sequential gets, one call at a time from one client (128-byte
values over 200 keys, history 1), ops/s and per-call p50/p99.

    raftlog   a local 3-node cluster (node/cli/localcluster.py) on free loopback ports; the
              bucket `bench`; the client talks to the bucket stream's primary
    NATS      3 nats-server nodes with JetStream, configured as ../shared/peers/jetstream/run
              configures them; nats-py's KV client (scripts/bench_kv_nats.py, run by a venv
              with nats-py) talks to the node that leads the bucket's stream

Ratios raftlog/NATS and a table go to stderr, ONE JSON document to stdout. Servers started
here are stopped by pid; every phase is bounded in operations, the NATS client in time.

    scripts/bench-kv                  2,000 puts and 2,000 gets each side
    scripts/bench-kv --ops 500        fewer
    scripts/bench-kv --no-peer        raftlog only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from bench import BenchCluster  # scripts/ is sys.path[0]

from raftlog.node.cli.client import Client
from raftlog.node.cli.localcluster import port_in_use
from raftlog.v1 import cluster_pb2, cluster_pb2_grpc, kv_pb2, kv_pb2_grpc

ROOT = Path(os.environ.get("RAFTLOG_ROOT") or Path(__file__).resolve().parents[1])
SCHEMA = "raftlog-bench-kv/1"
BUCKET = "bench"
value_bytes = 128
keys_count = 200
warmup_ops = 200
call_timeout_s = 10.0
ready_timeout_s = 30.0
nats_client_timeout_s = 300.0
nats_start_timeout_s = 15.0
nats_stop_timeout_s = 15.0
nats_py_requirement = "nats-py==2.16.0"  # the version ../shared/peers/jetstream tested
nats_home_default = Path(tempfile.gettempdir()) / "raftlog-bench-kv-nats"
nats_base_port_default = 15_220  # clients +1..3, routes +2001..3, monitoring +4001..3


def _log(text: str) -> None:
    print(f"[bench-kv] {text}", file=sys.stderr, flush=True)


def _summary(name: str, latencies_s: list[float], elapsed_s: float) -> dict[str, Any]:
    ordered = sorted(latencies_s)
    return {
        "phase": name, "ops": len(ordered), "elapsed_s": round(elapsed_s, 3),
        "ops_per_s": round(len(ordered) / elapsed_s, 1) if elapsed_s else 0.0,
        "p50_ms": round(1000 * statistics.median(ordered), 3) if ordered else None,
        "p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 3) if ordered else None,
    }


# ---------------------------------------------------------------------------------------------
# raftlog.


async def _make_bucket(address: str) -> str:
    """Creates the bucket (retried while the cluster settles); the primary's address."""
    async with Client(address, timeout_s=call_timeout_s) as client:
        kv: Any = kv_pb2_grpc.KVStub(client.channel)  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + ready_timeout_s
        config = kv_pb2.KvBucketConfig(bucket=BUCKET, history=1, replicas=3)
        while True:
            try:
                await kv.CreateBucket(kv_pb2.KvCreateBucketRequest(config=config),
                                      timeout=call_timeout_s)
                await kv.Put(kv_pb2.KvPutRequest(bucket=BUCKET, key="ready", value=b"x"),
                             timeout=call_timeout_s)
                break
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.ALREADY_EXISTS:
                    continue
                if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        cluster: Any = cluster_pb2_grpc.ClusterStub(client.channel)  # type: ignore[no-untyped-call]
        route = await cluster.ExplainRoute(cluster_pb2.ExplainRouteRequest(
            stream=f"KV_{BUCKET}"), timeout=call_timeout_s)
        return str(route.primary_grpc_address)


async def _raftlog_phases(address: str, *, ops: int) -> list[dict[str, Any]]:
    value = b"v" * value_bytes
    keys = [f"k{n}" for n in range(keys_count)]
    async with Client(address, timeout_s=call_timeout_s) as client:
        kv: Any = kv_pb2_grpc.KVStub(client.channel)  # type: ignore[no-untyped-call]
        for n in range(warmup_ops):
            await kv.Put(kv_pb2.KvPutRequest(bucket=BUCKET, key=keys[n % keys_count],
                                             value=value), timeout=call_timeout_s)
        results = []
        for name in ("put", "get"):
            latencies: list[float] = []
            started = time.perf_counter()
            for n in range(ops):
                key = keys[n % keys_count]
                at = time.perf_counter()
                if name == "put":
                    await kv.Put(kv_pb2.KvPutRequest(bucket=BUCKET, key=key, value=value),
                                 timeout=call_timeout_s)
                else:
                    entry = await kv.Get(kv_pb2.KvGetRequest(bucket=BUCKET, key=key),
                                         timeout=call_timeout_s)
                    if entry.value != value:
                        raise RuntimeError(f"get {key}: wrong value")
                latencies.append(time.perf_counter() - at)
            results.append(_summary(name, latencies, time.perf_counter() - started))
            _log(f"raftlog {name:<4} {results[-1]['ops_per_s']:>9,.0f} ops/s  "
                 f"p50 {results[-1]['p50_ms']:.3f} ms  p99 {results[-1]['p99_ms']:.3f} ms")
        return results


def run_raftlog(workdir: Path, *, ops: int) -> dict[str, Any]:
    cluster = BenchCluster(workdir, nodes=3)
    _log(f"starting a 3-node raftlog cluster from {cluster.address}")
    cluster.start()
    try:
        primary = asyncio.run(_make_bucket(cluster.address))
        _log(f"bucket {BUCKET} (R3) has its primary at {primary}")
        return {"client": primary, "phases": asyncio.run(_raftlog_phases(primary, ops=ops))}
    finally:
        cluster.stop()
        _log("raftlog cluster stopped")


# ---------------------------------------------------------------------------------------------
# NATS.


class NatsCluster:
    """3 nats-server processes with JetStream on loopback, configured as the JetStream peer's
    `run` configures them; stopped by pid."""

    def __init__(self, home: Path, *, base_port: int, binary: str) -> None:
        self.home = home
        self.base_port = base_port
        self.binary = binary
        self.procs: list[subprocess.Popen[bytes]] = []

    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{self.base_port + n}" for n in (1, 2, 3)]

    def _ports(self) -> list[int]:
        return [self.base_port + offset + n for n in (1, 2, 3) for offset in (0, 2000, 4000)]

    def _conf(self, n: int) -> str:
        routes = "\n".join(f"    nats-route://127.0.0.1:{self.base_port + 2000 + i}"
                           for i in (1, 2, 3))
        return (f"server_name: n{n}\nlisten: 127.0.0.1:{self.base_port + n}\n"
                f"http: 127.0.0.1:{self.base_port + 4000 + n}\n"
                f"jetstream {{\n  store_dir: \"{self.home}/data/n{n}\"\n"
                "  max_memory_store: 1G\n  max_file_store: 20G\n}\n"
                f"cluster {{\n  name: peer\n  listen: 127.0.0.1:{self.base_port + 2000 + n}\n"
                f"  routes: [\n{routes}\n  ]\n}}\n")

    def start(self) -> None:
        busy = [port for port in self._ports() if port_in_use(port)]
        if busy:
            raise RuntimeError(f"ports in use: {busy} (set --nats-base-port)")
        shutil.rmtree(self.home / "data", ignore_errors=True)
        for sub in ("conf", "data", "logs"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        for n in (1, 2, 3):
            conf = self.home / "conf" / f"n{n}.conf"
            conf.write_text(self._conf(n))
            with (self.home / "logs" / f"n{n}.log").open("ab") as log:
                self.procs.append(subprocess.Popen([self.binary, "-c", str(conf)],
                                                   stdout=log, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + nats_start_timeout_s
        while not all(port_in_use(self.base_port + n) for n in (1, 2, 3)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                self.stop()
                raise RuntimeError(f"nats-server did not start; logs in {self.home}/logs")
            time.sleep(0.1)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=nats_stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=nats_stop_timeout_s)
        self.procs = []


def _nats_python(home: Path) -> str:
    """A python with nats-py: the JetStream peer's venv when it has one, else a venv of our
    own in `home` (made once with pip)."""
    for candidate in (Path(tempfile.gettempdir()) / "jetstream-peer" / "venv" / "bin" / "python",
                      home / "venv" / "bin" / "python"):
        if candidate.exists() and subprocess.run([str(candidate), "-c", "import nats"],
                                                 capture_output=True).returncode == 0:
            return str(candidate)
    venv = home / "venv"
    _log(f"creating {venv} with {nats_py_requirement}")
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", nats_py_requirement], check=True)
    return str(venv / "bin" / "python")


def run_nats_client(home: Path, *, base_port: int, args: list[str],
                    timeout_s: float = nats_client_timeout_s) -> dict[str, Any]:
    """Starts 3 nats-server nodes, runs `args` (a client script and its options; --servers is
    added) with a python that has nats-py, stops the servers; the client's JSON, or
    {"error": why} when nats-server or the client failed."""
    binary = shutil.which("nats-server") or shutil.which(
        "nats-server", path="/usr/sbin:/usr/local/sbin:/sbin")
    if binary is None:
        return {"error": "nats-server not found (apt-get install nats-server)"}
    python = _nats_python(home)
    cluster = NatsCluster(home, base_port=base_port, binary=binary)
    _log(f"starting 3 nats-server nodes from port {base_port + 1} (data in {home})")
    cluster.start()
    try:
        done = subprocess.run([python, *args, "--servers", ",".join(cluster.urls())],
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"the NATS client ran past {timeout_s} s"}
    finally:
        cluster.stop()
        _log("nats-server nodes stopped")
    if done.returncode != 0:
        return {"error": f"the NATS client failed: {done.stderr.strip()[-1000:]}"}
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def run_nats(home: Path, *, base_port: int, ops: int) -> dict[str, Any]:
    result = run_nats_client(home, base_port=base_port, args=[
        str(ROOT / "scripts" / "bench_kv_nats.py"), "--puts", str(ops), "--gets", str(ops),
        "--keys", str(keys_count), "--value-bytes", str(value_bytes),
        "--warmup", str(warmup_ops)])
    for phase in result.get("phases", []):
        _log(f"NATS    {phase['phase']:<4} {phase['ops_per_s']:>9,.0f} ops/s  "
             f"p50 {phase['p50_ms']:.3f} ms  p99 {phase['p99_ms']:.3f} ms")
    return result


# ---------------------------------------------------------------------------------------------
# Report.


def ratios(raftlog: dict[str, Any], nats: dict[str, Any] | None, *, key: str = "ops_per_s"
           ) -> dict[str, float]:
    """Per phase, raftlog's figure `key` over NATS's (phases NATS lacks are left out)."""
    if not nats or "error" in nats:
        return {}
    theirs = {phase["phase"]: phase for phase in nats["phases"]}
    return {phase["phase"]: round(phase[key] / theirs[phase["phase"]][key], 2)
            for phase in raftlog["phases"] if theirs.get(phase["phase"], {}).get(key)}


def table(document: dict[str, Any]) -> str:
    nats = document["nats"] or {}
    theirs = {phase["phase"]: phase for phase in nats.get("phases", [])}
    lines = [f"{'op':<5} {'raftlog ops/s':>14} {'p50 ms':>8} {'NATS ops/s':>11} {'p50 ms':>8} "
             f"{'ratio':>6}"]
    for phase in document["raftlog"]["phases"]:
        other = theirs.get(phase["phase"], {})
        ratio = document["ratios"].get(phase["phase"])
        lines.append(f"{phase['phase']:<5} {phase['ops_per_s']:>14,.0f} {phase['p50_ms']:>8.3f} "
                     f"{other.get('ops_per_s', 0):>11,.0f} {other.get('p50_ms') or 0:>8.3f} "
                     f"{'-' if ratio is None else f'{ratio:.2f}':>6}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench-kv", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=2000, help="puts, and gets, per side")
    parser.add_argument("--no-peer", action="store_true", help="skip NATS")
    parser.add_argument("--nats-home", type=Path, default=nats_home_default,
                        help=f"the NATS side's work directory (default {nats_home_default})")
    parser.add_argument("--nats-base-port", type=int, default=nats_base_port_default)
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="raftlog-bench-kv-") as workdir:
        raftlog = run_raftlog(Path(workdir), ops=args.ops)
    nats = None if args.no_peer else run_nats(args.nats_home, base_port=args.nats_base_port,
                                              ops=args.ops)
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "meta": {"ops": args.ops, "value_bytes": value_bytes, "keys": keys_count,
                 "history": 1, "replicas": 3, "clients": 1, "in_flight": 1,
                 "python": platform.python_version(), "grpcio": grpc.__version__,
                 "cpus": os.cpu_count(), "duration_s": round(time.monotonic() - started, 1)},
        "raftlog": raftlog,
        "nats": nats,
        "ratios": ratios(raftlog, nats),
    }
    print(table(document), file=sys.stderr)
    if nats and "error" in nats:
        _log(f"FAILED NATS: {nats['error']}")
    print(json.dumps(document, indent=2))
    return 1 if nats and "error" in nats else 0


if __name__ == "__main__":
    raise SystemExit(main())
