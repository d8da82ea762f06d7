"""What TLS, metrics and auth cost, as ratios to plaintext measured in the same run (issue 16).

Four local 3-node clusters, all started first (on free loopback ports, stopped by pid at the
end) and then measured in turns: each phase runs in `--rounds` slices, and in every slice each
configuration runs its share one after the other, the first changing from round to round. So
no two clusters ever run a phase at the same moment, and a change in the machine's load during
the run (this benchmark runs on shared machines) falls on all of them alike.

    plaintext   `raftlog node` as it runs by default
    tls         TLS on the client port and mutual TLS on the peer listener, with a CA and
                certificates made as `raftlog cluster up --tls` makes them (chaos/cluster.py
                LocalCluster(tls=True)); the client trusts the CA (no client certificate)
    metrics     plaintext, every node with `--metrics` (a Prometheus endpoint nobody scrapes
                during the run: what the counters and histograms on the call path cost)
    auth        plaintext with a user added (docs/auth.md): every call carries a bearer
                token, is authenticated and has its permissions checked

On each: a 3-replica stream, the client talking to its primary with one call in flight,
128-byte messages:

    publish unary    Streams.Publish, one message per call
    publish batch    Streams.PublishBatch, 100 messages per call
    fetch+ack unary  Consumers.Fetch of 1 message, then Ack of it (the pair is one sample)
    fetch+ack batch  Consumers.Fetch of up to 100, then one Ack of their seqs

msgs/s over the phase (its slices' messages over their summed time), p50/p99 per call (or
pair), and each configuration's msgs/s divided by plaintext's for the same phase.

A table goes to stderr, ONE JSON document to stdout (and to --json FILE).

    scripts/bench-security                   2,000 messages per phase
    scripts/bench-security --quick           200 messages per phase
    scripts/bench-security --messages 500 --json out.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from bench_frontends import summary  # scripts/ is sys.path[0]

from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import free_port
from raftlog.node.cli import certs
from raftlog.node.cli.localcluster import NodeSpec
from raftlog.node.transport.credentials import ADMIN_TOKEN_HEADER
from raftlog.v1 import (
    auth_pb2,
    auth_pb2_grpc,
    cluster_pb2,
    cluster_pb2_grpc,
    consumers_pb2,
    consumers_pb2_grpc,
    streams_pb2,
    streams_pb2_grpc,
    types_pb2,
)

SCHEMA = "raftlog-bench-security/1"
payload_bytes = 128
batch_size = 100
quick_messages = 200
rounds_default = 4
quick_rounds = 2
messages_default = 2000
call_timeout_s = 10.0
ready_timeout_s = 30.0
consume_timeout_s = 120.0
empty_poll_ms = 50
warmup_calls = 50  # untimed publishes: connections, the stream's files, TLS sessions
ack_wait_ms = 120_000
ack_pending_max = 100_000
STREAM = "benchsec"
CONSUMER = "bench"
BASELINE = "plaintext"
CONFIGS = ("plaintext", "tls", "metrics", "auth")
PHASES = ("publish unary", "publish batch", "fetch+ack unary", "fetch+ack batch")
AUTH_USER = "bench"


def _log(text: str) -> None:
    print(f"[bench-security] {text}", file=sys.stderr, flush=True)


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each configuration's msgs/s over plaintext's, phase by phase (where both measured)."""
    base = results.get(BASELINE, {})
    out: dict[str, dict[str, float]] = {}
    for name, phases in results.items():
        if name == BASELINE:
            continue
        out[name] = {phase: round(row["msgs_per_s"] / base[phase]["msgs_per_s"], 2)
                     for phase, row in phases.items()
                     if base.get(phase, {}).get("msgs_per_s")}
    return out


