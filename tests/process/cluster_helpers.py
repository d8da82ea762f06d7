"""What the process tests share for driving a LocalCluster: creating a stream and waiting until
it is writable (tests/process/test_no_stuck_streams.py, test_elections.py, test_stuck_loop.py,
test_fast_answers.py), and reading routes and local copies (test_placement.py,
test_placement_counts.py), and the reason a call fails with (test_auth.py, test_user_quotas.py,
test_forward_restart.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc

from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.internal import replication_pb2, storage_pb2
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import cluster_pb2, streams_pb2, types_pb2

create_call_timeout_s = 10.0
probe_timeout_s = 0.5
placement_call_timeout_s = 15.0


def create(cluster: LocalCluster, name: str, *, via: int = 1) -> cluster_pb2.RouteExplanation:
    def created() -> bool:
        try:
            cluster.streams(via).CreateStream(streams_pb2.CreateStreamRequest(
                config=types_pb2.StreamConfig(name=name, replicas=3)),
                timeout=create_call_timeout_s)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return True

    wait_until(created, 15, interval_s=0.1, what=f"stream {name} created")
    reply = cluster.streams(via).PublishBatch(streams_pb2.PublishBatchRequest(
        stream=name, entries=[streams_pb2.PublishEntry(subject="s", payload=b"%d" % k)
                              for k in range(20)]), timeout=create_call_timeout_s)
    assert reply.acked == 20
    route: cluster_pb2.RouteExplanation = cluster.cluster(via).ExplainRoute(
        cluster_pb2.ExplainRouteRequest(stream=name), timeout=create_call_timeout_s)
    return route


def publish_once(cluster: LocalCluster, name: str, via: int) -> bool:
    try:
        cluster.streams(via).Publish(streams_pb2.PublishRequest(
            stream=name, subject="s", payload=b"probe"), timeout=probe_timeout_s)
    except grpc.RpcError:
        return False
    return True


def seconds_until_writable(cluster: LocalCluster, name: str, *, since: float,
                           via: list[int], bound_s: float) -> float:
    """Publishes through the nodes in turn until one is acknowledged; seconds since `since`."""
    deadline = since + bound_s
    k = 0
    while time.monotonic() < deadline:
        if publish_once(cluster, name, via[k % len(via)]):
            return time.monotonic() - since
        k += 1
        time.sleep(0.02)
    raise AssertionError(f"{name} took no write within {bound_s} s")


def route(cluster: LocalCluster, stream: str) -> cluster_pb2.RouteExplanation:
    answer: cluster_pb2.RouteExplanation = cluster.cluster(1).ExplainRoute(
        cluster_pb2.ExplainRouteRequest(stream=stream), timeout=placement_call_timeout_s)
    return answer


def local_copy(cluster: LocalCluster, i: int, stream: str) -> dict[int, bytes]:
    reply = cluster.replication(i).ReadLocal(
        replication_pb2.ReadLocalRequest(stream=stream, limit=10_000),
        timeout=placement_call_timeout_s)
    return {m.seq: storage_pb2.StoredMessage.FromString(m.stored).payload
            for m in reply.messages}


def error_reason(call: Callable[[], Any]) -> Reason | None:
    """The ErrorInfo reason `call` fails with (it must carry one), None when it succeeds."""
    try:
        call()
    except grpc.RpcError as err:
        raised = from_rpc_error(err)  # type: ignore[arg-type]
        assert raised is not None, f"no ErrorInfo: {err}"
        return raised.reason
    return None
