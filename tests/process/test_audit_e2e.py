"""The audit end to end (issue 13): a real 3-node cluster with traffic and a consumer that acked
it all; divergences injected into the stopped nodes' RocksDB (tests/audit_divergence.py): record
divergences, a tail every copy lost (the consumer's committed state now points past the log),
and a stale record in one node's own consumer store; `raftlog audit export` offline and
`raftlog audit run` (Spark, local) find each one where it is; the nodes start again,
`raftlog audit repair` shows the plan (dry run: nothing changes) and applies it through the peer
API (records, the store copy) and the admin API (the consumer's state, set through Raft); an
online export audits clean. Every step runs the real command in its own process.

The offline export is audited on a local Spark standalone cluster too (`raftlog audit cluster
up`, `--master spark://...`, `cluster down`), with the same findings.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from raftlog.audit.export_client import Member
from raftlog.audit.peers import PeerNode
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import cluster_pb2, consumers_pb2, streams_pb2, types_pb2
from tests import audit_divergence as inject

STREAM = "orders"
CONSUMER = "billing"
BATCHES, PER_BATCH = 4, 25  # 100 messages
KEPT = 90  # every copy loses seqs 91-100 (the consumer acked them all)
call_timeout_s = 10.0
command_timeout_s = 240.0
restart_timeout_s = 30.0  # one `raftlog audit ...` process (a Spark session start included)


def audit(*argv: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    return finish(start(*argv), ok=ok)


def start(*argv: str) -> subprocess.Popen[str]:
    """`raftlog audit ARGV` started in its own process; `finish` waits for it."""
    return subprocess.Popen([sys.executable, "-m", "raftlog.audit", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL,
                            env={**os.environ, "RAFTLOG_SECRET_FILE": ""})


def finish(running: subprocess.Popen[str], *, ok: tuple[int, ...] = (0,)
           ) -> subprocess.CompletedProcess[str]:
    """Its outcome, once it ended (killed past command_timeout_s); its status must be in `ok`."""
    try:
        stdout, stderr = running.communicate(timeout=command_timeout_s)
    finally:
        stop_running([running])
    assert running.returncode in ok, (running.args, running.returncode, stdout, stderr)
    return subprocess.CompletedProcess(running.args, running.returncode, stdout, stderr)


def finish_all(started: list[subprocess.Popen[str]], *, ok: tuple[int, ...] = (0,)
               ) -> list[subprocess.CompletedProcess[str]]:
    """`finish` of each in turn; when one fails, the others still running are killed."""
    try:
        return [finish(running, ok=ok) for running in started]
    finally:
        stop_running(started)


def stop_running(started: list[subprocess.Popen[str]]) -> None:
    """Kills and reaps each process that has not ended (a failure or a timeout before it)."""
    for running in started:
        if running.poll() is None:
            running.kill()
            running.communicate()


def divergences(report: Path) -> set[tuple[str, str, int]]:
    """(class, node, first seq) of every divergence of the stream in a JSON report."""
    found = json.loads(report.read_text())
    return {(row["class"], row["node"], int(row["first_seq"] or 0)) for row in found["divergences"]
            if row["stream"] == STREAM}


@contextmanager
def standalone_cluster(tmp_path: Path) -> Iterator[Callable[[], str]]:
    """A local Spark standalone cluster (`raftlog audit cluster up`, then `cluster down`),
    started at once in the background; the function given waits for it: its master's URL."""
    spark_dir = tmp_path / "spark-cluster"
    starting = start("cluster", "up", "--dir", str(spark_dir))

    def master() -> str:
        url = finish(starting).stdout.split()[-1]  # its last line: the master's URL
        assert url.startswith("spark://127.0.0.1:"), url
        return url
    try:
        yield master
    finally:
        if starting.poll() is None:  # still starting: `down` needs what `up` records
            with contextlib.suppress(subprocess.TimeoutExpired):
                starting.communicate(timeout=command_timeout_s)
            stop_running([starting])
        if starting.returncode == 0:
            audit("cluster", "down", "--dir", str(spark_dir))


def run_on_standalone(export: Path, master: str, out: Path) -> subprocess.Popen[str]:
    """`raftlog audit run` of the export on the standalone cluster at `master`, started."""
    return start("run", "--input", str(export), "--out", str(out), "--master", master)


