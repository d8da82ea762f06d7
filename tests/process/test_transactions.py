"""Transactions end to end on a real 3-process cluster (one cluster for the module): a
prepared message out of sight until its commit, which stores it once however often it is asked
and through whichever node; rollback and the refusals; the listing with ages; the server's
timeout; a topic partition as the target; the CLI; and (last) a kill -9 of the half stream's
primary between prepare and commit, after which the commit, retried through another node,
still stores the message exactly once.

Processes are signalled by pid through LocalCluster, which stops them all afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from raftlog.base import topics
from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.node.ops import transactions_layout as layout
from raftlog.node.ops.partitions import partition_for_key
from raftlog.node.transport.rpc import from_rpc_error, grpc_status
from raftlog.v1 import (
    cluster_pb2,
    streams_pb2,
    topics_pb2,
    topics_pb2_grpc,
    transactions_pb2,
    transactions_pb2_grpc,
    types_pb2,
)

call_timeout_s = 10.0
ready_timeout_s = 20.0
janitor_timeout_s = 15.0
failover_timeout_s = 30.0
cli_timeout_s = 60.0
STREAM = "orders"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    made = LocalCluster(tmp_path_factory.mktemp("txn") / "cluster", nodes=3)
    try:
        made.start_all()
        retry_unavailable(lambda: made.streams(1).CreateStream(streams_pb2.CreateStreamRequest(
            config=types_pb2.StreamConfig(name=STREAM, subjects=["orders.>"], replicas=3)),
            timeout=call_timeout_s), what="stream created")
        yield made
    finally:
        made.stop_all()


def retry_unavailable(call: Any, *, what: str, timeout_s: float = ready_timeout_s) -> Any:
    """`call()`, again while the cluster answers UNAVAILABLE (a new stream's first lease, a
    failover), bounded."""
    answers: list[Any] = []

    def answered() -> bool:
        try:
            answers.append(call())
        except grpc.RpcError as err:
            if err.code() not in (grpc.StatusCode.UNAVAILABLE,
                                  grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            return False
        return True

    wait_until(answered, timeout_s, interval_s=0.1, what=what)
    return answers[-1]


def api(cluster: LocalCluster, i: int) -> Any:
    return transactions_pb2_grpc.TransactionsStub(cluster.channel(i))  # type: ignore[no-untyped-call]


def prepare(cluster: LocalCluster, i: int, payload: bytes, **fields: Any
            ) -> transactions_pb2.PrepareResponse:
    if "topic" not in fields:
        fields.setdefault("stream", STREAM)
        fields.setdefault("subject", "orders.eu")
    return retry_unavailable(lambda: api(cluster, i).Prepare(transactions_pb2.PrepareRequest(
        payload=payload, **fields), timeout=call_timeout_s), what="prepared")


def commit(cluster: LocalCluster, i: int, txn_id: str) -> transactions_pb2.CommitResponse:
    reply: transactions_pb2.CommitResponse = api(cluster, i).Commit(
        transactions_pb2.CommitRequest(txn_id=txn_id), timeout=call_timeout_s)
    return reply


def listed(cluster: LocalCluster, i: int, **fields: Any) -> list[transactions_pb2.TransactionInfo]:
    reply = api(cluster, i).ListTransactions(transactions_pb2.ListTransactionsRequest(**fields),
                                             timeout=call_timeout_s)
    return list(reply.transactions)


def expect_error(call: Any, request: object, reason: Reason) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=call_timeout_s)
    assert info.value.code() == grpc_status(reason), info.value.details()
    err = from_rpc_error(info.value)
    assert err is not None and err.reason is reason, info.value.details()


def copies(cluster: LocalCluster, i: int, txn_id: str, stream: str = STREAM) -> list[int]:
    """The seqs of `stream` holding the message committed by `txn_id`."""
    read = cluster.streams(i).ReadMessages(streams_pb2.ReadMessagesRequest(
        stream=stream, limit=1000), timeout=call_timeout_s)
    return [m.seq for m in read.messages if layout.is_landing_of(m, txn_id)]


def stored(cluster: LocalCluster, i: int, stream: str = STREAM) -> int:
    info = cluster.streams(i).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name=stream),
                                            timeout=call_timeout_s)
    messages: int = info.state.messages
    return messages


def test_a_prepared_message_is_out_of_sight_until_committed_once(
        cluster: LocalCluster) -> None:
    before = stored(cluster, 2)
    txn = prepare(cluster, 1, b"hello", msg_id="order-1")
    assert txn.stream == STREAM and txn.txn_id.startswith("TXN_orders:")
    assert stored(cluster, 2) == before
    assert copies(cluster, 3, txn.txn_id) == []
    (info,) = [t for t in listed(cluster, 3, stream=STREAM) if t.txn_id == txn.txn_id]
    assert (info.msg_id, info.subject, info.payload_bytes) == ("order-1", "orders.eu", 5)
    assert 0 <= info.age_ms < 60_000 and info.timeout_ms == 60_000 and not info.committing
    first = commit(cluster, 2, txn.txn_id)
    again = commit(cluster, 3, txn.txn_id)
    assert not first.duplicate and again.duplicate and first.seq == again.seq
    assert copies(cluster, 1, txn.txn_id) == [first.seq]
    assert stored(cluster, 1) == before + 1
    assert txn.txn_id not in [t.txn_id for t in listed(cluster, 1)]


def test_rollback_discards_and_wrong_ends_are_refused(cluster: LocalCluster) -> None:
    txn = prepare(cluster, 2, b"dropped")
    stub = api(cluster, 3)
    reply = stub.Rollback(transactions_pb2.RollbackRequest(txn_id=txn.txn_id),
                          timeout=call_timeout_s)
    assert not reply.duplicate
    assert stub.Rollback(transactions_pb2.RollbackRequest(txn_id=txn.txn_id),
                         timeout=call_timeout_s).duplicate
    expect_error(stub.Commit, transactions_pb2.CommitRequest(txn_id=txn.txn_id),
                 Reason.TRANSACTION_NOT_FOUND)
    assert copies(cluster, 1, txn.txn_id) == []
    expect_error(stub.Commit, transactions_pb2.CommitRequest(txn_id="TXN_orders:999999"),
                 Reason.TRANSACTION_NOT_FOUND)
    expect_error(stub.Commit, transactions_pb2.CommitRequest(txn_id="no-such-id"),
                 Reason.INVALID_ARGUMENT)
    done = prepare(cluster, 1, b"kept")
    commit(cluster, 1, done.txn_id)
    expect_error(stub.Rollback, transactions_pb2.RollbackRequest(txn_id=done.txn_id),
                 Reason.TRANSACTION_ENDED)
    expect_error(stub.Prepare, transactions_pb2.PrepareRequest(
        stream=STREAM, subject="payments.x", payload=b"x"), Reason.SUBJECT_NOT_IN_STREAM)
    expect_error(stub.Prepare, transactions_pb2.PrepareRequest(
        stream="no-such-stream", subject="a", payload=b"x"), Reason.STREAM_NOT_FOUND)


def test_the_server_rolls_back_what_times_out(cluster: LocalCluster) -> None:
    txn = prepare(cluster, 3, b"late", timeout_ms=1_000)
    wait_until(lambda: txn.txn_id not in [t.txn_id for t in listed(cluster, 1)],
               janitor_timeout_s, interval_s=0.2, what="the janitor rolled it back")
    expect_error(api(cluster, 2).Commit, transactions_pb2.CommitRequest(txn_id=txn.txn_id),
                 Reason.TRANSACTION_NOT_FOUND)
    assert copies(cluster, 1, txn.txn_id) == []


def test_a_topic_partition_is_a_target(cluster: LocalCluster) -> None:
    stub = topics_pb2_grpc.TopicsStub(cluster.channel(1))  # type: ignore[no-untyped-call]
    retry_unavailable(lambda: stub.CreateTopic(topics_pb2.CreateTopicRequest(
        name="pay.t", partitions=3, config=types_pb2.StreamConfig(replicas=3)),
        timeout=call_timeout_s), what="topic created")
    txn = prepare(cluster, 2, b"paid", topic="pay.t", key=b"customer-7")
    partition = partition_for_key(b"customer-7", 3)
    target = topics.partition_stream("pay.t", partition)
    assert (txn.stream, txn.partition) == (target, partition)
    assert [t.txn_id for t in listed(cluster, 3, topic="pay.t")] == [txn.txn_id]
    assert copies(cluster, 1, txn.txn_id, target) == []
    landed = commit(cluster, 3, txn.txn_id)
    assert landed.stream == target and copies(cluster, 1, txn.txn_id, target) == [landed.seq]


def cli(cluster: LocalCluster, *args: str) -> Any:
    env = {**os.environ, "RAFTLOG_SERVER": cluster.address(2)}
    done = subprocess.run([sys.executable, "-m", "raftlog.node.cli", *args, "--json"],
                          capture_output=True, text=True, timeout=cli_timeout_s, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_cli_prepares_lists_commits_and_rolls_back(cluster: LocalCluster) -> None:
    made = cli(cluster, "txn", "prepare", STREAM, "from-cli", "--subject", "orders.cli",
               "--header", "a=b")
    dropped = prepare(cluster, 1, b"dropped", subject="orders.cli").txn_id
    open_ids = [t["txn_id"] for t in cli(cluster, "txn", "ls", STREAM)["transactions"]]
    assert made["txn_id"] in open_ids and dropped in open_ids
    landed = cli(cluster, "txn", "commit", made["txn_id"])
    assert copies(cluster, 1, made["txn_id"]) == [int(landed["seq"])]
    rolled = cli(cluster, "txn", "rollback", dropped)
    assert (rolled["txn_id"], rolled["duplicate"]) == (dropped, False)
    still_open = [t.txn_id for t in listed(cluster, 3)]
    assert made["txn_id"] not in still_open and dropped not in still_open


def test_a_commit_after_a_kill9_of_the_half_primary_lands_once(cluster: LocalCluster) -> None:
    half = layout.half_stream(STREAM)
    route = cluster.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(stream=half),
                                            timeout=call_timeout_s)
    victim = cluster.index_of(route.primary)
    others = [i for i in (1, 2, 3) if i != victim]
    txn = prepare(cluster, others[0], b"survives")
    cluster.kill9(victim)
    first = retry_unavailable(lambda: commit(cluster, others[1], txn.txn_id),
                              what="commit after the kill", timeout_s=failover_timeout_s)
    again = retry_unavailable(lambda: commit(cluster, others[0], txn.txn_id),
                              what="commit again", timeout_s=failover_timeout_s)
    assert again.seq == first.seq and again.duplicate
    assert retry_unavailable(lambda: copies(cluster, others[0], txn.txn_id),
                             what="read back", timeout_s=failover_timeout_s) == [first.seq]
