"""Issue 16 item 5 end to end: a 3-node cluster started with `--metrics`, a workload, and every
node's /metrics parsed with prometheus_client's own text parser.

The families checked are read from docs/metrics.md's tables: the test fails when a node
exposes a raftlog_* family the doc has no row for, when a documented family is missing from
the scrapes, and when a documented family is never read by an assertion here (`Reads`).

The workload, in phases:
1. A stream with 3 replicas; publishes through a node that is not its primary (forwarded); a
   consumer that fetches and acks part of them; one call to each front-end; a request for a
   stream that does not exist; an unsigned call on a peer listener (refused there); a batch
   for a stream it holds no copy of, sent to a replica on a signed Replicate call (refused as
   a replica). Every family moves the way the workload says, Raft's commit and applied indexes
   included.
2. SIGSTOP of one replica (not the Raft leader) while the primary takes more publishes: the
   primary reports exactly that many messages of replication lag for it; SIGCONT: the lag
   drains to 0 and the replica's commit seq catches up.
3. kill -9 of the stream's primary: a replica is promoted (a failover); the survivors keep a
   Raft quorum. Then kill -9 of one more node: the last one reports no quorum.

Every node is a process this module started; the fixture stops them all (a held one is
continued first, in a `finally`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftlog.chaos.cluster import LocalCluster
from raftlog.internal import replication_pb2, replication_pb2_grpc
from raftlog.node.cli.localcluster import NodeSpec
from raftlog.node.transport.credentials import PEER_TOKEN_HEADER
from raftlog.v1 import cluster_pb2, consumers_pb2, streams_pb2, types_pb2

pytestmark = pytest.mark.timeout(240)  # three clusters' worth of waits at most, then fail

call_timeout_s = 10.0
scrape_timeout_s = 5.0
settle_timeout_s = 20.0  # replicas catch up, a scrape shows it
failover_timeout_s = 30.0
STREAM = "metered"
ABSENT = "absent"  # a stream that never exists
CONSUMER = "reader"
published = 12
fetched = 8
acked = 5
lagged = 5  # published while one replica is held (SIGSTOP)
# One call on each front-end (any answer counts as a call): front-end -> method path.
FRONTEND_CALLS = {
    "waymaker": "/waymaker.streams.WaymakerStreamsService/ListConsumers",
    "kafkapixy": "/KafkaPixy/Produce",
    "rocketmq.v1": "/apache.rocketmq.v1.MessagingService/QueryRoute",
    "rocketmq.v2": "/apache.rocketmq.v2.MessagingService/QueryRoute",
}
REPLICATE = "/raftlog.internal.Replication/Replicate"
LAG = "raftlog_replication_lag_messages"
DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
SERIES_SUFFIXES = ("_bucket", "_count", "_sum", "_created")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def documented() -> frozenset[str]:
    """The metric names docs/metrics.md has a table row for (a counter's with `_total`)."""
    return frozenset(re.findall(r"^\| `((?:raftlog|process)_[a-z_]+)` \|", DOC.read_text(),
                                flags=re.MULTILINE))


def family_of(sample: str, families: frozenset[str]) -> str:
    """The documented family a sample name belongs to (a histogram's series, a counter's
    `_created`), or the name itself when it belongs to none."""
    if sample in families:
        return sample
    for suffix in SERIES_SUFFIXES:
        base = sample.removesuffix(suffix)
        if base != sample:
            return next((name for name in (base, f"{base}_total") if name in families), sample)
    return sample


@dataclass
class Reads:
    """Reads sample values and remembers the families read, so the test can show it checked
    every documented one."""

    families: frozenset[str]
    seen: set[str] = field(default_factory=set)

    def value(self, samples: Samples, name: str, **labels: str) -> float:
        """The sum of `name` over the samples whose labels include `labels`; KeyError if
        none."""
        self.seen.add(family_of(name, self.families))
        found = [v for (n, have), v in samples.items()
                 if n == name and set(labels.items()) <= have]
        if not found:
            raise KeyError(f"{name}{labels} not in the scrape")
        return sum(found)

    def moved(self, before: Samples, after: Samples, name: str, **labels: str) -> float:
        """How much `name` (summed as `value` does) rose from `before` (0 if absent) to
        `after`."""
        start = 0.0
        with contextlib.suppress(KeyError):
            start = self.value(before, name, **labels)
        return self.value(after, name, **labels) - start


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[LocalCluster, dict[int, int]]]:
    ports = {i: _free_port() for i in (1, 2, 3)}

    def node_args(spec: NodeSpec) -> list[str]:
        return ["--metrics", f"127.0.0.1:{ports[spec.index]}"]

    root: Path = tmp_path_factory.mktemp("metrics") / "cluster"
    cluster = LocalCluster(root, nodes=3, node_args=node_args)
    try:
        yield cluster.start_all(), ports
    finally:
        cluster.stop_all()


