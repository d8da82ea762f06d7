"""Issue 16 item 6 end to end: JSON logs on a real 3-process cluster (`--log-format json`).

- A Publish sent with a request id of the test's choosing to a node that is not the stream's
  primary is forwarded there; the client gets the id back in the trailing metadata, and both
  nodes log the call under that id (rpc.py's per-method DEBUG line).
- Every line of every node's log (DEBUG, so gRPC's and asyncio's lines too) is one JSON object
  with ts, level, logger, message and node.
- A node that cannot start logs the uncaught exception as a JSON line with its traceback in exc.
- After a kill -9 of a stream's primary, the node promoted in its place logs that it leads the
  stream under the stream's name and new fence epoch (fields of a background line, written by
  the coordinator's reconcile, not under any call). Last: it leaves a node down.

One module-scoped cluster, stopped by pid afterwards.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.node.transport import logctx
from raftlog.v1 import cluster_pb2, streams_pb2
from tests.process import cluster_helpers

call_timeout_s = 10.0
log_timeout_s = 10.0  # a call's lines reach the node's log file
start_failure_timeout_s = 30.0  # a node with an unusable data directory gives up
failover_timeout_s = 30.0  # a replica is promoted and logs it
STREAM = "jsonlogs"
FAILOVER_STREAM = "jsonfailover"
REQUIRED_KEYS = {"ts", "level", "logger", "message", "node"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("json-logs") / "cluster", nodes=3,
                           node_args=lambda spec: ["--log-format", "json",
                                                   "--log-level", "DEBUG"])
    try:
        yield cluster.start_all()
    finally:
        cluster.stop_all()


def _lines(cluster: LocalCluster, i: int) -> list[dict[str, Any]]:
    """Node i's log, every line parsed (a line that is not JSON fails the test here)."""
    text = cluster.nodes[i].spec.log_path.read_text()
    return [json.loads(line) for line in text.splitlines()]


def _with_id(cluster: LocalCluster, i: int, request_id: str) -> list[dict[str, Any]]:
    return [line for line in _lines(cluster, i) if line.get("request_id") == request_id]


def test_a_forwarded_call_is_logged_under_one_request_id_on_both_nodes(
        cluster: LocalCluster) -> None:
    route = cluster_helpers.create(cluster, STREAM)
    primary = cluster.index_of(route.primary)
    via = next(i for i in sorted(cluster.running) if i != primary)
    request_id = f"test-{uuid.uuid4().hex[:12]}"

    ack, call = cluster.streams(via).Publish.with_call(
        streams_pb2.PublishRequest(stream=STREAM, subject="s", payload=b"traced"),
        metadata=[(logctx.REQUEST_ID_HEADER, request_id)], timeout=call_timeout_s)

    assert ack.seq > 0
    assert (logctx.REQUEST_ID_HEADER, request_id) in [tuple(m) for m in call.trailing_metadata()]
    wait_until(lambda: bool(_with_id(cluster, via, request_id))
               and bool(_with_id(cluster, primary, request_id)),
               log_timeout_s, what=f"lines of {request_id} on n{via} and n{primary}")
    for i in (via, primary):
        [line] = _with_id(cluster, i, request_id)
        assert line["node"] == cluster.nodes[i].spec.node_id
        assert line["method"] == "StreamsService.Publish" and line["stream"] == STREAM
        assert line["message"].startswith("StreamsService.Publish ended OK after ")


def test_a_call_without_a_request_id_gets_one_back(cluster: LocalCluster) -> None:
    _, call = cluster.streams(1).GetStreamInfo.with_call(
        streams_pb2.GetStreamInfoRequest(name=STREAM), timeout=call_timeout_s)
    [request_id] = [m.value for m in call.trailing_metadata()
                    if m.key == logctx.REQUEST_ID_HEADER]
    assert logctx.valid_request_id(request_id)


def test_every_line_of_every_node_log_is_json_with_the_required_keys(
        cluster: LocalCluster) -> None:
    for i in sorted(cluster.nodes):
        lines = _lines(cluster, i)
        assert len(lines) > 10
        for line in lines:
            assert set(line) >= REQUIRED_KEYS, line
            assert line["node"] == cluster.nodes[i].spec.node_id
        assert {line["logger"] for line in lines} >= {"raftlog.node.server", "asyncio"}


def test_a_node_that_cannot_start_logs_its_exception_as_json(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "raftlog.node.cli", "node", "--data", str(tmp_path / "a-file" / "d"),
         "--grpc", f"127.0.0.1:{_free_port()}", "--node-id", "broken", "--log-format", "json"],
        capture_output=True, text=True, timeout=start_failure_timeout_s, check=False)
    assert done.returncode != 0
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    [failure] = [line for line in lines if "exc" in line]
    assert failure["level"] == "CRITICAL" and failure["node"] == "broken"
    assert failure["exc"].startswith("Traceback") and "Error" in failure["exc"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _route(cluster: LocalCluster, i: int) -> cluster_pb2.RouteExplanation:
    answer: cluster_pb2.RouteExplanation = cluster.cluster(i).ExplainRoute(
        cluster_pb2.ExplainRouteRequest(stream=FAILOVER_STREAM), timeout=call_timeout_s)
    return answer


def test_the_new_primary_logs_its_promotion_with_the_stream_and_epoch(
        cluster: LocalCluster) -> None:
    old = cluster_helpers.create(cluster, FAILOVER_STREAM)
    killed = cluster.index_of(old.primary)
    asked = next(i for i in sorted(cluster.running) if i != killed)
    cluster.kill9(killed)
    moved: list[cluster_pb2.RouteExplanation] = []

    def promoted() -> bool:
        route = _route(cluster, asked)
        if route.primary in ("", old.primary) or route.fence_epoch <= old.fence_epoch:
            return False
        moved[:] = [route]
        return True

    wait_until(promoted, failover_timeout_s, what=f"{FAILOVER_STREAM} failed over")
    [route] = moved
    successor = cluster.index_of(route.primary)

    def leading() -> list[dict[str, Any]]:
        return [line for line in _lines(cluster, successor)
                if line["message"].startswith(f"leading stream {FAILOVER_STREAM} ")
                and line.get("epoch") == route.fence_epoch]

    wait_until(lambda: bool(leading()), log_timeout_s,
               what=f"n{successor} logging that it leads {FAILOVER_STREAM}")
    [line] = leading()
    assert line["stream"] == FAILOVER_STREAM and "request_id" not in line
    assert line["logger"] == "raftlog.node.cluster.coordinator"
