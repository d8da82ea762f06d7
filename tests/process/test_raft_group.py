"""The metadata group (raftlog.raft.group): real 3-process clusters on loopback, a node talked
to by a fake peer (votes, hostile frames), and in-process single-member groups for the
pysyncobj hooks (journal, snapshots, codecs, events). Also MemoryRaftGroup.

Every wait is bounded (`wait_until`); every process is started by the test and ended by pid.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import pickle
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pysyncobj.journal
import pysyncobj.pickle
import pysyncobj.serializer
import pysyncobj.syncobj
import pysyncobj.tcp_connection
import pytest
from pysyncobj import FAIL_REASON
from pysyncobj.node import TCPNode
from rocksdict import Options, Rdict

from raftlog.base import limits
from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.chaos.nodeproc import free_port, wait_until
from raftlog.internal import raft_pb2
from raftlog.raft import commands as c
from raftlog.raft import group as group_module
from raftlog.raft import wire
from raftlog.raft.addresses import check_raft_config
from raftlog.raft.api import Applied, LeaderChange, ensure_ok
from raftlog.raft.group import RaftGroup, failure_error
from raftlog.raft.journal import RocksJournal
from raftlog.raft.memory import MemoryRaftGroup
from raftlog.raft.snapshot_file import read_snapshot_file
from raftlog.raft.state_snapshot import to_snapshot

ROOT = Path(__file__).resolve().parents[2]
NODE_MAIN = ROOT / "tests" / "raft_node_main.py"
start_timeout_s = 20.0
request_timeout_s = 10.0
election_timeout_s = 10.0  # generous bound for a first election on a loaded 2-core machine
failover_budget_s = 2.0  # leader killed -> new leader + a committed proposal
start_attempts_max = 3


# ---------------------------------------------------------------------------------------------
# Node processes


class RaftProc:
    """One tests/raft_node_main.py process, spoken to with JSON lines."""

    def __init__(self, data_dir: Path, address: str, peers: list[str], *, secret: str = "") -> None:
        self.data_dir = data_dir
        self.address = address
        self.peers = peers
        self.secret = secret
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self._replies: dict[int, dict[str, Any]] = {}
        self._arrived = threading.Condition()
        self._next_id = 0

    def start(self) -> RaftProc:
        command = [sys.executable, str(NODE_MAIN), "--self", self.address,
                   "--peers", ",".join(self.peers), "--data", str(self.data_dir)]
        if self.secret:
            command += ["--secret", self.secret]
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log_file, cwd=ROOT)
        self._replies = {}
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        try:
            wait_until(lambda: self._reply(-1) is not None, start_timeout_s,
                       what=f"{self.address} started")
        except TimeoutError:
            self.kill9()
            raise RuntimeError(f"node did not start; log:\n{self.log_text()[-3000:]}") from None
        return self

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            message = json.loads(line)
            with self._arrived:
                self._replies[message.get("id", -1)] = message
                self._arrived.notify_all()

    def _reply(self, request_id: int) -> dict[str, Any] | None:
        with self._arrived:
            return self._replies.pop(request_id, None)

    def request(self, op: str, *, wait_s: float = request_timeout_s,
                **fields: Any) -> dict[str, Any]:
        """Sends one request; returns the reply (raises RaftlogError for an error reply)."""
        assert self.proc is not None and self.proc.stdin is not None
        self._next_id += 1
        request_id = self._next_id
        self.proc.stdin.write((json.dumps({"id": request_id, "op": op, **fields}) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + wait_s
        with self._arrived:
            while request_id not in self._replies:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.proc.poll() is not None:
                    raise TimeoutError(f"{op} on {self.address}: no reply within {wait_s} s")
                self._arrived.wait(min(remaining, 0.1))
            reply = self._replies.pop(request_id)
        if "error" in reply:
            error = reply["error"]
            raise RaftlogError(Reason.__members__.get(error["reason"], Reason.INTERNAL),
                               error["message"], **error["metadata"])
        return reply

    def status(self) -> dict[str, Any]:
        return self.request("status")

    def propose(self, command: raft_pb2.RaftCommand, *, timeout_s: float = 2.0
                ) -> raft_pb2.RaftResult:
        reply = self.request("propose", wait_s=timeout_s + 5,
                             command=base64.b64encode(command.SerializeToString()).decode(),
                             timeout_s=timeout_s)
        return raft_pb2.RaftResult.FromString(base64.b64decode(reply["result"]))

    def snapshot(self) -> bytes:
        return base64.b64decode(self.request("snapshot")["snapshot"])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


class Cluster:
    def __init__(self, tmp_path: Path, size: int, *, secret: str = "") -> None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        addresses = [f"127.0.0.1:{free_port()}" for _ in range(size)]
        self.nodes = [RaftProc(tmp_path / f"node{i}", address,
                               [a for a in addresses if a != address], secret=secret)
                      for i, address in enumerate(addresses)]

    def start(self) -> Cluster:
        threads = [threading.Thread(target=node.start) for node in self.nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for node in self.nodes:
            if not node.alive():
                raise RuntimeError(f"{node.address} did not start:\n{node.log_text()[-3000:]}")
        return self

    def alive(self) -> list[RaftProc]:
        return [node for node in self.nodes if node.alive()]

    def leader(self) -> RaftProc | None:
        """The one live node that says it leads and that every live node agrees on."""
        statuses = {node.address: node.status() for node in self.alive()}
        leaders = [address for address, status in statuses.items() if status["is_leader"]]
        if len(leaders) != 1 or any(s["leader"] != leaders[0] for s in statuses.values()):
            return None
        return next(node for node in self.nodes if node.address == leaders[0])

    def wait_leader(self, timeout_s: float = election_timeout_s) -> RaftProc:
        found: list[RaftProc] = []

        def elected() -> bool:
            leader = self.leader()
            found[:] = [leader] if leader else []
            return bool(found)

        wait_until(elected, timeout_s, interval_s=0.02, what="one agreed leader")
        return found[0]

    def wait_same_state(self, timeout_s: float = 10.0) -> bytes:
        snapshots: list[bytes] = []

        def same() -> bool:
            snapshots[:] = [node.snapshot() for node in self.alive()]
            return len(set(snapshots)) == 1

        wait_until(same, timeout_s, what="every member has the same state")
        return snapshots[0]

    def kill_all(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.kill9()


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(size: int = 3, *, secret: str = "") -> Cluster:
        # A free port can be taken by another process before the node binds it: retry the
        # whole cluster on fresh ports.
        for attempt in range(start_attempts_max):
            cluster = Cluster(tmp_path / f"attempt{attempt}", size, secret=secret)
            made.append(cluster)
            try:
                return cluster.start()
            except RuntimeError:
                cluster.kill_all()
                if attempt == start_attempts_max - 1:
                    raise
        raise AssertionError("unreachable")

    try:
        yield make
    finally:
        for cluster in made:
            cluster.kill_all()


def join(n: int) -> raft_pb2.RaftCommand:
    return c.member_join(node_id=f"n{n}", raft_address=f"10.0.0.{n}:7401",
                         grpc_address=f"10.0.0.{n}:7400")


# ---------------------------------------------------------------------------------------------
# 3-process clusters


def test_three_members_elect_a_leader_and_commit_on_all(make_cluster: Callable[..., Cluster]
                                                        ) -> None:
    cluster = make_cluster(3)
    leader = cluster.wait_leader()
    follower = next(node for node in cluster.nodes if node is not leader)
    first = ensure_ok(leader.propose(join(1)))
    second = ensure_ok(follower.propose(join(2)))  # forwarded to the leader
    assert second.index > first.index
    rejected = follower.propose(join(1))
    assert not rejected.ok and rejected.reason == "NODE_EXISTS"
    state = raft_pb2.RaftSnapshot.FromString(cluster.wait_same_state())
    assert [member.node_id for member in state.members] == ["n1", "n2"]
    counters = follower.status()["counters"]
    assert counters["acks_after_sync"] > 0 and counters["syncs"] > 0
    assert counters["truncation_logs_suppressed"] >= 0


def test_killing_the_leader_elects_a_new_one_and_the_old_one_catches_up(
        make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3)
    old = cluster.wait_leader()
    ensure_ok(old.propose(join(1)))
    term_before = old.status()["term"]
    elected_s, committed_s = kill_leader_and_measure(cluster, old)
    print(f"\nfailover: new leader after {elected_s * 1000:.0f} ms, "
          f"first commit after {committed_s * 1000:.0f} ms")
    assert committed_s < failover_budget_s
    survivor = cluster.alive()[0]
    ensure_ok(survivor.propose(join(2)))
    # The old leader restarts from its journal and catches up; its term never goes back.
    old.start()
    wait_until(lambda: old.status()["term"] > term_before, 10.0, what="old leader rejoined")
    state = raft_pb2.RaftSnapshot.FromString(cluster.wait_same_state())
    assert [member.node_id for member in state.members] == ["n1", "n2"]


def kill_leader_and_measure(cluster: Cluster, leader: RaftProc) -> tuple[float, float]:
    """kill -9 the leader; returns (seconds until a survivor became leader, seconds until a
    proposal committed). CLOCK_MONOTONIC is system-wide, so the survivors' leadership event
    times compare with ours."""
    killed_at = time.monotonic()
    leader.kill9()
    committed_s = None
    deadline = killed_at + 10.0
    while committed_s is None and time.monotonic() < deadline:
        for node in cluster.alive():
            with contextlib.suppress(RaftlogError, TimeoutError):
                result = node.propose(c.barrier(), timeout_s=0.25)
                if result.ok:
                    committed_s = time.monotonic() - killed_at
                    break
    if committed_s is None:
        raise AssertionError("no proposal committed within 10 s of killing the leader")
    became = [event["monotonic_s"] for node in cluster.alive()
              for event in node.status()["leader_events"]
              if event["is_leader"] and event["monotonic_s"] > killed_at]
    elected_s = min(became) - killed_at if became else float("nan")
    return elected_s, committed_s


def test_a_cluster_with_a_secret_commits(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3, secret="s3cret-for-tests")
    leader = cluster.wait_leader()
    ensure_ok(leader.propose(join(7)))
    state = raft_pb2.RaftSnapshot.FromString(cluster.wait_same_state())
    assert [member.node_id for member in state.members] == ["n7"]


def raise_persisted_term(data_dir: Path, term: int) -> None:
    """Sets a stopped member's persisted term (and clears its vote), as two candidates racing
    would leave it: a term above the leader's, with nobody elected in it."""
    db = open_db(data_dir / "db")
    try:
        RocksJournal(db, log_cf="raft_log", meta_cf="raft_meta").setCurrentTerm(term, None)
    finally:
        db.close()


