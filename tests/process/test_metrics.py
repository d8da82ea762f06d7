"""Issue 16 item 5 end to end: a 3-node cluster started with `--metrics`, a small workload, and
every node's /metrics parsed with prometheus_client's own text parser (the replicas' peer
listener and replica families included).

The workload: a stream with 3 replicas, publishes through a node that is not its primary (so
they are forwarded), a consumer that fetches and acks part of them, one call to each
front-end, a request for a stream that does not exist, and at the end a kill -9 of the
stream's primary (a failover). Each metric docs/metrics.md lists is checked to be present and
to have moved the way the workload says it must.
"""

from __future__ import annotations

import contextlib
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftlog.chaos.cluster import LocalCluster
from raftlog.node.cli.localcluster import NodeSpec
from raftlog.v1 import cluster_pb2, consumers_pb2, streams_pb2, types_pb2

call_timeout_s = 10.0
settle_timeout_s = 15.0  # replicas catch up, a scrape shows it
failover_timeout_s = 20.0
STREAM = "metered"
CONSUMER = "reader"
published = 12
fetched = 8
acked = 5
# One call on each front-end (any answer counts as a call): front-end -> method path.
FRONTEND_CALLS = {
    "waymaker": "/waymaker.streams.WaymakerStreamsService/ListConsumers",
    "kafkapixy": "/KafkaPixy/Produce",
    "rocketmq.v1": "/apache.rocketmq.v1.MessagingService/QueryRoute",
    "rocketmq.v2": "/apache.rocketmq.v2.MessagingService/QueryRoute",
}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


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
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over the samples whose labels include `labels`; KeyError if none."""
    found = [v for (n, have), v in samples.items()
             if n == name and set(labels.items()) <= have]
    if not found:
        raise KeyError(f"{name}{labels} not in the scrape")
    return sum(found)


def _primary(cluster: LocalCluster, among: list[int]) -> int:
    for i in among:
        with contextlib.suppress(grpc.RpcError):
            route = cluster.cluster(i).ExplainRoute(
                cluster_pb2.ExplainRouteRequest(stream=STREAM), timeout=call_timeout_s)
            if route.primary:
                return cluster.index_of(route.primary)
    raise AssertionError(f"no node of {among} names a primary for {STREAM}")


def _workload(cluster: LocalCluster) -> tuple[int, int]:
    """Runs the workload; returns (the stream's primary, the node publishes went through)."""
    cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(
        name=STREAM, subjects=[f"{STREAM}.>"], replicas=3)), timeout=call_timeout_s)
    primary = _primary(cluster, [1, 2, 3])
    through = next(i for i in (1, 2, 3) if i != primary)
    for k in range(published):
        cluster.streams(through).Publish(streams_pb2.PublishRequest(
            stream=STREAM, subject=f"{STREAM}.a", payload=b"%d" % k), timeout=call_timeout_s)
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
        cluster.streams(through).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="absent"),
                                               timeout=call_timeout_s)
    for path in FRONTEND_CALLS.values():
        call = cluster.channel(through).unary_unary(
            path, request_serializer=lambda m: m, response_deserializer=lambda b: b)
        with contextlib.suppress(grpc.RpcError):
            call(b"", timeout=call_timeout_s)
    return primary, through