class Tally:
    """One configuration's figures for one phase, summed over the rounds."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.messages = 0
        self.elapsed_s = 0.0

    def call(self, fn: Callable[[], int]) -> None:
        at = time.perf_counter()
        self.messages += fn()
        self.latencies.append(time.perf_counter() - at)

    def timed(self, run: Callable[[Tally], None]) -> None:
        started = time.perf_counter()
        run(self)
        self.elapsed_s += time.perf_counter() - started

    def row(self) -> dict[str, Any]:
        return summary(self.latencies, self.messages, self.elapsed_s)


def rotated(items: Sequence[str], by: int) -> list[str]:
    """`items` starting at index `by` (mod len): who goes first changes every round."""
    k = by % len(items)
    return [*items[k:], *items[:k]]


def retry(fn: Callable[[], Any], what: str) -> Any:
    """Calls fn until it stops answering UNAVAILABLE (a new stream settling)."""
    deadline = time.monotonic() + ready_timeout_s
    while True:
        try:
            return fn()
        except grpc.RpcError as err:
            code = err.code()  # type: ignore[attr-defined]
            if code == grpc.StatusCode.ALREADY_EXISTS:
                return None
            if code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise RuntimeError(f"{what}: {err}") from err
            time.sleep(0.1)


def node_args(config: str, ports: dict[int, int]) -> Callable[[NodeSpec], Sequence[str]]:
    """The extra `raftlog node` flags of a configuration (TLS comes from LocalCluster)."""
    def args(spec: NodeSpec) -> list[str]:
        if config == "metrics":
            return ["--metrics", f"127.0.0.1:{ports[spec.index]}"]
        return []
    return args


class Bench:
    """One configuration's cluster, its stream and the four phases."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.payload = b"p" * payload_bytes
        self._channels: list[grpc.Channel] = []
        self.token = ""

    def channel(self, address: str) -> grpc.Channel:
        made = self._plain_or_tls(address)
        if self.token:  # auth: every call carries the user's bearer token
            made = grpc.intercept_channel(made, _Bearer(self.token))
        self._channels.append(made)
        return made

    def _plain_or_tls(self, address: str) -> grpc.Channel:
        if self.cluster.tls:
            ca = certs.paths_of(self.cluster.root.resolve(), certs.CLIENT_NAME).ca
            credentials = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
            return grpc.secure_channel(address, credentials)
        return grpc.insecure_channel(address)

    def add_user(self) -> None:
        """Turns authentication on: a user allowed everything on the bench's stream (so every
        call is authenticated and its permissions checked), added with the cluster credential."""
        entry = self._plain_or_tls(self.cluster.address(1))
        auth: Any = auth_pb2_grpc.AuthStub(entry)  # type: ignore[no-untyped-call]
        path = "/raftlog.v1.Auth/AddUser"
        metadata = ((ADMIN_TOKEN_HEADER,
                     self.cluster.credential().token(principal="admin", method=path)),)
        made = retry(lambda: auth.AddUser(auth_pb2.AddUserRequest(
            name=AUTH_USER, permissions=auth_pb2.Permissions(
                publish_allow=[f"{STREAM}.>"], subscribe_allow=[f"{STREAM}.>"],
                stream_admin=True, consumer_admin=True)),
            metadata=metadata, timeout=call_timeout_s), "add the bench user")
        self.token = str(made.token)
        entry.close()

    def close(self) -> None:
        for made in self._channels:
            made.close()

    def primary(self) -> str:
        """Creates the stream through node 1; the client port of its primary."""
        entry = self.channel(self.cluster.address(1))
        streams: Any = streams_pb2_grpc.StreamsStub(entry)  # type: ignore[no-untyped-call]
        retry(lambda: streams.CreateStream(streams_pb2.CreateStreamRequest(
            config=types_pb2.StreamConfig(name=STREAM, subjects=[f"{STREAM}.>"], replicas=3)),
            timeout=call_timeout_s), "create the stream")
        routes: Any = cluster_pb2_grpc.ClusterStub(entry)  # type: ignore[no-untyped-call]
        route = retry(lambda: routes.ExplainRoute(cluster_pb2.ExplainRouteRequest(
            stream=STREAM), timeout=call_timeout_s), "find the primary")
        return str(route.primary_grpc_address)

    def setup(self) -> None:
        """The stream, warm-up publishes, and the consumer the fetch phases drain (made after
        the warm-up, so it reads only what the publish phases add)."""
        ch = self.channel(self.primary())
        self.streams: Any = streams_pb2_grpc.StreamsStub(ch)  # type: ignore[no-untyped-call]
        self.consumers: Any = consumers_pb2_grpc.ConsumersStub(ch)  # type: ignore[no-untyped-call]
        retry(self.publish, "the stream takes publishes")
        for _ in range(warmup_calls):
            self.publish()
        retry(lambda: self.consumers.CreateConsumer(consumers_pb2.CreateConsumerRequest(
            stream=STREAM, config=consumers_pb2.ConsumerConfig(
                name=CONSUMER, deliver_policy=consumers_pb2.DELIVER_POLICY_NEW,
                ack_wait_ms=ack_wait_ms, max_ack_pending=ack_pending_max)),
            timeout=call_timeout_s), "create the consumer")

    def publish(self) -> int:
        return 1 if self.streams.Publish(streams_pb2.PublishRequest(
            stream=STREAM, subject=f"{STREAM}.m", payload=self.payload),
            timeout=call_timeout_s).seq else 0

    def publish_batch(self, size: int) -> int:
        return int(self.streams.PublishBatch(streams_pb2.PublishBatchRequest(
            stream=STREAM, entries=[streams_pb2.PublishEntry(
                subject=f"{STREAM}.m", payload=self.payload) for _ in range(size)]),
            timeout=call_timeout_s).acked)

    def fetch_ack(self, batch: int) -> int:
        got = self.consumers.Fetch(consumers_pb2.FetchRequest(
            stream=STREAM, consumer=CONSUMER, batch=batch, max_wait_ms=empty_poll_ms),
            timeout=call_timeout_s).messages
        if got:
            self.consumers.Ack(consumers_pb2.AckRequest(
                stream=STREAM, consumer=CONSUMER, seqs=[m.seq for m in got]),
                timeout=call_timeout_s)
        return len(got)

    def phase(self, phase: str, count: int, tally: Tally) -> None:
        """`count` messages of one phase. The fetch phases drain what the publish phases of
        the same round added (each publish phase adds `count`, each fetch phase takes it)."""
        if phase == "publish unary":
            for _ in range(count):
                tally.call(self.publish)
        elif phase == "publish batch":
            for start in range(0, count, batch_size):
                size = min(batch_size, count - start)
                tally.call(lambda size=size: self.publish_batch(size))
        else:
            batch = 1 if phase == "fetch+ack unary" else batch_size
            goal = tally.messages + count
            deadline = time.monotonic() + consume_timeout_s
            while tally.messages < goal:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{phase}: {goal - tally.messages} of {count} messages "
                                       f"not delivered in {consume_timeout_s} s")
                tally.call(lambda: self.fetch_ack(batch))