def test_a_member_back_with_a_term_above_the_leaders_rejoins(
        make_cluster: Callable[..., Cluster]) -> None:
    """A follower comes back at a term above the working leader's. pysyncobj drops the
    leader's lower-term entries without a word and the member's pre-votes fail while the
    leader works, so nothing would ever tell the leader: the member would stay out for good
    (seen at a local cluster's start, where two candidates raced). Told the term in answer to
    its entries, the leader steps down, and the next election includes the member."""
    cluster = make_cluster(3)
    leader = cluster.wait_leader()
    ensure_ok(leader.propose(join(1)))
    cluster.wait_same_state()
    high_term = leader.status()["term"] + 5
    member = next(node for node in cluster.nodes if node is not leader)
    member.kill9()
    raise_persisted_term(member.data_dir, high_term)
    member.start()
    assert member.status()["term"] == high_term
    new_leader = cluster.wait_leader(timeout_s=15.0)
    assert new_leader.status()["term"] > high_term
    ensure_ok(new_leader.propose(join(2)))
    state = raft_pb2.RaftSnapshot.FromString(cluster.wait_same_state())
    assert [m.node_id for m in state.members] == ["n1", "n2"]
    assert leader.status()["counters"].get("newer_terms_adopted", 0) >= 1


def test_membership_add_then_remove(tmp_path: Path) -> None:
    """A node is added to a one-member group, started with the member as its peer, catches up,
    and is removed again. The membership entry carries a pickled TCPNode: this exercises the
    restricted log codec's one allowed class."""
    first = RaftProc(tmp_path / "a", f"127.0.0.1:{free_port()}", [])
    second_address = f"127.0.0.1:{free_port()}"
    second = RaftProc(tmp_path / "b", second_address, [first.address])
    try:
        first.start()
        wait_until(lambda: first.status()["is_leader"], election_timeout_s, what="leader")
        ensure_ok(first.propose(join(1)))
        first.request("add_member", address=second_address, timeout_s=5)
        second.start()
        wait_until(lambda: second.status()["applied_index"] >= first.status()["applied_index"],
                   10.0, what="new member caught up")
        assert second.snapshot() == first.snapshot()
        ensure_ok(second.propose(join(2)))  # forwarded through the new member
        with pytest.raises(RaftlogError) as raised:
            first.request("add_member", address=second_address)
        assert raised.value.reason is Reason.NODE_EXISTS
        first.request("remove_member", address=second_address, timeout_s=5)
        wait_until(lambda: not first.status()["peers"], 5.0, what="member removed")
        ensure_ok(first.propose(join(3)))  # a quorum of one again
    finally:
        first.kill9()
        second.kill9()