def scrape(port: int) -> Samples:
    """Every sample of one node's /metrics, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                timeout=scrape_timeout_s) as answer:
        text = answer.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def holds(predicate: Callable[[], bool]) -> Callable[[], bool]:
    """`predicate` for wait_until, False (not yet) while a series is missing or a scrape
    fails."""
    def check() -> bool:
        try:
            return predicate()
        except (KeyError, OSError):
            return False

    return check


def _primary(cluster: LocalCluster, among: list[int]) -> int:
    for i in among:
        with contextlib.suppress(grpc.RpcError):
            route = cluster.cluster(i).ExplainRoute(
                cluster_pb2.ExplainRouteRequest(stream=STREAM), timeout=call_timeout_s)
            if route.primary:
                return cluster.index_of(route.primary)
    raise AssertionError(f"no node of {among} names a primary for {STREAM}")


def _publish(cluster: LocalCluster, i: int, seqs: range) -> None:
    for k in seqs:
        cluster.streams(i).Publish(streams_pb2.PublishRequest(
            stream=STREAM, subject=f"{STREAM}.a", payload=b"%d" % k), timeout=call_timeout_s)


def _workload(cluster: LocalCluster) -> tuple[int, int]:
    """Phase 1's client calls; returns (the stream's primary, the node publishes went
    through)."""
    cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(
        name=STREAM, subjects=[f"{STREAM}.>"], replicas=3)), timeout=call_timeout_s)
    primary = _primary(cluster, [1, 2, 3])
    through = next(i for i in (1, 2, 3) if i != primary)
    _publish(cluster, through, range(published))
    cluster.consumers(primary).CreateConsumer(consumers_pb2.CreateConsumerRequest(
        stream=STREAM, config=consumers_pb2.ConsumerConfig(name=CONSUMER, ack_wait_ms=60_000)),
        timeout=call_timeout_s)
    reply = cluster.consumers(primary).Fetch(consumers_pb2.FetchRequest(
        stream=STREAM, consumer=CONSUMER, batch=fetched, max_wait_ms=1_000),
        timeout=call_timeout_s)
    seqs = [m.seq for m in reply.messages]
    assert len(seqs) == fetched
    cluster.consumers(primary).Ack(consumers_pb2.AckRequest(
        stream=STREAM, consumer=CONSUMER, seqs=seqs[:acked]), timeout=call_timeout_s)
    with pytest.raises(grpc.RpcError):
        cluster.streams(through).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name=ABSENT),
                                               timeout=call_timeout_s)
    for path in FRONTEND_CALLS.values():
        call = cluster.channel(through).unary_unary(
            path, request_serializer=lambda m: m, response_deserializer=lambda b: b)
        with contextlib.suppress(grpc.RpcError):
            call(b"", timeout=call_timeout_s)
    return primary, through


def _unsigned_ping(cluster: LocalCluster, i: int) -> grpc.StatusCode:
    """A Ping on node i's peer listener without the cluster's peer token."""
    with grpc.insecure_channel(cluster.peer_address(i)) as channel:
        try:
            replication_pb2_grpc.ReplicationStub(channel).Ping(
                replication_pb2.PingRequest(from_node="test"), timeout=call_timeout_s)
        except grpc.RpcError as err:
            return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _refused_batch(cluster: LocalCluster, i: int) -> replication_pb2.ReplicateAck:
    """A batch for a stream node i holds no copy of, on a signed Replicate call of its own:
    the replica refuses it and changes nothing."""
    token = cluster.credential().token(principal="test", method=REPLICATE)
    request = replication_pb2.ReplicateRequest(stream=ABSENT, epoch=1, first_seq=1,
                                               request_id=1)
    with grpc.insecure_channel(cluster.peer_address(i)) as channel:
        acks = replication_pb2_grpc.ReplicationStub(channel).Replicate(
            iter([request]), metadata=((PEER_TOKEN_HEADER, token),), timeout=call_timeout_s)
        return next(iter(acks))  # type: ignore[no-any-return]


def test_every_metric_is_present_and_moves_under_a_workload(
        metered: tuple[LocalCluster, dict[int, int]]) -> None:
    cluster, ports = metered
    reads = Reads(documented())
    before = {i: scrape(ports[i]) for i in (1, 2, 3)}
    assert all(reads.value(before[i], "raftlog_metrics_state_ok") == 1 for i in (1, 2, 3))
    primary, through = _workload(cluster)
    replicas = [i for i in (1, 2, 3) if i != primary]
    assert _unsigned_ping(cluster, through) == grpc.StatusCode.UNAUTHENTICATED
    assert _refused_batch(cluster, replicas[0]).refused == "STREAM_NOT_FOUND"

    def caught_up() -> bool:
        seen = {i: scrape(ports[i]) for i in (1, 2, 3)}
        lags = [reads.value(seen[primary], LAG, stream=STREAM,
                            replica=cluster.spec(i).node_id) for i in replicas]
        return lags == [0, 0] and all(
            reads.value(seen[i], "raftlog_stream_commit_seq", stream=STREAM) == published
            and reads.moved(before[i], seen[i], "raftlog_raft_applied_index") >= 2
            for i in (1, 2, 3))

    cluster.wait_until(holds(caught_up), settle_timeout_s,
                       what="replicas and Raft caught up in the metrics")
    after = {i: scrape(ports[i]) for i in (1, 2, 3)}
    _families_match_the_doc(reads, after)
    check = Phase(reads, before, after)
    check.streams_and_consumers(primary, replicas)
    check.calls(primary, through)
    check.storage_and_memory(replicas)
    check.peer_listener_and_replicas(through, replicas)
    check.raft()

    leader = cluster.index_of(cluster.wait_for_leader(settle_timeout_s))
    held = next(i for i in replicas if i != leader)
    _held_replica_lags(cluster, ports, reads, primary=primary, held=held)
    _failover_then_no_quorum(cluster, ports, reads, primary=primary, replicas=replicas)

    unchecked = reads.families - reads.seen
    assert not unchecked, f"documented in docs/metrics.md, checked by no assertion: {unchecked}"


def _families_match_the_doc(reads: Reads, after: dict[int, Samples]) -> None:
    """Every documented family is in some node's scrape; every raftlog_* series has a row."""
    names = {name for samples in after.values() for name, _ in samples}
    present = {family_of(name, reads.families) for name in names}
    assert reads.families - present == set(), "documented, yet no node exposes it"
    undocumented = {n for n in present if n.startswith("raftlog_")} - reads.families
    assert not undocumented, f"exposed, not in docs/metrics.md: {sorted(undocumented)}"


