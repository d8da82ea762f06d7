"""Issue 11, item 5: the cluster's client-streaming `PublishStream` maps errors per message.

Seen: a NO_QUORUM from one stream's commit reached the client as UNKNOWN, and the results of
every other message of the call were lost with it. Now the stream that cannot commit gets its
error on each of its messages (with the catalogued reason), and the other streams of the same
call are acknowledged.

The primary of an R3 stream loses its replicas (SIGSTOP of the other two nodes, whose
connections stay open as under a silent partition); an R1 stream on the same node still
commits on its own.
"""

from __future__ import annotations

import os
import signal
import time

from raftlog.base import limits
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.v1 import cluster_pb2, streams_pb2, types_pb2

call_timeout_s = 10.0
creates_max = 24  # R1 streams created until one lands on the R3 stream's primary
messages_each = 5


def _route(cluster: LocalCluster, name: str) -> cluster_pb2.RouteExplanation:
    route: cluster_pb2.RouteExplanation = cluster.cluster(1).ExplainRoute(
        cluster_pb2.ExplainRouteRequest(stream=name), timeout=call_timeout_s)
    return route


def _create(cluster: LocalCluster, name: str, replicas: int) -> cluster_pb2.RouteExplanation:
    cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(
        name=name, replicas=replicas)), timeout=call_timeout_s)
    wait_until(lambda: _route(cluster, name).primary != "", 10, what=f"{name} placed")
    return _route(cluster, name)


def test_a_stream_that_cannot_commit_fails_alone_with_its_reason(cluster3: LocalCluster) -> None:
    cluster3.wait_for_leader(10)
    shared = _create(cluster3, "shared", 3)
    for k in range(creates_max):
        alone = _create(cluster3, f"alone{k}", 1)
        if alone.primary == shared.primary:
            break
    else:
        raise AssertionError(f"no R1 stream landed on {shared.primary} in {creates_max} tries")
    primary = cluster3.index_of(shared.primary)
    others = [i for i in (1, 2, 3) if i != primary]
    requests = [streams_pb2.PublishRequest(stream=name, subject="s", payload=b"x",
                                           msg_id=f"{name}-{n}")
                for n in range(messages_each) for name in ("shared", alone.stream)]
    for i in others:
        os.kill(cluster3.node(i).pid, signal.SIGSTOP)
    try:
        time.sleep(limits.primary_lease_s * 2)  # the R3 stream's lease runs out
        reply = cluster3.streams(primary).PublishStream(iter(requests), timeout=call_timeout_s)
    finally:
        for i in others:
            os.kill(cluster3.node(i).pid, signal.SIGCONT)
    assert len(reply.results) == len(requests), reply
    for request, result in zip(requests, reply.results, strict=True):
        if request.stream == "shared":
            assert result.HasField("error"), f"{request.msg_id} acknowledged: {result}"
            assert result.error.reason in ("NO_QUORUM", "NOT_PRIMARY"), result.error
        else:
            assert not result.HasField("error"), f"{request.msg_id} failed: {result.error}"
            assert result.ack.seq > 0
    assert (reply.acked, reply.failed) == (messages_each, messages_each)