class _Bearer(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        metadata = [*(details.metadata or ()), self._header]
        return continuation(_CallDetails(details.method, details.timeout, metadata,
                                         details.credentials, details.wait_for_ready,
                                         details.compression), request)


class _CallDetails(collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready",
                         "compression")), grpc.ClientCallDetails):  # type: ignore[misc]
    pass


def start(config: str, workdir: Path) -> LocalCluster:
    ports = {i: free_port() for i in (1, 2, 3)}
    cluster = LocalCluster(workdir / config, nodes=3, tls=config == "tls",
                           node_args=node_args(config, ports))
    _log(f"{config}: starting a 3-node cluster")
    return cluster.start_all()


def measure(benches: dict[str, Bench], *, messages: int, rounds: int
            ) -> dict[str, dict[str, Any]]:
    """Every phase on every configuration, in `rounds` slices of messages/rounds each: the
    configurations take turns slice by slice (the first changes every round), so a change
    in the machine's load during the run falls on all of them alike."""
    tallies = {config: {phase: Tally() for phase in PHASES} for config in benches}
    per_round = [messages // rounds + (1 if r < messages % rounds else 0) for r in range(rounds)]
    for r, count in enumerate(per_round):
        for phase in PHASES:
            for config in rotated(list(benches), r):
                tallies[config][phase].timed(
                    lambda tally, config=config, phase=phase, count=count:
                    benches[config].phase(phase, count, tally))
        _log(f"round {r + 1}/{rounds} done")
    results: dict[str, dict[str, Any]] = {}
    for config, phases in tallies.items():
        results[config] = {}
        for phase, tally in phases.items():
            results[config][phase] = row = tally.row()
            _log(f"{config:<10} {phase:<16} {row['msgs_per_s']:>9,.0f} msgs/s  "
                 f"p50 {row['p50_ms']:.3f} ms  p99 {row['p99_ms']:.3f} ms")
    return results


# ---------------------------------------------------------------- report

def table(document: dict[str, Any]) -> str:
    configs = list(document["results"])
    head = f"{'phase':<16}" + "".join(
        f" {name + ' msgs/s':>17} {'p50 ms':>7} {'p99 ms':>7}" for name in configs)
    head += "".join(f" {name + ' ratio':>12}" for name in configs if name != BASELINE)
    lines = [head]
    for phase in PHASES:
        line = f"{phase:<16}"
        for name in configs:
            row = document["results"][name].get(phase)
            line += (f" {row['msgs_per_s']:>17,.0f} {row['p50_ms']:>7.3f} "
                     f"{row['p99_ms']:>7.3f}") if row else f" {'-':>17} {'-':>7} {'-':>7}"
        for name in configs:
            if name != BASELINE:
                ratio = document["ratios"].get(name, {}).get(phase)
                line += f" {'-' if ratio is None else f'{ratio:.2f}':>12}"
        lines.append(line)
    lines.append("ratio = msgs/s / plaintext msgs/s in this run (1.00 = no cost)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench-security", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=messages_default,
                        help="messages per phase")
    parser.add_argument("--quick", action="store_true",
                        help=f"{quick_messages} messages per phase")
    parser.add_argument("--rounds", type=int, default=0,
                        help=f"slices the configurations take turns in (default "
                        f"{rounds_default}, --quick {quick_rounds})")
    parser.add_argument("--json", type=Path, help="also write the JSON document here")
    args = parser.parse_args(argv)
    messages = quick_messages if args.quick else args.messages
    if messages < 1:
        parser.error("--messages must be at least 1")
    started = time.monotonic()
    rounds = max(1, min(args.rounds or (quick_rounds if args.quick else rounds_default),
                        messages))
    clusters: list[LocalCluster] = []
    benches: dict[str, Bench] = {}
    with tempfile.TemporaryDirectory(prefix="raftlog-bench-security-") as workdir:
        try:
            for config in CONFIGS:
                clusters.append(start(config, Path(workdir)))
                benches[config] = Bench(clusters[-1])
                if config == "auth":
                    benches[config].add_user()
                benches[config].setup()
            results = measure(benches, messages=messages, rounds=rounds)
        finally:
            for bench in benches.values():
                bench.close()
            for cluster in clusters:
                cluster.stop_all()
            _log("clusters stopped")
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "meta": {"messages": messages, "payload_bytes": payload_bytes, "replicas": 3,
                 "batch": batch_size, "clients": 1, "in_flight": 1, "rounds": rounds,
                 "python": platform.python_version(),
                 "grpcio": grpc.__version__, "cpus": os.cpu_count(),
                 "load_avg": [round(x, 2) for x in os.getloadavg()],
                 "duration_s": round(time.monotonic() - started, 1)},
        "baseline": BASELINE,
        "results": results,
        "ratios": ratios(results),
    }
    print(table(document), file=sys.stderr)
    text = json.dumps(document, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