@dataclass
class Phase:
    """Phase 1's checks: each compares every node's scrape before and after the workload."""

    reads: Reads
    before: dict[int, Samples]
    after: dict[int, Samples]

    def value(self, i: int, name: str, **labels: str) -> float:
        return self.reads.value(self.after[i], name, **labels)

    def moved(self, i: int, name: str, **labels: str) -> float:
        return self.reads.moved(self.before[i], self.after[i], name, **labels)

    def streams_and_consumers(self, primary: int, replicas: list[int]) -> None:
        """The stream, its replication and its consumer, as the nodes report them."""
        assert self.value(primary, "raftlog_stream_is_primary", stream=STREAM) == 1
        assert self.moved(primary, "raftlog_streams", role="primary") == 1
        for i in replicas:
            assert self.value(i, "raftlog_stream_is_primary", stream=STREAM) == 0
            assert self.moved(i, "raftlog_streams", role="replica") == 1
        for i in (primary, *replicas):
            assert self.value(i, "raftlog_stream_last_seq", stream=STREAM) == published
        assert self.value(primary, "raftlog_consumer_pending_messages", stream=STREAM,
                          consumer=CONSUMER) == published - fetched
        assert self.value(primary, "raftlog_consumer_ack_pending_messages", stream=STREAM,
                          consumer=CONSUMER) == fetched - acked

    def calls(self, primary: int, through: int) -> None:
        """Publishes went through `through` and were forwarded to the primary."""
        assert self.moved(through, "raftlog_forwarded_calls_total",
                          method="/raftlog.v1.Streams/Publish") >= published
        assert self.moved(through, "raftlog_operations_total", operation="publish",
                          outcome="ok") == published
        assert self.moved(primary, "raftlog_operations_total", operation="publish",
                          outcome="ok") == published  # the forwarded copies
        for operation in ("fetch", "ack"):
            assert self.moved(primary, "raftlog_operations_total", operation=operation,
                              outcome="ok") == 1
            assert self.moved(primary, "raftlog_operation_duration_seconds_count",
                              operation=operation) == 1
        assert self.moved(through, "raftlog_operation_duration_seconds_count",
                          operation="publish", frontend="raftlog.v1") == published
        assert self.moved(through, "raftlog_operations_total", operation="publish",
                          frontend="kafkapixy", outcome="error") == 1  # the empty Produce
        assert self.moved(through, "raftlog_operation_duration_seconds_sum",
                          operation="publish") > 0
        assert self.moved(through, "raftlog_rpc_errors_total", reason="STREAM_NOT_FOUND") == 1
        for frontend in ("raftlog.v1", *FRONTEND_CALLS):
            assert self.moved(through, "raftlog_rpc_calls_total", frontend=frontend) >= 1, \
                frontend

    def storage_and_memory(self, replicas: list[int]) -> None:
        """Every node stored the messages (replicas what they were sent) and fsynced them."""
        payload_bytes = sum(len(b"%d" % k) for k in range(published))
        for i in (1, 2, 3):
            assert self.moved(i, "raftlog_fsyncs_total") > 0
            assert self.moved(i, "raftlog_group_commit_batch_size_count") > 0
            assert self.moved(i, "raftlog_group_commit_bytes_count") > 0
            assert self.moved(i, "raftlog_group_commit_bytes_sum") > payload_bytes
            assert self.value(i, "process_resident_memory_bytes") > 10_000_000
        for i in replicas:
            assert self.moved(i, "raftlog_replica_messages_total") >= published
            assert self.moved(i, "raftlog_replica_batches_total") >= 1
            assert self.moved(i, "raftlog_replica_bytes_total") > payload_bytes  # with headers

    def peer_listener_and_replicas(self, through: int, replicas: list[int]) -> None:
        """Replicas took the primary's Replicate call; the refused calls and batch are counted
        where they were refused; peer calls never reach the client-port families."""
        for i in replicas:
            assert self.moved(i, "raftlog_peer_rpc_calls_total", method="Replicate",
                              service="raftlog.internal.Replication") >= 1
            assert self.moved(i, "raftlog_peer_rpc_calls_total", method="Ping") >= 1
        assert self.moved(through, "raftlog_peer_rpc_errors_total", method="Ping",
                          reason="UNAUTHENTICATED") == 1
        assert self.moved(replicas[0], "raftlog_replica_refusals_total",
                          reason="STREAM_NOT_FOUND") == 1
        for i in (1, 2, 3):
            assert not [labels for (name, labels) in self.after[i]
                        if name == "raftlog_rpc_calls_total"
                        and ("service", "raftlog.internal.Replication") in labels]

    def raft(self) -> None:
        """One leader everyone knows, one term, a quorum everywhere, the indexes moved with
        the stream's and consumer's commands, proposals timed where they were made."""
        terms = {self.value(i, "raftlog_raft_term") for i in (1, 2, 3)}
        assert len(terms) == 1 and terms.pop() >= 1
        assert sum(self.value(i, "raftlog_raft_is_leader") for i in (1, 2, 3)) == 1
        for i in (1, 2, 3):
            assert self.value(i, "raftlog_raft_leader_known") == 1
            assert self.value(i, "raftlog_raft_has_quorum") == 1
            assert self.moved(i, "raftlog_raft_commit_index") >= 2
            assert self.moved(i, "raftlog_raft_applied_index") >= 2
            assert self.value(i, "raftlog_raft_applied_index") \
                <= self.value(i, "raftlog_raft_commit_index")
        assert sum(self.moved(i, "raftlog_raft_proposal_duration_seconds_count")
                   for i in (1, 2, 3)) > 0
        assert all(self.value(i, "raftlog_failover_promotions_total") == 0 for i in (1, 2, 3))