def test_every_metric_is_present_and_moves_under_a_workload(
        metered: tuple[LocalCluster, dict[int, int]]) -> None:
    cluster, ports = metered
    before = {i: scrape(ports[i]) for i in (1, 2, 3)}
    assert all(value(before[i], "raftlog_metrics_state_ok") == 1 for i in (1, 2, 3))
    primary, through = _workload(cluster)
    replicas = [i for i in (1, 2, 3) if i != primary]

    def caught_up() -> bool:
        seen = {i: scrape(ports[i]) for i in (1, 2, 3)}
        lags = [value(seen[primary], "raftlog_replication_lag_messages", stream=STREAM,
                      replica=f"n{i}") for i in replicas]
        return lags == [0, 0] and all(value(seen[i], "raftlog_stream_commit_seq",
                                            stream=STREAM) == published for i in (1, 2, 3))

    cluster.wait_until(caught_up, settle_timeout_s, what="replicas caught up in the metrics")
    after = {i: scrape(ports[i]) for i in (1, 2, 3)}
    lead, sent = after[primary], after[through]

    # The stream, its replication and its consumer, as the primary reports them.
    assert value(lead, "raftlog_stream_is_primary", stream=STREAM) == 1
    assert all(value(after[i], "raftlog_stream_is_primary", stream=STREAM) == 0
               for i in replicas)
    assert value(lead, "raftlog_stream_last_seq", stream=STREAM) == published
    assert value(lead, "raftlog_consumer_pending_messages", stream=STREAM,
                 consumer=CONSUMER) == published - fetched
    assert value(lead, "raftlog_consumer_ack_pending_messages", stream=STREAM,
                 consumer=CONSUMER) == fetched - acked

    # Calls: publish went through `through` and was forwarded to the primary.
    def moved(name: str, i: int, **labels: str) -> float:
        start = 0.0
        with contextlib.suppress(KeyError):
            start = value(before[i], name, **labels)
        return value(after[i], name, **labels) - start

    assert moved("raftlog_forwarded_calls_total", through,
                 method="/raftlog.v1.Streams/Publish") >= published
    assert moved("raftlog_operations_total", through, operation="publish",
                 outcome="ok") == published
    assert moved("raftlog_operations_total", primary, operation="publish", outcome="ok") \
        == published  # the forwarded copies, received on the primary's client port
    for operation, count in (("fetch", 1), ("ack", 1)):
        assert moved("raftlog_operations_total", primary, operation=operation,
                     outcome="ok") == count
        assert moved("raftlog_operation_duration_seconds_count", primary,
                     operation=operation) == count
    assert moved("raftlog_operation_duration_seconds_count", through, operation="publish",
                 frontend="raftlog.v1") == published
    assert moved("raftlog_operations_total", through, operation="publish", frontend="kafkapixy",
                 outcome="error") == 1  # the empty Produce
    assert value(sent, "raftlog_operation_duration_seconds_sum", operation="publish") > 0
    assert moved("raftlog_rpc_errors_total", through, reason="STREAM_NOT_FOUND") == 1
    for frontend in ("raftlog.v1", *FRONTEND_CALLS):
        assert moved("raftlog_rpc_calls_total", through, frontend=frontend) >= 1, frontend

    # Storage: fsyncs and group-commit batches on every node (replicas fsync what they take).
    for i in (1, 2, 3):
        assert moved("raftlog_fsyncs_total", i) > 0
        assert moved("raftlog_group_commit_batch_size_count", i) > 0
        assert value(after[i], "process_resident_memory_bytes") > 10_000_000

    # The peer listener and replication as a replica: each replica took the primary's
    # Replicate call and every published message in batches it made durable; peer calls never
    # reach the client-port families.
    payload_bytes = sum(len(b"%d" % k) for k in range(published))
    for i in replicas:
        assert moved("raftlog_peer_rpc_calls_total", i, method="Replicate",
                     service="raftlog.internal.Replication") >= 1
        assert moved("raftlog_peer_rpc_calls_total", i, method="Ping") >= 1  # liveness
        assert moved("raftlog_replica_messages_total", i) >= published
        assert moved("raftlog_replica_batches_total", i) >= 1
        assert moved("raftlog_replica_bytes_total", i) > payload_bytes  # stored: with headers
    for i in (1, 2, 3):
        assert not [labels for (name, labels) in after[i] if name == "raftlog_rpc_calls_total"
                    and ("service", "raftlog.internal.Replication") in labels]

    # Raft: one leader everyone knows, one term, proposals timed where they were made.
    terms = {value(after[i], "raftlog_raft_term") for i in (1, 2, 3)}
    assert len(terms) == 1 and terms.pop() >= 1
    assert sum(value(after[i], "raftlog_raft_is_leader") for i in (1, 2, 3)) == 1
    assert all(value(after[i], "raftlog_raft_leader_known") == 1 for i in (1, 2, 3))
    assert sum(moved("raftlog_raft_proposal_duration_seconds_count", i)
               for i in (1, 2, 3)) > 0
    assert all(value(after[i], "raftlog_raft_commit_index") > 0 for i in (1, 2, 3))

    # A failover: kill -9 the primary; the Raft leader (maybe a new one) promotes a replica.
    assert all(value(after[i], "raftlog_failover_promotions_total") == 0 for i in (1, 2, 3))
    cluster.kill9(primary)

    def promoted() -> bool:
        seen = {i: scrape(ports[i]) for i in replicas}
        return sum(value(seen[i], "raftlog_failover_promotions_total") for i in replicas) >= 1 \
            and sum(value(seen[i], "raftlog_stream_is_primary", stream=STREAM)
                    for i in replicas) == 1

    cluster.wait_until(promoted, failover_timeout_s, what="a replica promoted, in the metrics")
