"""Issue 10, item 7: isolated nodes answer fast. A primary that cannot renew its lease, and a
node that cannot reach the primary or the Raft leader, answer UNAVAILABLE (a retryable reason)
within about the lease, instead of letting calls run into the client's deadline.

Isolation here is SIGSTOP of the others (they stop answering; connections stay open, as a
silent network partition leaves them).
"""

from __future__ import annotations

import os
import signal
import time

import grpc
import pytest

from raftlog.base import limits
from raftlog.chaos.cluster import LocalCluster
from raftlog.v1 import streams_pb2, types_pb2
from tests.process.cluster_helpers import create

client_deadline_s = 10.0
answer_within_s = 3 * limits.primary_lease_s  # the lease, checks and a scheduling margin


def publish(cluster: LocalCluster, i: int, stream: str) -> tuple[str, float]:
    """(status name, seconds) of one publish with a long client deadline."""
    started = time.monotonic()
    try:
        cluster.streams(i).Publish(streams_pb2.PublishRequest(
            stream=stream, subject="s", payload=b"x", msg_id=f"m{started}"),
            timeout=client_deadline_s)
    except grpc.RpcError as err:
        return err.code().name, time.monotonic() - started
    return "OK", time.monotonic() - started


def test_an_isolated_primary_refuses_writes_within_its_lease(cluster3: LocalCluster) -> None:
    route = create(cluster3, "isolated")
    primary = cluster3.index_of(route.primary)
    others = [i for i in (1, 2, 3) if i != primary]
    for i in others:
        os.kill(cluster3.node(i).pid, signal.SIGSTOP)
    try:
        time.sleep(limits.primary_lease_s * 2)  # its lease runs out
        answers = [publish(cluster3, primary, "isolated") for _ in range(3)]
        create_started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            cluster3.streams(primary).CreateStream(streams_pb2.CreateStreamRequest(
                config=types_pb2.StreamConfig(name="meanwhile")), timeout=client_deadline_s)
        create_took = time.monotonic() - create_started
    finally:
        for i in others:
            os.kill(cluster3.node(i).pid, signal.SIGCONT)
    print(f"publishes on the isolated primary: {answers}; a metadata call: "
          f"{info.value.code().name} in {create_took:.2f} s")
    assert all(code == "UNAVAILABLE" and took < answer_within_s for code, took in answers)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and create_took < answer_within_s


def test_a_node_that_cannot_reach_the_primary_answers_fast(cluster3: LocalCluster) -> None:
    route = create(cluster3, "far")
    # The cluster became ready once each node had heard from the others (wait_ready): a member
    # a node never heard from gets the longest allowance, 3 s, before it counts as unreachable.
    primary = cluster3.index_of(route.primary)
    through = next(i for i in (1, 2, 3) if i != primary)
    os.kill(cluster3.node(primary).pid, signal.SIGSTOP)
    try:
        answers = []
        until = time.monotonic() + 3.0  # before, during and after the failover
        while time.monotonic() < until:
            answers.append(publish(cluster3, through, "far"))
    finally:
        os.kill(cluster3.node(primary).pid, signal.SIGCONT)
    codes = [code for code, _ in answers]
    print(f"{len(answers)} publishes through {through} while the primary is stopped: "
          f"{codes.count('UNAVAILABLE')} UNAVAILABLE then {codes.count('OK')} OK, the slowest "
          f"answered in {max(took for _, took in answers):.3f} s")
    assert all(took < answer_within_s for _, took in answers), answers
    assert {code for code, _ in answers} <= {"OK", "UNAVAILABLE"}
    assert answers[-1][0] == "OK"  # the failover replaced the primary meanwhile
