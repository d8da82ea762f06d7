"""Issue 10, items 1-3: the node-to-node surfaces are sealed.

- the Replication service (Replicate, GetReplicaState, ReadLocal, Ping, Survey) is not on the
  client port, and on the peer listener a call without the cluster credential (or signed with
  another secret) is UNAUTHENTICATED and changes nothing (the forged append, the 50 removed
  messages and the frozen stream of the issue);
- Raft is never open: a node with Raft needs a strong secret, `cluster up` makes one (0600),
  and strangers who send a member's address as their first frame take nothing over;
- membership changes cannot break quorum: joining addresses where no node runs fails with
  NODE_UNREACHABLE and the cluster keeps its leader; admin calls need the credential.
"""

from __future__ import annotations

import os
import pickle
import socket
import stat
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import grpc
import pytest

from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import free_port, wait_until
from raftlog.internal import raft_pb2, replication_pb2, replication_pb2_grpc
from raftlog.node.transport.credentials import PEER_TOKEN_HEADER, Credential, estimate_entropy_bits
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import cluster_pb2, cluster_pb2_grpc, streams_pb2, types_pb2

call_timeout_s = 10.0
stranger_frames = 20  # first frames each stranger connection sends
leader_kept_s = 5.0  # the cluster must keep a leader this long under the strangers


def reason_of(call: object, *args: object, **kwargs: object) -> Reason:
    try:
        call(*args, **kwargs)  # type: ignore[operator]
    except grpc.RpcError as err:
        found = from_rpc_error(err)
        assert found is not None, err
        return found.reason
    raise AssertionError("the call succeeded")


def make_stream(cluster: LocalCluster, name: str, *, messages: int) -> cluster_pb2.RouteExplanation:
    cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(
        config=types_pb2.StreamConfig(name=name, replicas=3)), timeout=call_timeout_s)
    cluster.streams(2).PublishBatch(streams_pb2.PublishBatchRequest(stream=name, entries=[
        streams_pb2.PublishEntry(subject="s", payload=b"%d" % k) for k in range(messages)]),
        timeout=call_timeout_s)
    route: cluster_pb2.RouteExplanation = cluster.cluster(1).ExplainRoute(
        cluster_pb2.ExplainRouteRequest(stream=name), timeout=call_timeout_s)
    return route


def forged_batch(stream: str, *, epoch: int, first_seq: int) -> replication_pb2.ReplicateRequest:
    return replication_pb2.ReplicateRequest(
        stream=stream, epoch=epoch, primary="stranger", first_seq=first_seq,
        removed=[replication_pb2.SeqRange(first=1, last=50)], request_id=1)


def test_node_to_node_services_are_not_served_on_the_client_port(cluster3: LocalCluster) -> None:
    route = make_stream(cluster3, "sealed", messages=5)
    replica = next(n for n in route.replicas if n != route.primary)
    stub = replication_pb2_grpc.ReplicationStub(
        grpc.insecure_channel(cluster3.address(cluster3.index_of(replica))))
    calls = [
        (stub.GetReplicaState, replication_pb2.GetReplicaStateRequest(stream="sealed",
                                                                      fence_epoch=99)),
        (stub.ReadLocal, replication_pb2.ReadLocalRequest(stream="sealed")),
        (stub.Ping, replication_pb2.PingRequest(from_node="x")),
        (stub.Survey, replication_pb2.SurveyRequest()),
    ]
    for call, request in calls:
        with pytest.raises(grpc.RpcError) as info:
            call(request, timeout=call_timeout_s)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Replicate(iter([forged_batch("sealed", epoch=1, first_seq=6)]),
                            timeout=call_timeout_s))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize("signed_with", ["nothing", "another secret", "a stale token"])