def standalone_findings(done: subprocess.CompletedProcess[str], master: str, out: Path
                        ) -> set[tuple[str, str, int]]:
    """What the audit on the standalone cluster found (checking that it ran there)."""
    assert STREAM in done.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["spark"]["master"] == master, report["spark"]
    return divergences(out / "report.json")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    made = LocalCluster(tmp_path_factory.mktemp("audit-e2e") / "cluster", nodes=3)
    try:
        made.start_all()
        made.streams(1).CreateStream(streams_pb2.CreateStreamRequest(
            config=types_pb2.StreamConfig(name=STREAM, replicas=3, subjects=["orders.>"])),
            timeout=call_timeout_s)
        for batch in range(BATCHES):  # through every node: forwarded and local publishes
            reply = made.streams(batch % 3 + 1).PublishBatch(streams_pb2.PublishBatchRequest(
                stream=STREAM, entries=[streams_pb2.PublishEntry(
                    subject=f"orders.k{k % 4}", payload=b"%d-%d" % (batch, k),
                    msg_id=f"m{batch}-{k}") for k in range(PER_BATCH)]), timeout=call_timeout_s)
            assert reply.acked == PER_BATCH
        made.consumers(2).CreateConsumer(consumers_pb2.CreateConsumerRequest(
            stream=STREAM, config=consumers_pb2.ConsumerConfig(name=CONSUMER)),
            timeout=call_timeout_s)
        fetched = made.consumers(3).Fetch(consumers_pb2.FetchRequest(
            stream=STREAM, consumer=CONSUMER, batch=BATCHES * PER_BATCH), timeout=call_timeout_s)
        seqs = [message.seq for message in fetched.messages]
        assert seqs == list(range(1, BATCHES * PER_BATCH + 1))
        acked = made.consumers(1).Ack(consumers_pb2.AckRequest(
            stream=STREAM, consumer=CONSUMER, seqs=seqs), timeout=call_timeout_s)
        assert acked.applied == len(seqs)
        yield made
    finally:
        made.stop_all()


def replicas_and_primary(cluster: LocalCluster) -> tuple[str, list[str]]:
    route = cluster.cluster(1).ExplainRoute(cluster_pb2.ExplainRouteRequest(stream=STREAM),
                                            timeout=call_timeout_s)
    others = sorted({f"n{i}" for i in (1, 2, 3)} - {route.primary})
    return route.primary, others


def peer(cluster: LocalCluster, node: str) -> PeerNode:
    status = cluster.cluster(1).GetClusterStatus(cluster_pb2.GetClusterStatusRequest(),
                                                 timeout=call_timeout_s)
    member = next(n for n in status.nodes if n.node_id == node)
    return PeerNode(Member(member.node_id, member.grpc_address, member.peer_address),
                    cluster.credential())


def wait_replicas_equal(cluster: LocalCluster, last_seq: int) -> None:
    def equal() -> bool:
        states = []
        for node in ("n1", "n2", "n3"):
            access = peer(cluster, node)
            try:
                states.append(access.state(STREAM).last_seq)
            finally:
                access.close()
        return states == [last_seq] * 3

    wait_until(equal, 20.0, what=f"every copy of {STREAM!r} at seq {last_seq}")


def wait_committed(cluster: LocalCluster, seq: int) -> None:
    """Until the node serving the stream (after the restart, maybe another) committed `seq`."""
    def committed() -> bool:
        for node in ("n1", "n2", "n3"):
            access = peer(cluster, node)
            try:
                state = access.state(STREAM)
            finally:
                access.close()
            if state.serving and state.commit_seq >= seq:
                return True
        return False

    wait_until(committed, 20.0, what=f"the primary of {STREAM!r} committed seq {seq}")