# ---------------------------------------------------------------------------------------------
# A node spoken to by a fake peer (pysyncobj's wire format: i32 length + zlib(pickle))


def frame(message: object) -> bytes:
    data = zlib.compress(pickle.dumps(message, 5), 3)
    return struct.pack("i", len(data)) + data


def raw_frame(pickled: bytes) -> bytes:
    data = zlib.compress(pickled, 3)
    return struct.pack("i", len(data)) + data


class FakePeer:
    """A TCP connection to the node that introduces itself as `as_address` (no secret)."""

    def __init__(self, node_address: str, *, as_address: str | None) -> None:
        host, port = node_address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.buffer = b""
        if as_address is not None:
            self.sock.sendall(frame(as_address))

    def send(self, message: object) -> None:
        self.sock.sendall(frame(message))

    def messages(self, timeout_s: float) -> Iterator[Any]:
        """Messages from the node until timeout_s passes or it hangs up."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            while len(self.buffer) >= 4:
                length = struct.unpack("i", self.buffer[:4])[0]
                if len(self.buffer) < 4 + length:
                    break
                data, self.buffer = self.buffer[4:4 + length], self.buffer[4 + length:]
                yield pickle.loads(zlib.decompress(data))
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return
            if not chunk:
                return
            self.buffer += chunk

    def closed_by_node(self, timeout_s: float) -> bool:
        self.sock.settimeout(timeout_s)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except (TimeoutError, ConnectionResetError):
            return False

    def close(self) -> None:
        self.sock.close()


def vote_request(term: int) -> dict[str, Any]:
    return {"type": "request_vote", "term": term, "last_log_index": 1, "last_log_term": 0}


def granted_vote(peer: FakePeer, term: int, timeout_s: float) -> bool:
    return any(message == {"type": "response_vote", "term": term}
               for message in peer.messages(timeout_s) if isinstance(message, dict))


@pytest.fixture
def lone_node(tmp_path: Path) -> Iterator[tuple[RaftProc, str, str]]:
    """A node whose two peers are fakes; its address sorts below theirs, so it never dials
    them: they connect to it."""
    ports = sorted(free_port() for _ in range(3))
    node_address, peer_a, peer_b = (f"127.0.0.1:{port}" for port in ports)
    if not node_address < peer_a < peer_b:
        pytest.skip("free ports did not sort as addresses")
    node = RaftProc(tmp_path / "lone", node_address, [peer_a, peer_b])
    try:
        yield node.start(), peer_a, peer_b
    finally:
        node.kill9()


def test_a_restarted_node_never_votes_twice_in_one_term(lone_node: tuple[RaftProc, str, str]
                                                        ) -> None:
    """The node grants A its vote for term T and is killed at once (-9). Restarted, it must
    refuse B's request for the same term T: that is only possible if (T, vote for A) was
    persisted before the grant was sent. It still grants B a later term (the channel works)."""
    node, peer_a, peer_b = lone_node
    term = 50
    a = FakePeer(node.address, as_address=peer_a)
    a.send(vote_request(term))
    assert granted_vote(a, term, timeout_s=5.0), "positive control: A's vote was not granted"
    node.kill9()
    a.close()
    node.start()
    status = node.status()  # before B connects: alone, the node starts no election
    b = FakePeer(node.address, as_address=peer_b)
    b.send(vote_request(term))
    assert not granted_vote(b, term, timeout_s=1.0), "voted twice in one term"
    assert (status["persisted_term"], status["persisted_vote"]) == (term, peer_a)
    b.send(vote_request(term + 100))
    assert granted_vote(b, term + 100, timeout_s=5.0), "B's later-term vote was not granted"
    b.close()


class RunsCode:
    """Unpickling this with an unrestricted loader creates `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def test_a_frame_that_would_run_code_is_refused(lone_node: tuple[RaftProc, str, str],
                                                tmp_path: Path) -> None:
    node, peer_a, _ = lone_node
    control = tmp_path / "control-marker"
    evil_control = pickle.dumps(RunsCode(control), 5)
    pickle.loads(evil_control)  # positive control: the payload does run code when unpickled
    assert control.exists()
    marker = tmp_path / "marker"
    evil = pickle.dumps(RunsCode(marker), 5)
    # 1. As the first frame of an unknown connection; 2. after introducing itself as a peer;
    # 3. wrapped in a regular message.
    first = FakePeer(node.address, as_address=None)
    first.sock.sendall(raw_frame(evil))
    assert first.closed_by_node(5.0)
    as_peer = FakePeer(node.address, as_address=peer_a)
    as_peer.sock.sendall(raw_frame(evil))
    assert as_peer.closed_by_node(5.0)
    inner = FakePeer(node.address, as_address=peer_a)
    inner.sock.sendall(raw_frame(pickle.dumps({"type": "request_vote", "term": RunsCode(marker)},
                                              5)))
    assert inner.closed_by_node(5.0)
    # 4. Utility commands and read-only observers are refused, even well-formed.
    for hello in (["status"], ["add", "127.0.0.1:1"], "readonly"):
        peer = FakePeer(node.address, as_address=None)
        peer.send(hello)
        assert peer.closed_by_node(5.0) and not list(peer.messages(0.2)), hello
    status = node.status()
    assert not marker.exists() and not status["failure"]
    assert status["counters"]["refused_frames"] >= 3


def test_a_log_entry_that_would_run_code_is_not_applied(lone_node: tuple[RaftProc, str, str],
                                                        tmp_path: Path) -> None:
    """A fake leader replicates and commits an entry whose command is a hostile pickle; the
    node stores it, the restricted log codec refuses it when applying, and the node halts
    (rather than retry it on every tick)."""
    node, peer_a, _ = lone_node
    marker = tmp_path / "marker"
    regular = b"\x00" + pickle.dumps(RunsCode(marker), 5)
    leader = FakePeer(node.address, as_address=peer_a)
    leader.send({"type": "append_entries", "term": 5, "commit_index": 2,
                 "entries": [(regular, 2, 5)], "prevLogIdx": 1, "prevLogTerm": 0})
    acked = any(isinstance(m, dict) and m.get("type") == "next_node_idx" and m.get("success")
                for m in leader.messages(5.0))
    assert acked
    wait_until(lambda: bool(node.status()["failure"]), 5.0, what="hostile entry refused")
    status = node.status()
    assert "restricted unpickler" in status["failure"] and "posix.system" in status["failure"]
    assert not marker.exists() and status["applied_index"] < 2
    assert status["counters"]["refused_frames"] > 0
    leader.close()


# ---------------------------------------------------------------------------------------------
# In-process single-member groups


def open_db(path: Path) -> Rdict:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    return Rdict(str(path), options, column_families={
        "raft_log": Options(raw_mode=True), "raft_meta": Options(raw_mode=True)})


class Local:
    """A single-member RaftGroup in this process, reopened on the same directory at will."""

    def __init__(self, tmp_path: Path, **kwargs: Any) -> None:
        self.dir = tmp_path
        self.address = f"127.0.0.1:{free_port()}"
        self.kwargs = kwargs
        self.db: Rdict | None = None
        self.group: RaftGroup | None = None

    def open(self, **kwargs: Any) -> RaftGroup:
        self.db = open_db(self.dir / "db")
        self.group = RaftGroup(self_address=self.address, peers=kwargs.pop("peers", []),
                               journal_db=self.db, snapshot_path=self.dir / "raft.snapshot",
                               **{**self.kwargs, **kwargs})
        return self.group

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
        if self.db is not None:
            self.db.close()
            self.db = None


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    made = Local(tmp_path)
    try:
        yield made
    finally:
        made.close()


async def until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {timeout_s} s")
        await asyncio.sleep(0.01)


def test_a_single_member_group_applies_and_delivers_events(local: Local) -> None:
    applied: list[Applied] = []
    leadership: list[LeaderChange] = []

    async def scenario() -> None:
        group = local.open(on_applied=applied.append, on_leader_change=leadership.append,
                           clock=FakeClock(wall_ms=123_000))
        await until(group.is_leader, election_timeout_s, "leader")
        result = ensure_ok(await group.propose(join(1), timeout_s=2))
        assert applied[-1].index == result.index and applied[-1].result == result
        assert applied[-1].command is not None and applied[-1].command.now_ms == 123_000
        rejected = await group.propose(join(1), timeout_s=2)
        assert not rejected.ok and rejected.reason == "NODE_EXISTS"
        assert rejected.index == result.index + 1  # rejected commands take a log index too
        with group.read_state() as state:
            assert state.members["n1"].joined_ms == 123_000
            assert state.applied_index == rejected.index
        await until(lambda: bool(leadership), 2.0, "leader event")
        assert leadership[-1] == LeaderChange(is_leader=True, leader=local.address,
                                              term=group.status().term)
        status = group.status()
        assert (status.is_leader, status.leader, status.peers) == (True, local.address, ())
        assert status.applied_index >= rejected.index and status.commit_index >= rejected.index
        with pytest.raises(RaftlogError) as raised:
            await group.propose(c.stream_delete(name="x" * limits.metadata_command_bytes_max),
                                timeout_s=1)
        assert raised.value.reason is Reason.REQUEST_TOO_LARGE

    asyncio.run(scenario())


def test_one_replicated_method_and_the_journal_is_ours(local: Local) -> None:
    group = local.open()
    obj = group._obj
    assert obj._methodToID == {"apply_command_v0": 0}
    assert obj._SyncObj__raftLog is group.journal
    assert pysyncobj.syncobj.createJournal is pysyncobj.journal.createJournal  # restored
    assert isinstance(obj._SyncObj__transport, group_module._DurableTransport)
    assert group.journal.sync in obj._SyncObj__onTickCallbacks


def test_pysyncobj_patches_are_installed(local: Local) -> None:
    local.open()
    assert pysyncobj.tcp_connection.pickle is group_module.TRANSPORT_CODEC
    assert pysyncobj.syncobj.pickle is group_module.LOG_CODEC
    assert pysyncobj.serializer.pickle is group_module.DUMP_CODEC
    assert pysyncobj.pickle.dumps(b"\xff")[:2] == b"\x80\x05"  # protocol 5
    assert pysyncobj.journal.loads == group_module.DUMP_CODEC.loads
    assert group_module.TRUNCATION_LOG_FILTER in pysyncobj.syncobj.logger.filters


def test_the_restricted_codecs(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    evil = pickle.dumps(RunsCode(marker), 5)
    for codec in (group_module.TRANSPORT_CODEC, group_module.LOG_CODEC):
        with pytest.raises(pickle.UnpicklingError, match=r"posix\.system"):
            codec.loads(evil)
    assert not marker.exists()
    message = {"type": "append_entries", "entries": [(b"\x00\xff", 2, 3)], "ok": True, "f": 1.5}
    assert group_module.TRANSPORT_CODEC.loads(wire.RestrictedPickle.dumps(message)) == message
    membership = pickle.dumps(["add", "h:1", TCPNode("h:1")], 2)
    with pytest.raises(pickle.UnpicklingError):
        group_module.TRANSPORT_CODEC.loads(membership)
    loaded = group_module.LOG_CODEC.loads(membership)
    assert loaded[:2] == ["add", "h:1"] and loaded[2] == TCPNode("h:1")
    assert loaded[2].address == "h:1" and loaded[2].port == 1


def test_snapshots_are_protobuf_and_restart_rebuilds_the_state(local: Local) -> None:
    async def first_life() -> bytes:
        group = local.open()
        await until(group.is_leader, election_timeout_s, "leader")
        for n in range(1, 4):
            ensure_ok(await group.propose(join(n), timeout_s=2))
        group._obj.forceLogCompaction()
        await until(lambda: group.journal.counters["compactions"] > 0, 5.0, "compaction")
        ensure_ok(await group.propose(join(4), timeout_s=2))  # after the snapshot
        with group.read_state() as state:
            return to_snapshot(state).SerializeToString()

    before = asyncio.run(first_life())
    local.close()
    snapshot = read_snapshot_file(str(local.dir / "raft.snapshot"))
    assert [member.node_id for member in snapshot.members] == ["n1", "n2", "n3"]
    assert list(snapshot.raft_nodes) == [local.address]
    assert (local.dir / "raft.snapshot").read_bytes().startswith(b"RLSNAP1\n")

    async def second_life() -> None:
        group = local.open()
        await until(lambda: group.state.applied_index > 0, 5.0, "state rebuilt")
        with group.read_state() as state:
            assert to_snapshot(state).SerializeToString() == before
        assert group._obj.otherNodes == set()  # the snapshot's member list did not add self
        await until(group.is_leader, election_timeout_s, "leader")
        ensure_ok(await group.propose(join(5), timeout_s=2))

    asyncio.run(second_life())


def test_a_corrupt_snapshot_halts_the_group(local: Local) -> None:
    async def write_one() -> None:
        group = local.open()
        await until(group.is_leader, election_timeout_s, "leader")
        ensure_ok(await group.propose(join(1), timeout_s=2))
        group._obj.forceLogCompaction()
        await until(lambda: group.journal.counters["compactions"] > 0, 5.0, "compaction")

    asyncio.run(write_one())
    local.close()
    path = local.dir / "raft.snapshot"
    path.write_bytes(path.read_bytes()[:-1] + b"\x00")

    async def restart() -> None:
        group = local.open()
        await until(lambda: bool(group.status().failure), 5.0, "failure reported")
        assert "CORRUPT" in group.status().failure
        with pytest.raises(RaftlogError) as raised:
            await group.propose(join(2), timeout_s=1)
        assert raised.value.reason is Reason.INTERNAL

    asyncio.run(restart())


def test_without_a_leader_a_proposal_times_out_with_an_unknown_outcome(local: Local) -> None:
    async def scenario() -> None:
        group = local.open(peers=[f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"])
        with pytest.raises(RaftlogError) as raised:
            await group.propose(join(1), timeout_s=0.3)
        assert raised.value.reason is Reason.TIMEOUT
        assert raised.value.metadata["outcome"] == "unknown"
        pending = asyncio.ensure_future(group.propose(join(2), timeout_s=30))
        await asyncio.sleep(0.05)
        group.close()
        with pytest.raises(RaftlogError) as closing:
            await pending
        assert closing.value.reason is Reason.SHUTTING_DOWN

    asyncio.run(scenario())


@pytest.mark.parametrize(("fail_reason", "reason", "outcome"), [
    (FAIL_REASON.QUEUE_FULL, Reason.OVERLOADED, "not_committed"),
    (FAIL_REASON.MISSING_LEADER, Reason.NO_LEADER, "not_committed"),
    (FAIL_REASON.NOT_LEADER, Reason.NO_LEADER, "not_committed"),
    (FAIL_REASON.DISCARDED, Reason.NO_LEADER, "not_committed"),
    (FAIL_REASON.LEADER_CHANGED, Reason.NO_LEADER, "unknown"),
    (FAIL_REASON.UNKNOWN_OUTCOME, Reason.NO_LEADER, "unknown"),
    (FAIL_REASON.REQUEST_DENIED, Reason.MEMBERSHIP_CHANGE_IN_PROGRESS, "not_committed"),
])
def test_pysyncobj_failures_map_to_catalogued_errors(fail_reason: int, reason: Reason,
                                                     outcome: str) -> None:
    error = failure_error(fail_reason)
    assert error.reason is reason and error.metadata["outcome"] == outcome
    assert reason.status_name in ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION")


@pytest.mark.parametrize("address", ["0.0.0.0:7401", "10.1.2.3:7401", "[::]:7401"])
def test_a_non_loopback_bind_without_a_secret_is_refused(local: Local, address: str) -> None:
    with pytest.raises(RaftlogError) as raised:
        local.open(bind_address=address)
    assert raised.value.reason is Reason.INVALID_CONFIG and "secret" in raised.value.message
    check_raft_config(bind_address=address, secret="s")  # a secret makes it fine
    check_raft_config(bind_address="localhost:7401", secret="")


def test_a_raft_port_in_use_is_a_config_error(local: Local) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        local.address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(RaftlogError) as raised:
            local.open()
    assert raised.value.reason is Reason.INVALID_CONFIG


# ---------------------------------------------------------------------------------------------
# The in-memory twin


def test_memory_group_applies_at_once_and_delivers_events_first() -> None:
    async def scenario() -> None:
        seen: list[str] = []
        group = MemoryRaftGroup(on_applied=lambda event: seen.append(f"applied {event.index}"),
                                on_leader_change=lambda event: seen.append(
                                    f"leader {event.is_leader}"),
                                clock=FakeClock(wall_ms=5))
        result = ensure_ok(await group.propose(join(1), timeout_s=1))
        seen.append("returned")
        assert seen == ["applied 1", "returned"] and result.index == 1
        assert group.state.members["n1"].joined_ms == 5
        assert not (await group.propose(join(1), timeout_s=1)).ok
        group.set_leader(False)
        with pytest.raises(RaftlogError) as raised:
            await group.propose(join(2), timeout_s=1)
        assert raised.value.reason is Reason.NO_LEADER
        await asyncio.sleep(0)
        assert seen[-1] == "leader False" and group.status().term == 2
        group.set_leader(True)
        with pytest.raises(RaftlogError):
            await group.propose(c.stream_delete(name="x" * limits.metadata_command_bytes_max),
                                timeout_s=1)
        await group.add_member("127.0.0.1:2", timeout_s=1)
        assert [peer.address for peer in group.status().peers] == ["127.0.0.1:2"]
        await group.remove_member("127.0.0.1:2", timeout_s=1)
        group.close()
        with pytest.raises(RaftlogError):
            await group.propose(join(3), timeout_s=1)

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------------
# Measurements (slow)


@pytest.mark.slow
def test_measure_failover_time_over_several_trials(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3)
    elected, committed = [], []
    for _ in range(6):
        leader = cluster.wait_leader()
        elected_s, committed_s = kill_leader_and_measure(cluster, leader)
        elected.append(elected_s * 1000)
        committed.append(committed_s * 1000)
        leader.start()
        cluster.wait_same_state()
    print(f"\nfailover over {len(elected)} trials: new leader ms "
          f"{sorted(round(e) for e in elected)}, first commit ms "
          f"{sorted(round(x) for x in committed)}")
    assert max(committed) < failover_budget_s * 1000


@pytest.mark.slow
def test_measure_commit_latency_and_throughput(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(3)
    leader = cluster.wait_leader()
    follower = next(node for node in cluster.nodes if node is not leader)
    lines = []
    for name, node, count, in_flight in (("leader, 1 caller", leader, 500, 1),
                                         ("follower, 1 caller", follower, 300, 1),
                                         ("leader, 1000 in flight", leader, 20_000, 1000)):
        reply = node.request("bench", wait_s=120, count=count, in_flight=in_flight)
        latencies = sorted(reply["latencies_ms"])
        lines.append(
            f"{name}: {count / reply['elapsed_s']:.0f} commits/s, "
            f"p50 {statistics.median(latencies):.1f} ms, "
            f"p99 {latencies[int(len(latencies) * 0.99) - 1]:.1f} ms, "
            f"leader fsyncs {reply['syncs']}")
    counters = follower.status()["counters"]
    lines.append(f"follower journal: {json.dumps(counters)}")
    print("\n" + "\n".join(lines))

