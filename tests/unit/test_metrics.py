"""The metrics collector on in-memory state (node/transport/metrics_state.py) and the hot-path
instruments' bookkeeping (node/transport/metrics.py), read back through the Prometheus text
format as a scrape would see them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.cli.cluster_local import _metrics_args
from raftlog.node.cli.localcluster import NodeSpec
from raftlog.node.cli.main import build_parser
from raftlog.node.transport.metrics import (
    MetricsInterceptor,
    NodeMetrics,
    frontend_of,
    parse_listen_address,
    split_method,
)
from raftlog.node.transport.metrics_state import NodeState, StateCollector
from raftlog.v1 import consumers_pb2


@dataclass
class FakeStream:
    name: str
    last_seq: int
    commit_seq: int
    role: str = "primary"
    deposed: object | None = None
    replicator: Any = None


@dataclass
class FakeConsumers:
    infos: dict[str, list[consumers_pb2.ConsumerInfo]] = field(default_factory=dict)

    def list(self, stream: str) -> list[consumers_pb2.ConsumerInfo]:
        if stream not in self.infos:
            raise RaftlogError(Reason.STREAM_NOT_FOUND, f"no stream {stream}")
        return self.infos[stream]


def consumer(name: str, *, pending: int, ack_pending: int) -> consumers_pb2.ConsumerInfo:
    return consumers_pb2.ConsumerInfo(
        config=consumers_pb2.ConsumerConfig(name=name),
        state=consumers_pb2.ConsumerState(num_pending=pending, num_ack_pending=ack_pending))


def samples(metrics: NodeMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def cluster_state() -> NodeState:
    replicator = SimpleNamespace(progress={"n2": SimpleNamespace(match_seq=7),
                                           "n3": SimpleNamespace(match_seq=10)})
    streams = {
        "orders": FakeStream("orders", last_seq=10, commit_seq=7, replicator=replicator),
        "audit": FakeStream("audit", last_seq=4, commit_seq=4, role="replica"),
        "gone": FakeStream("gone", last_seq=3, commit_seq=3, deposed=object()),
    }
    consumers = FakeConsumers({"orders": [consumer("billing", pending=3, ack_pending=2)],
                               "audit": [consumer("never", pending=9, ack_pending=9)]})
    raft = SimpleNamespace(status=lambda: SimpleNamespace(
        term=4, is_leader=True, leader="127.0.0.1:7401", has_quorum=True, commit_index=30,
        applied_index=29))
    return NodeState(streams=streams, consumers=consumers, fsyncs=lambda: 17, raft=raft,
                     failovers=lambda: 2)


def test_the_collector_reports_streams_lag_consumers_and_raft() -> None:
    metrics = NodeMetrics()
    metrics.registry.register(StateCollector(cluster_state(), loop=None))
    got = samples(metrics)
    assert got[("raftlog_metrics_state_ok", ())] == 1
    assert got[("raftlog_fsyncs_total", ())] == 17
    assert got[("raftlog_stream_commit_seq", (("stream", "orders"),))] == 7
    assert got[("raftlog_stream_last_seq", (("stream", "audit"),))] == 4
    assert [got[("raftlog_stream_is_primary", (("stream", s),))]
            for s in ("orders", "audit", "gone")] == [1, 0, 0]  # a deposed primary leads not
    assert got[("raftlog_streams", (("role", "primary"),))] == 1
    assert got[("raftlog_streams", (("role", "replica"),))] == 2
    assert got[("raftlog_replication_lag_messages", (("replica", "n2"), ("stream", "orders")))] \
        == 3
    assert got[("raftlog_replication_lag_messages", (("replica", "n3"), ("stream", "orders")))] \
        == 0
    billing = (("consumer", "billing"), ("stream", "orders"))
    assert got[("raftlog_consumer_pending_messages", billing)] == 3
    assert got[("raftlog_consumer_ack_pending_messages", billing)] == 2
    # Consumers of a stream led elsewhere are that node's to report.
    assert not [key for key in got if ("consumer", "never") in key[1]]
    assert got[("raftlog_raft_term", ())] == 4
    assert got[("raftlog_raft_is_leader", ())] == 1
    assert got[("raftlog_raft_leader_known", ())] == 1
    assert got[("raftlog_raft_commit_index", ())] == 30
    assert got[("raftlog_failover_promotions_total", ())] == 2
    assert got[("process_resident_memory_bytes", ())] > 0


def test_a_standalone_node_has_no_raft_or_failover_families() -> None:
    metrics = NodeMetrics()
    state = NodeState(streams={"s": FakeStream("s", last_seq=2, commit_seq=2)},
                      consumers=FakeConsumers(), fsyncs=lambda: 1)
    metrics.registry.register(StateCollector(state, loop=None))
    names = {name for name, _ in samples(metrics)}
    assert "raftlog_stream_commit_seq" in names
    assert not {n for n in names if n.startswith(("raftlog_raft_term", "raftlog_failover"))}


def test_a_scrape_while_the_loop_does_not_run_reports_state_not_read() -> None:
    metrics = NodeMetrics()
    loop = asyncio.new_event_loop()
    try:
        metrics.registry.register(StateCollector(cluster_state(), loop=loop))
        got = samples(metrics)
    finally:
        loop.close()
    assert got[("raftlog_metrics_state_ok", ())] == 0
    assert ("raftlog_fsyncs_total", ()) not in got
    assert got[("process_resident_memory_bytes", ())] > 0  # the process metrics still come


def test_a_call_counts_its_operation_latency_and_error_reason() -> None:
    metrics = NodeMetrics()
    metrics.ended(frontend="raftlog.v1", method="Publish", started=0.0, reason="")
    metrics.ended(frontend="kafkapixy", method="Produce", started=0.0, reason="STREAM_NOT_FOUND")
    metrics.ended(frontend="raftlog.v1", method="GetStreamInfo", started=0.0, reason="")
    metrics.count_forward("/raftlog.v1.Streams/Publish")
    metrics.observe_batch(3, 4096)
    metrics.observe_batch(0, 100)  # an fsync that released no writer still covered bytes
    got = samples(metrics)
    assert got[("raftlog_operations_total", (("frontend", "raftlog.v1"), ("operation", "publish"),
                                              ("outcome", "ok")))] == 1
    assert got[("raftlog_operations_total", (("frontend", "kafkapixy"), ("operation", "publish"),
                                              ("outcome", "error")))] == 1
    assert got[("raftlog_operation_duration_seconds_count",
                (("frontend", "raftlog.v1"), ("operation", "publish")))] == 1
    assert got[("raftlog_rpc_errors_total", (("frontend", "kafkapixy"),
                                              ("reason", "STREAM_NOT_FOUND")))] == 1
    assert not [k for k in got if ("method", "GetStreamInfo") in k[1]
                and k[0].startswith("raftlog_operation")]
    assert got[("raftlog_forwarded_calls_total",
                (("method", "/raftlog.v1.Streams/Publish"),))] == 1
    assert got[("raftlog_group_commit_batch_size_sum", ())] == 3
    assert got[("raftlog_group_commit_batch_size_count", ())] == 1
    assert got[("raftlog_group_commit_bytes_sum", ())] == 4196
    assert got[("raftlog_group_commit_bytes_count", ())] == 2


def test_peer_calls_count_in_the_peer_families_and_never_in_the_client_ones() -> None:
    metrics = NodeMetrics()
    interceptor = MetricsInterceptor(metrics, peer=True)

    async def answer(request: bytes, context: Any) -> bytes:
        return b"pong"

    async def refuse(request: bytes, context: Any) -> bytes:
        raise RaftlogError(Reason.STALE_EPOCH, "fenced above")

    async def cancelled(request: bytes, context: Any) -> bytes:
        raise asyncio.CancelledError  # the primary dropped its link: not an error

    async def calls() -> None:
        for method, behavior in (("Ping", answer), ("Ping", answer), ("Survey", refuse),
                                 ("Replicate", cancelled)):
            async def continuation(details: Any, behavior: Any = behavior) -> Any:
                return grpc.unary_unary_rpc_method_handler(behavior)

            handler = await interceptor.intercept_service(
                continuation, SimpleNamespace(method=f"/raftlog.internal.Replication/{method}"))
            with contextlib.suppress(RaftlogError, asyncio.CancelledError):
                await handler.unary_unary(b"", SimpleNamespace())

    asyncio.run(calls())
    metrics.observe_replicated(3, 120)
    metrics.observe_replicated(0, 0)  # removals only
    metrics.count_refusal("SEQ_GAP")
    got = samples(metrics)
    service = ("service", "raftlog.internal.Replication")
    assert got[("raftlog_peer_rpc_calls_total", (("method", "Ping"), service))] == 2
    assert got[("raftlog_peer_rpc_calls_total", (("method", "Replicate"), service))] == 1
    assert got[("raftlog_peer_rpc_errors_total", (("method", "Survey"),
                                                   ("reason", "STALE_EPOCH")))] == 1
    assert not [k for k in got if k[0] == "raftlog_peer_rpc_errors_total"
                and ("method", "Replicate") in k[1]]
    assert not [k for k in got if k[0].startswith(("raftlog_rpc_", "raftlog_operation"))]
    assert got[("raftlog_replica_batches_total", ())] == 2
    assert got[("raftlog_replica_messages_total", ())] == 3
    assert got[("raftlog_replica_bytes_total", ())] == 120
    assert got[("raftlog_replica_refusals_total", (("reason", "SEQ_GAP"),))] == 1


@pytest.mark.parametrize(("service", "frontend"), [
    ("raftlog.v1.Streams", "raftlog.v1"),
    ("waymaker.streams.WaymakerStreamsService", "waymaker"),
    ("KafkaPixy", "kafkapixy"),
    ("apache.rocketmq.v1.MessagingService", "rocketmq.v1"),
    ("apache.rocketmq.v2.MessagingService", "rocketmq.v2"),
    ("grpc.health.v1.Health", "grpc"),
    ("some.Other", "other"),
])
def test_each_service_belongs_to_its_frontend(service: str, frontend: str) -> None:
    assert frontend_of(service) == frontend


def test_method_paths_and_listen_addresses_parse() -> None:
    assert split_method("/raftlog.v1.Streams/Publish") == ("raftlog.v1.Streams", "Publish")
    assert parse_listen_address("127.0.0.1:9100") == ("127.0.0.1", 9100)
    assert parse_listen_address("[::1]:9100") == ("::1", 9100)
    for bad in ("9100", "host:", "host:port", "host:70000", "unix:/tmp/x"):
        with pytest.raises(RaftlogError) as info:
            parse_listen_address(bad)
        assert info.value.reason == Reason.INVALID_CONFIG


ROOT = Path(__file__).resolve().parents[2]
SUFFIXES = ("_bucket", "_count", "_sum", "_created")


def documented() -> set[str]:
    """The metric names docs/metrics.md has a table row for."""
    text = (ROOT / "docs" / "metrics.md").read_text()
    return set(re.findall(r"^\| `((?:raftlog|process)_[a-z_]+)` \|", text, flags=re.MULTILINE))


def test_docs_list_every_metric_a_node_exposes() -> None:
    metrics = NodeMetrics()
    metrics.registry.register(StateCollector(cluster_state(), loop=None))
    exposed = {name for name, _ in samples(metrics) if name.startswith("raftlog_")}
    bases = {next((name[:-len(s)] for s in SUFFIXES if name.endswith(s)), name)
             for name in exposed}
    docs = documented()
    # A histogram's table row names the family; a counter's row its _total sample.
    missing = {b for b in bases if b not in docs and f"{b}_total" not in docs
               and b.removesuffix("_total") not in docs}
    assert not missing, f"not in docs/metrics.md: {sorted(missing)}"
    assert "process_resident_memory_bytes" in docs


def test_the_grafana_dashboard_uses_only_documented_metrics() -> None:
    dashboard = json.loads((ROOT / "docs" / "grafana" / "raftlog.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {re.sub(r"_(bucket|count|sum)$", "", name)
            for expr in exprs for name in re.findall(r"\b(?:raftlog|process)_[a-z_]+", expr)}
    assert len(exprs) > 20
    assert used - documented() == set()


def test_a_call_its_caller_cancelled_is_no_error() -> None:
    metrics = NodeMetrics()
    metrics.ended(frontend="raftlog.v1", method="Fetch", started=0.0, reason="CANCELLED")
    got = samples(metrics)
    assert got[("raftlog_operations_total", (("frontend", "raftlog.v1"), ("operation", "fetch"),
                                              ("outcome", "cancelled")))] == 1
    assert not [k for k in got if k[0] == "raftlog_rpc_errors_total"]


def test_cluster_up_gives_each_node_its_metrics_port(tmp_path: Path) -> None:
    args = build_parser().parse_args(["cluster", "up", "--data", str(tmp_path),
                                      "--metrics-base-port", "9400"])
    spec = NodeSpec(index=3, root=tmp_path, base_port=7400, peers=())
    assert _metrics_args(spec, args.metrics_base_port) == ["--metrics", "127.0.0.1:9402"]
    assert _metrics_args(spec, None) == []