def test_peer_calls_without_the_cluster_credential_change_nothing(
    cluster3: LocalCluster, signed_with: str
) -> None:
    route = make_stream(cluster3, "kept", messages=50)
    replica = cluster3.index_of(next(n for n in route.replicas if n != route.primary))
    channel = grpc.insecure_channel(cluster3.peer_address(replica))
    stub = replication_pb2_grpc.ReplicationStub(channel)

    def replica_state() -> replication_pb2.ReplicaState:
        state: replication_pb2.ReplicaState = cluster3.replication(replica).GetReplicaState(
            replication_pb2.GetReplicaStateRequest(stream="kept"), timeout=call_timeout_s)
        return state

    wait_until(lambda: replica_state().last_seq == 50, 10, what="the replica holds all 50")
    before = replica_state()

    def metadata(method: str) -> tuple[tuple[str, str], ...]:
        path = f"/raftlog.internal.Replication/{method}"
        if signed_with == "nothing":
            return ()
        if signed_with == "another secret":
            return ((PEER_TOKEN_HEADER, Credential("f" * 8 + os.urandom(32).hex()).token(
                principal="n9", method=path)),)
        token = cluster3.credential().token(principal="n9", method=path).split(".")
        token[2] = str(int(token[2]) - 3_600_000)  # an hour old; the mac no longer matches
        return ((PEER_TOKEN_HEADER, ".".join(token)),)

    refused = []
    for call, request, method in [
        (stub.GetReplicaState, replication_pb2.GetReplicaStateRequest(
            stream="kept", fence_epoch=route.fence_epoch + 1), "GetReplicaState"),
        (stub.Survey, replication_pb2.SurveyRequest(streams=[replication_pb2.SurveyItem(
            stream="kept", fence_epoch=route.fence_epoch + 5)]), "Survey"),
        (stub.ReadLocal, replication_pb2.ReadLocalRequest(stream="kept"), "ReadLocal"),
        (stub.Ping, replication_pb2.PingRequest(from_node="n9"), "Ping"),
        (stub.Repair, replication_pb2.RepairRequest(stream="kept", truncate_after=0), "Repair"),
    ]:
        refused.append(reason_of(call, request, timeout=call_timeout_s,
                                 metadata=metadata(method)))
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Replicate(iter([forged_batch("kept", epoch=route.fence_epoch + 1,
                                               first_seq=51)]),
                            timeout=call_timeout_s, metadata=metadata("Replicate")))
    refused.append(from_rpc_error(info.value).reason)  # type: ignore[union-attr]
    assert refused == [Reason.UNAUTHENTICATED] * 6
    after = replica_state()
    assert (after.epoch, after.fenced_epoch, after.first_seq, after.last_seq) == (
        before.epoch, before.fenced_epoch, before.first_seq, before.last_seq)
    # The stream still takes writes, and every message is where it was.
    reply = cluster3.streams(3).PublishBatch(streams_pb2.PublishBatchRequest(
        stream="kept", entries=[streams_pb2.PublishEntry(subject="s", payload=b"more")]),
        timeout=call_timeout_s)
    assert reply.acked == 1
    info_ = cluster3.streams(1).GetStreamInfo(streams_pb2.GetStreamInfoRequest(name="kept"),
                                              timeout=call_timeout_s)
    assert (info_.state.first_seq, info_.state.messages) == (1, 51)
    channel.close()


def raftlog_node(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftlog.node.cli", "node", "--data", str(tmp_path / "n"),
         "--grpc", f"127.0.0.1:{free_port()}", *args],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)


@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0"])
def test_a_node_with_raft_and_no_secret_exits_with_one_clear_line(
    tmp_path: Path, bind: str
) -> None:
    run = raftlog_node("--raft", f"{bind}:{free_port()}", tmp_path=tmp_path)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), run.stderr
    assert "--secret-file" in lines[0] and "Traceback" not in run.stderr


@pytest.mark.parametrize("secret", ["", "hunter2", "ab" * 64, "0123456789abcdef" * 4,
                                    os.urandom(16).hex()])
def test_a_secret_under_256_bits_is_refused(tmp_path: Path, secret: str) -> None:
    path = tmp_path / "secret"
    path.write_text(secret)
    run = raftlog_node("--raft", f"127.0.0.1:{free_port()}", "--secret-file", str(path),
                       tmp_path=tmp_path)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --secret-file"), run.stderr


def test_cluster_up_makes_a_strong_secret_only_its_owner_reads(cluster3: LocalCluster) -> None:
    path = cluster3.secret_path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert estimate_entropy_bits(path.read_text().strip()) >= 256
    for node in cluster3.nodes.values():
        assert "--secret-file" in node.command


def first_frame(member_raft_address: str) -> bytes:
    """What pysyncobj's transport sends first on a connection from a member: its address."""
    data = zlib.compress(pickle.dumps(member_raft_address, protocol=2), 3)
    return struct.pack("i", len(data)) + data


def test_strangers_sending_a_members_address_take_no_raft_connection_over(
    cluster3: LocalCluster,
) -> None:
    cluster3.wait_for_leader(10)
    specs = [cluster3.node(i).spec for i in (1, 2, 3)]
    strangers: list[socket.socket] = []
    try:
        # Each member is told by three strangers that they are another member.
        for target in specs:
            for claimed in specs:
                if claimed is target:
                    continue
                sock = socket.create_connection(("127.0.0.1", target.raft_port), timeout=2)
                for _ in range(stranger_frames):
                    try:
                        sock.sendall(first_frame(claimed.raft_address))
                    except OSError:
                        break  # the member dropped the stranger
                strangers.append(sock)
        deadline = time.monotonic() + leader_kept_s
        while time.monotonic() < deadline:
            assert cluster3.leader_id() is not None, "the cluster lost its leader"
            time.sleep(0.2)
        make_stream(cluster3, "after-strangers", messages=3)
    finally:
        for sock in strangers:
            sock.close()


