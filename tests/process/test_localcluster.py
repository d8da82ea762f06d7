"""The local cluster: `localcluster` process management (layout, refusals, stopping exactly the
recorded pids and never a recycled one), the `raftlog cluster` / `raftlog stream route` commands
end to end, their text rendering, and the `cluster3` harness.

Processes started here are stopped by pid in `finally` blocks; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlog.chaos.cluster import LocalCluster, free_base_port
from raftlog.chaos.nodeproc import wait_until
from raftlog.node.cli import cluster_views as cli_cluster
from raftlog.node.cli import localcluster
from raftlog.node.cli.localcluster import (
    LocalClusterError,
    ProcessState,
    Refusal,
    StopOutcome,
)
from raftlog.v1 import cluster_pb2, streams_pb2, types_pb2

serving_timeout_s = 30.0
cli_timeout_s = 90.0
bystander_wait_s = 5.0


def _alive(pid: int) -> bool:
    return localcluster._cmdline(pid) is not None


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process this test owns that nothing under test may kill; killed by us afterwards."""
    process = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=bystander_wait_s)


@pytest.fixture
def base_port() -> int:
    return free_base_port(2 * 3)


def _down_quietly(data_dir: Path) -> None:
    localcluster.down(data_dir, timeout_s=localcluster.stop_timeout_s_default)


# ---------------------------------------------------------------------------------------------
# Without processes.


def test_plan_gives_each_node_three_adjacent_ports_and_the_others_as_peers(
    tmp_path: Path,
) -> None:
    specs = localcluster.plan(nodes=3, base_port=7400, data_dir=tmp_path)
    assert [(s.node_id, s.grpc_address, s.raft_address, s.peer_address) for s in specs] == [
        ("n1", "127.0.0.1:7400", "127.0.0.1:7401", "127.0.0.1:7402"),
        ("n2", "127.0.0.1:7403", "127.0.0.1:7404", "127.0.0.1:7405"),
        ("n3", "127.0.0.1:7406", "127.0.0.1:7407", "127.0.0.1:7408"),
    ]
    assert specs[1].peers == ("127.0.0.1:7401", "127.0.0.1:7407")
    assert specs[0].data_dir == tmp_path.resolve() / "n1"
    command = localcluster.node_command(specs[0], secret_file=None, python="py")
    assert command == [
        "py", "-m", "raftlog.node.cli", "node", "--data", str(tmp_path.resolve() / "n1"),
        "--grpc", "127.0.0.1:7400", "--raft", "127.0.0.1:7401", "--peer", "127.0.0.1:7402",
        "--node-id", "n1", "--peers", "127.0.0.1:7404,127.0.0.1:7407",
        "--secret-file", str(tmp_path.resolve() / "cluster.secret"),
    ]  # fmt: skip


@pytest.mark.parametrize(("nodes", "base_port"), [(0, 7400), (3, 80), (3, 65532)])
def test_plan_refuses_impossible_sizes_and_ports(
    tmp_path: Path, nodes: int, base_port: int
) -> None:
    with pytest.raises(LocalClusterError) as caught:
        localcluster.plan(nodes=nodes, base_port=base_port, data_dir=tmp_path)
    assert caught.value.reason is Refusal.INVALID_ARGUMENT


def test_pid_file_round_trips_pid_and_exact_command(tmp_path: Path) -> None:
    path = tmp_path / "n1.pid"
    localcluster.write_pid_file(path, pid=42, command=["python", "--data", "/x y/n1"])
    record = localcluster.read_pid_file(path)
    assert (record.pid, record.command, record.node_id) == (
        42,
        ("python", "--data", "/x y/n1"),
        "n1",
    )
    path.write_text("not a pid\n")
    with pytest.raises(ValueError):
        localcluster.read_pid_file(path)