@pytest.mark.timeout(600)  # four Spark and export processes; about 90 s on an idle machine
def test_divergences_are_found_repaired_through_the_peer_api_and_audit_clean(
        cluster: LocalCluster, tmp_path: Path) -> None:
    total = BATCHES * PER_BATCH
    wait_replicas_equal(cluster, total)
    primary, (first, second) = replicas_and_primary(cluster)
    cluster.stop_all()
    dirs = {f"n{i}": cluster.spec(i).data_dir for i in (1, 2, 3)}
    for data_dir in dirs.values():
        inject.cut_tail(data_dir, STREAM, after_seq=KEPT)
    total = KEPT
    inject.set_store_consumer(dirs[first], STREAM, CONSUMER, delivered_seq=50, ack_floor=40)
    inject.make_hole(dirs[first], STREAM, seq=10)
    inject.change_content(dirs[first], STREAM, seq=20, payload=b"not what was acked")
    inject.change_epoch(dirs[second], STREAM, seq=30, epoch=7)
    tail = inject.append_tail(dirs[second], STREAM, count=3)

    # The offline steps (no node runs) overlap: the Spark standalone cluster starts while the
    # three exports run at once; the local audit and the one on the standalone cluster run
    # side by side.
    offline = tmp_path / "offline"
    with standalone_cluster(tmp_path) as standalone_master:
        finish_all([start("export", "--data-dir", str(data_dir), "--node-id", node, "--out",
                          str(offline)) for node, data_dir in dirs.items()])
        found_dir, standalone_dir = tmp_path / "found", tmp_path / "found-standalone"
        started = [start("run", "--input", str(offline), "--out", str(found_dir), "--master",
                         "local[2]")]
        try:
            master = standalone_master()
            started.append(run_on_standalone(offline, master, standalone_dir))
            done, on_standalone = finish_all(started, ok=(1,))
        finally:
            stop_running(started)
    assert STREAM in done.stdout
    found = divergences(found_dir / "report.json")
    expected = {("HOLE", first, 10), ("CONTENT", first, 20), ("EPOCH", second, 30),
                ("EXTRA_TAIL", second, tail[0]), ("CONSUMER", first, 0), ("CONSUMER", second, 0),
                ("CONSUMER", primary, 0)}  # the store copy, and every metadata copy: past 90
    assert expected <= found, found
    assert primary not in {node for cls, node, _ in found if cls != "CONSUMER"}, \
        "the primary's copy is fine"
    plan = found_dir / "plan.json"
    planned = json.loads(plan.read_text())["actions"]
    consumer_steps = {(a["holder"], a["ack_floor"]) for a in planned if a["action"] == "consumer"}
    assert consumer_steps == {("raft", KEPT), ("store", KEPT)}, planned
    assert standalone_findings(on_standalone, master, standalone_dir) == found, \
        "the same findings on a cluster"

    for i in (1, 2, 3):  # the same ports and data again
        cluster.start(i)
    cluster.wait_for_leader(restart_timeout_s)
    secret = str(cluster.secret_path)
    dry = audit("repair", "--plan", str(plan), "--cluster", cluster.address(1),
                "--secret-file", secret)
    assert "would do" in dry.stdout and "done" not in dry.stdout.split()
    hole = peer(cluster, first)
    try:
        assert [m.seq for m in hole.read(STREAM, 9, 11)] == [9, 11], "a dry run changes nothing"
    finally:
        hole.close()

    wait_committed(cluster, total)  # a consumer is never set past the primary's commit seq
    applied = json.loads(audit("repair", "--plan", str(plan), "--cluster", cluster.address(1),
                               "--secret-file", secret, "--apply", "--json",
                               ok=(0, 1)).stdout)["steps"]
    # A step may find its copy moved by the restart (COPY_CHANGED: replication may already
    # have cut the old tail); every other step is done, and the audit below decides.
    assert all(step["status"] == "done" or "COPY_CHANGED" in step["detail"]
               for step in applied), [(s["node"], s["action"], s["detail"]) for s in applied]
    assert {(step["node"], step["status"]) for step in applied} >= {(first, "done")}, applied
    assert [s["status"] for s in applied if s["action"] == "consumer"] == ["done", "done"]
    wait_replicas_equal(cluster, total)
    # The admin call on the wire, through a node that forwards it to the primary: a consumer is
    # never set past the commit seq, and the refusal says why.
    with pytest.raises(grpc.RpcError) as refused:
        cluster.cluster(cluster.index_of(first)).SetConsumerState(
            cluster_pb2.SetConsumerStateRequest(stream=STREAM, consumer=CONSUMER,
                                                delivered_seq=total + 1, ack_floor=total),
            timeout=call_timeout_s)
    assert refused.value.code() == grpc.StatusCode.OUT_OF_RANGE, refused.value
    reason = from_rpc_error(refused.value)
    assert reason is not None and reason.reason.name == "PAST_COMMITTED_END"

    online = tmp_path / "online"
    audit("export", "--cluster", cluster.address(2), "--secret-file", secret, "--out",
          str(online))
    clean_dir = tmp_path / "clean"
    again = audit("run", "--input", str(online), "--out", str(clean_dir), "--master",
                  "local[2]", ok=(0,))
    assert divergences(clean_dir / "report.json") == set(), again.stdout