def raw_cluster_stub(cluster: LocalCluster, i: int) -> cluster_pb2_grpc.ClusterStub:
    return cluster_pb2_grpc.ClusterStub(grpc.insecure_channel(cluster.address(i)))


def test_calls_that_change_the_cluster_need_the_credential(cluster3: LocalCluster) -> None:
    route = make_stream(cluster3, "admin", messages=1)
    target = next(n for n in route.replicas if n != route.primary)
    stub = raw_cluster_stub(cluster3, 1)
    calls = [
        (stub.JoinNode, cluster_pb2.JoinNodeRequest(
            node_id="n9", raft_address="127.0.0.1:1", grpc_address="127.0.0.1:2",
            peer_address="127.0.0.1:3")),
        (stub.LeaveNode, cluster_pb2.LeaveNodeRequest(node_id=target)),
        (stub.MigrateStream, cluster_pb2.MigrateStreamRequest(stream="admin", target=target)),
        (stub.RebalanceStreams, cluster_pb2.RebalanceStreamsRequest(steps=[
            cluster_pb2.RebalanceStep(stream="admin", target=target)])),
        (stub.ClearStreamAuthority, cluster_pb2.ClearStreamAuthorityRequest(stream="admin")),
        (stub.SetStreamPinned, cluster_pb2.SetStreamPinnedRequest(stream="admin", pinned=True)),
        (stub.SetConsumerState, cluster_pb2.SetConsumerStateRequest(stream="admin", consumer="c")),
    ]
    for call, request in calls:
        assert reason_of(call, request, timeout=call_timeout_s) is Reason.UNAUTHENTICATED
    after = cluster3.cluster(2).ExplainRoute(cluster_pb2.ExplainRouteRequest(stream="admin"),
                                             timeout=call_timeout_s)
    assert (after.primary, after.fence_epoch, after.pinned) == (route.primary,
                                                                route.fence_epoch, False)
    assert len(cluster3.status(1).nodes) == 3
    # Open calls stay open.
    stub.GetClusterStatus(cluster_pb2.GetClusterStatusRequest(), timeout=call_timeout_s)


def test_joining_addresses_where_no_node_runs_fails_and_keeps_the_leader(
    cluster3: LocalCluster,
) -> None:
    cluster3.wait_for_leader(10)
    started = time.monotonic()
    for k in range(3):
        join = cluster_pb2.JoinNodeRequest(
            node_id=f"ghost{k}", raft_address=f"127.0.0.1:{free_port()}",
            grpc_address=f"127.0.0.1:{free_port()}", peer_address=f"127.0.0.1:{free_port()}")
        assert reason_of(cluster3.cluster(1 + k % 3).JoinNode, join,
                         timeout=call_timeout_s) is Reason.NODE_UNREACHABLE
    assert time.monotonic() - started < 3 * call_timeout_s
    status = cluster3.status(2)
    assert sorted(n.node_id for n in status.nodes) == ["n1", "n2", "n3"]
    wait_until(lambda: cluster3.leader_id() is not None, 5, what="a leader")
    make_stream(cluster3, "after-ghosts", messages=3)  # metadata commits: quorum intact


def test_a_node_with_another_secret_cannot_join(cluster3: LocalCluster, tmp_path: Path) -> None:
    from raftlog.chaos.nodeproc import NodeProcess

    other = tmp_path / "other.secret"
    other.write_text(os.urandom(32).hex())
    raft, peer = free_port(), free_port()
    n4 = NodeProcess(tmp_path / "n4", extra_args=(
        "--raft", f"127.0.0.1:{raft}", "--peer", f"127.0.0.1:{peer}", "--node-id", "n4",
        "--secret-file", str(other),
        "--peers", ",".join(cluster3.node(i).spec.raft_address for i in (1, 2, 3))))
    try:
        n4.start()
        join = cluster_pb2.JoinNodeRequest(node_id="n4", raft_address=f"127.0.0.1:{raft}",
                                           grpc_address=n4.address,
                                           peer_address=f"127.0.0.1:{peer}")
        assert reason_of(cluster3.cluster(1).JoinNode, join,
                         timeout=call_timeout_s) is Reason.NODE_UNREACHABLE
        assert sorted(n.node_id for n in cluster3.status(3).nodes) == ["n1", "n2", "n3"]
    finally:
        n4.cleanup()


def test_raft_membership_entries_name_only_checked_members(cluster3: LocalCluster) -> None:
    """The metadata records each member's peer listener (what the others dial)."""
    status = cluster3.status(1)
    assert {n.node_id: n.peer_address for n in status.nodes} == {
        f"n{i}": cluster3.peer_address(i) for i in (1, 2, 3)}
    assert raft_pb2.MemberJoin.DESCRIPTOR.fields_by_name["peer_address"].number == 4