def test_route_text_says_why_the_primary_is_the_primary() -> None:
    route = cluster_pb2.RouteExplanation(
        stream="orders", exists=True, ring_owner="n2", primary="n3", replicas=["n3", "n1"],
        override_claimant="n3", pinned=True, fence_epoch=4, epoch_start_seq=101,
        reason="authority override (migration)", primary_grpc_address="127.0.0.1:7404",
    )  # fmt: skip
    text = cli_cluster.route_text(route)
    assert text.splitlines()[0] == "Stream orders"
    for expected in ("n3 (127.0.0.1:7404)", "n3, n1", "Ring owner:", "n2", "4 (from seq 101)",
                     "Pinned:", "yes", "authority override (migration)"):  # fmt: skip
        assert expected in text
    absent = cli_cluster.route_text(cluster_pb2.RouteExplanation(stream="new", ring_owner="n1"))
    assert "does not exist" in absent.splitlines()[0]


def test_stats_and_event_text() -> None:
    stats = cluster_pb2.ClusterStreamStats(
        nodes=[
            cluster_pb2.PerNodeSummary(node_id="n1", streams=3, messages=10, bytes=2048,
                                       reachable=True),
            cluster_pb2.PerNodeSummary(node_id="n2", reachable=False),
        ],
        streams=[cluster_pb2.PerStreamStats(stream="orders", primary="n1", messages=10)],
        stream_skew=1.5,
        bytes_skew=2.0,
    )  # fmt: skip
    text = cli_cluster.stats_text(stats, streams=True)
    assert "streams 1.50, bytes 2.00" in text
    assert "NO" in text and "orders" in text and "2.0 KiB" in text
    event = cluster_pb2.WatchEvent(
        type=cluster_pb2.WATCH_EVENT_TYPE_AUTHORITY_CHANGED, stream="orders", fence_epoch=2, index=9
    )
    assert "#9  authority_changed  stream=orders claimant=(cleared) fence_epoch=2" in (
        cli_cluster.event_text(event)
    )


# ---------------------------------------------------------------------------------------------
# Processes (no Raft needed: these wait for gRPC health only).


def test_up_status_down_stops_exactly_the_recorded_pids(
    tmp_path: Path, base_port: int, bystander: subprocess.Popen[bytes]
) -> None:
    data_dir = tmp_path / "cluster"
    try:
        nodes = localcluster.up(nodes=3, base_port=base_port, data_dir=data_dir, secret_file=None)
        localcluster.wait_serving(nodes, serving_timeout_s)
        statuses = localcluster.status(data_dir)
        assert [(s.node_id, s.pid, s.state) for s in statuses] == [
            (n.node_id, n.pid, ProcessState.RUNNING) for n in nodes
        ]
        for node in nodes:
            record = localcluster.read_pid_file(node.spec.pid_path)
            assert record.command == node.command
            assert _own_cmdline(node.pid) == list(node.command)
            assert os.getsid(node.pid) == node.pid  # detached: its own session
        with pytest.raises(LocalClusterError) as caught:  # a second `up` on the same dir
            localcluster.up(nodes=3, base_port=base_port + 100, data_dir=data_dir, secret_file=None)
        assert caught.value.reason is Refusal.ALREADY_RUNNING

        results = localcluster.down(data_dir)
        assert {(r.node_id, r.pid, r.outcome) for r in results} == {
            (n.node_id, n.pid, StopOutcome.STOPPED) for n in nodes
        }
        assert not any(_alive(n.pid) for n in nodes)
        assert localcluster.pid_files(data_dir) == []
        assert all("stopped" in n.log_tail().splitlines()[-1] for n in nodes)  # drained
        assert bystander.poll() is None
        assert localcluster.down(data_dir) == []
    finally:
        _down_quietly(data_dir)