def _held_replica_lags(cluster: LocalCluster, ports: dict[int, int], reads: Reads, *,
                       primary: int, held: int) -> None:
    """Phase 2: the primary takes `lagged` publishes while `held` is stopped."""
    replica = cluster.spec(held).node_id
    pid = cluster.node(held).pid
    os.kill(pid, signal.SIGSTOP)
    try:
        _publish(cluster, primary, range(published, published + lagged))
        seen = scrape(ports[primary])
    finally:
        os.kill(pid, signal.SIGCONT)
    assert reads.value(seen, LAG, stream=STREAM, replica=replica) == lagged
    assert reads.value(seen, "raftlog_stream_commit_seq", stream=STREAM) == published + lagged

    def drained() -> bool:
        lead, caught = scrape(ports[primary]), scrape(ports[held])
        return reads.value(lead, LAG, stream=STREAM, replica=replica) == 0 and \
            reads.value(caught, "raftlog_stream_commit_seq", stream=STREAM) \
            == published + lagged
    cluster.wait_until(holds(drained), settle_timeout_s,
                       what=f"{replica}'s lag drained after SIGCONT, in the metrics")


def _failover_then_no_quorum(cluster: LocalCluster, ports: dict[int, int], reads: Reads, *,
                             primary: int, replicas: list[int]) -> None:
    """Phase 3: kill -9 the primary; the Raft leader (maybe a new one) promotes a replica and
    the two survivors keep a quorum. Then kill -9 one more: the last has none."""
    cluster.kill9(primary)

    def promoted() -> bool:
        seen = {i: scrape(ports[i]) for i in replicas}
        return sum(reads.value(seen[i], "raftlog_failover_promotions_total")
                   for i in replicas) >= 1 \
            and sum(reads.value(seen[i], "raftlog_stream_is_primary", stream=STREAM)
                    for i in replicas) == 1 \
            and all(reads.value(seen[i], "raftlog_raft_has_quorum") == 1 for i in replicas)

    cluster.wait_until(holds(promoted), failover_timeout_s,
                       what="a replica promoted, in the metrics")
    last, gone = replicas
    cluster.kill9(gone)
    cluster.wait_until(
        holds(lambda: reads.value(scrape(ports[last]), "raftlog_raft_has_quorum") == 0),
        failover_timeout_s, what=f"n{last} alone reports no Raft quorum")