def _own_cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def test_down_never_signals_a_pid_whose_command_line_names_another_data_dir(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    data_dir = tmp_path / "cluster"
    data_dir.mkdir()
    command = ["python", "-m", "raftlog.node.cli", "node", "--data", str(data_dir / "n1")]
    localcluster.write_pid_file(data_dir / "n1.pid", pid=bystander.pid, command=command)
    assert [s.state for s in localcluster.status(data_dir)] == [ProcessState.PID_REUSED]

    [result] = localcluster.down(data_dir, timeout_s=1.0)

    assert (result.pid, result.outcome) == (bystander.pid, StopOutcome.REFUSED)
    assert bystander.poll() is None, "down() signalled a process that is not the node"
    assert not (data_dir / "n1.pid").exists()  # the stale file goes, the process stays
    bystander.kill()
    bystander.wait(timeout=bystander_wait_s)


def test_stop_escalates_to_sigkill_after_the_timeout(tmp_path: Path) -> None:
    data_dir = tmp_path / "cluster"
    data_dir.mkdir()
    ignores_sigterm = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    command = [sys.executable, "-c", ignores_sigterm, "--data", str(data_dir.resolve() / "n1")]
    stubborn = subprocess.Popen(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
        localcluster.write_pid_file(data_dir / "n1.pid", pid=stubborn.pid, command=command)
        [result] = localcluster.down(data_dir, timeout_s=0.3)
        assert result.outcome is StopOutcome.KILLED
        assert not _alive(stubborn.pid)  # (down() reaped it: its Popen sees status 0)
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
            stubborn.wait(timeout=bystander_wait_s)


def test_up_refuses_a_port_in_use_and_starts_nothing(tmp_path: Path, base_port: int) -> None:
    data_dir = tmp_path / "cluster"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", base_port + 3))  # n2's Raft port
        taken.listen()
        with pytest.raises(LocalClusterError) as caught:
            localcluster.up(nodes=3, base_port=base_port, data_dir=data_dir, secret_file=None)
    assert caught.value.reason is Refusal.PORT_IN_USE
    assert str(base_port + 3) in caught.value.message
    assert localcluster.pid_files(data_dir) == []


def test_up_replaces_a_stale_pid_file(tmp_path: Path, base_port: int) -> None:
    data_dir = tmp_path / "cluster"
    data_dir.mkdir()
    finished = subprocess.Popen(["true"])
    finished.wait(timeout=bystander_wait_s)
    localcluster.write_pid_file(data_dir / "n1.pid", pid=finished.pid, command=["gone"])
    try:
        [node] = localcluster.up(nodes=1, base_port=base_port, data_dir=data_dir, secret_file=None)
        assert localcluster.read_pid_file(data_dir / "n1.pid").pid == node.pid
    finally:
        _down_quietly(data_dir)


def test_a_node_that_exits_while_starting_is_reported_with_its_log(
    tmp_path: Path, base_port: int
) -> None:
    data_dir = tmp_path / "cluster"
    data_dir.mkdir()
    (data_dir / "n1.tmp").write_text("")
    try:
        # `raftlog node` cannot open its data directory where a file is: it exits 1.
        nodes = localcluster.up(nodes=1, base_port=base_port, data_dir=data_dir, secret_file=None)
        (data_dir / "n1").rmdir()
        (data_dir / "n1.tmp").rename(data_dir / "n1")
        with pytest.raises(LocalClusterError) as caught:
            localcluster.wait_serving(nodes, serving_timeout_s)
        assert caught.value.reason is Refusal.START_FAILED
    finally:
        _down_quietly(data_dir)


def test_a_weak_or_empty_secret_file_is_refused_before_anything_starts(
    tmp_path: Path, base_port: int
) -> None:
    data_dir = tmp_path / "cluster"
    for text in ("", "password" * 8):
        secret = tmp_path / "weak-secret"
        secret.write_text(text)
        with pytest.raises(LocalClusterError) as caught:
            localcluster.up(nodes=1, base_port=base_port, data_dir=data_dir, secret_file=secret)
        assert caught.value.reason is Refusal.INVALID_ARGUMENT
        assert "secret" in caught.value.message
        assert localcluster.status(data_dir) == []


# ---------------------------------------------------------------------------------------------
# Cluster mode: the CLI end to end, and the harness.


def raftlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftlog.node.cli", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=cli_timeout_s,
    )


def json_of(completed: subprocess.CompletedProcess[str]) -> Any:
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_cli_cluster_up_status_route_down(tmp_path: Path, base_port: int) -> None:
    data_dir = tmp_path / "cluster"
    try:
        up = json_of(raftlog("cluster", "up", "--nodes", "3", "--base-port", str(base_port),
                             "--data", str(data_dir), "--json"))  # fmt: skip
        assert up["ready"] and [n["node_id"] for n in up["nodes"]] == ["n1", "n2", "n3"]
        pids = [n["pid"] for n in up["nodes"]]
        assert all(_alive(pid) for pid in pids)  # they outlive the `cluster up` process

        status = json_of(raftlog("cluster", "status", "--data", str(data_dir), "--json"))
        members = {n["node_id"] for n in status["nodes"]}
        assert members == {"n1", "n2", "n3"}
        assert status["raft_leader"] in members
        assert [n["pid"] for n in status["local"]] == pids
        text = raftlog("cluster", "status", "--server", up["nodes"][2]["grpc_address"])
        assert text.returncode == 0, text.stderr
        assert "Raft leader" in text.stdout and "*" in text.stdout and "HEARD" in text.stdout
        # `cluster up` returned once each node had heard from every other: a node stopped
        # now fails over within the usual threshold, not the never-heard-from allowance.
        for node in up["nodes"]:
            seen = json_of(raftlog("cluster", "status", "--server", node["grpc_address"],
                                   "--json"))
            assert all(n.get("heard_from") for n in seen["nodes"]), seen

        n1 = up["nodes"][0]["grpc_address"]
        created = raftlog("--server", n1, "stream", "create", "orders", "--subjects", "orders.>")
        assert created.returncode == 0, created.stderr
        n2 = up["nodes"][1]["grpc_address"]
        route = json_of(raftlog("--server", n2, "stream", "route", "orders", "--json"))
        assert route["exists"] and route["primary"] in members and route["reason"]
        assert route["ring_owner"] in members
        route_text = raftlog("--server", n2, "stream", "route", "orders")
        assert route_text.returncode == 0 and "Primary:" in route_text.stdout

        down = json_of(raftlog("cluster", "down", "--data", str(data_dir), "--json"))
        assert sorted(r["pid"] for r in down["stopped"]) == sorted(pids)
        assert {r["outcome"] for r in down["stopped"]} <= {"stopped", "killed"}
        assert not any(_alive(pid) for pid in pids)
        assert localcluster.status(data_dir) == []
    finally:
        _down_quietly(data_dir)


def _bound_to_a_free_port(taken: socket.socket) -> int:
    """Binds `taken` to a port free_base_port found free; another process on the machine may
    take it in between, so a few candidates are tried."""
    for _ in range(5):
        port = free_base_port(2 * 3)
        try:
            taken.bind(("127.0.0.1", port))
        except OSError:
            continue
        return port
    raise AssertionError("no free port stayed free long enough to bind it")


def test_cli_refusals_print_reason_and_exit_1(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        base_port = _bound_to_a_free_port(taken)
        taken.listen()
        refused = raftlog("cluster", "up", "--nodes", "1", "--base-port", str(base_port),
                          "--data", str(tmp_path / "c"))  # fmt: skip
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: PORT_IN_USE: port ")
    unreachable = raftlog("--server", f"127.0.0.1:{base_port}", "--timeout", "2s", "cluster",
                          "status")  # fmt: skip
    assert unreachable.returncode == 1 and unreachable.stderr.startswith("error: ")


def test_cluster3_harness_restarts_a_node_and_replaces_a_killed_leader(
    cluster3: LocalCluster,
) -> None:
    for i in (1, 2, 3):
        assert {n.node_id for n in cluster3.status(i).nodes} == {"n1", "n2", "n3"}
    created = cluster3.streams(1).CreateStream(
        streams_pb2.CreateStreamRequest(config=types_pb2.StreamConfig(name="orders")), timeout=10
    )
    assert created.config.name == "orders"
    leader = cluster3.wait_for_leader(10.0)
    old_pid = cluster3.node(cluster3.index_of(leader)).pid
    assert cluster3.kill9(cluster3.index_of(leader)) is StopOutcome.KILLED
    assert not _alive(old_pid)
    assert cluster3.wait_for_leader(10.0, exclude=[leader]) != leader
    restarted = cluster3.start(cluster3.index_of(leader))
    assert restarted.pid != old_pid
    wait_until(
        lambda: (
            {n.node_id for n in cluster3.status(cluster3.index_of(leader)).nodes}
            == {"n1", "n2", "n3"}
        ),
        10.0,
        what="the restarted node sees all members",
    )
