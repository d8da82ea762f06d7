"""Hosts mode's network (raftlog.chaos.hosts): three nodes and a client, each in its own
network namespace on one bridge, and the faults made with iptables in the receivers.

Each node namespace runs a tiny server (TCP echo, and UDP datagrams logged by sender); a probe
process in one namespace connects to, and sends a datagram to, a list of nodes at once.
A TCP connect needs both directions, so one-way cuts are checked with the UDP logs. Without
root, `ip` or a working iptables the tests skip with the reason ensure_hosts() gives. Servers
are stopped by pid, and every namespace is deleted, whatever happens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from raftlog.chaos import hosts
from raftlog.chaos.hosts import HostModeUnsupported, HostNet
from raftlog.chaos.links import Link, LinkKind
from raftlog.chaos.nodeproc import wait_until

pytestmark = pytest.mark.timeout(60)

NODES = 3
ALL = list(range(1, NODES + 1))
PORT = 7000
server_ready_s = 10.0
connect_timeout_s = 0.5  # a silent peer costs this much per probe
datagram_wait_s = 0.3  # how long a sent datagram may take to show in the server's log
probe_timeout_s = 10.0

SERVER = """
import socket, sys, threading
host, port = sys.argv[1], int(sys.argv[2])
tcp = socket.create_server((host, port))
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind((host, port))
def serve_tcp():
    while True:
        conn, _ = tcp.accept()
        with conn:
            conn.sendall(conn.recv(64))
threading.Thread(target=serve_tcp, daemon=True).start()
print("ready", flush=True)
while True:
    data, peer = udp.recvfrom(64)
    print(peer[0], data.decode(), flush=True)
"""

PROBE = """
import json, socket, sys, threading
timeout_s, tag, targets = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
results = {}
def probe(host):
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.sendto(tag.encode(), (host, PORT))
    try:
        with socket.create_connection((host, PORT), timeout=timeout_s) as conn:
            conn.sendall(b"hi")
            results[host] = "ok" if conn.recv(64) == b"hi" else "garbled"
    except TimeoutError:
        results[host] = "silent"
    except OSError as exc:
        results[host] = type(exc).__name__
threads = [threading.Thread(target=probe, args=(t,)) for t in targets]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(results))
""".replace("PORT", str(PORT))


@dataclass
class Hosts:
    """The module's network and where each node's server logs the datagrams it hears."""

    net: HostNet
    logs: Path

    def log(self, i: int) -> Path:
        return self.logs / f"n{i}.log"


@pytest.fixture(scope="module")
def hosts_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    reason = hosts.ensure_hosts()
    if reason is not None:
        pytest.skip(f"hosts mode unusable: {reason}")
    up = Hosts(HostNet(NODES), tmp_path_factory.mktemp("hosts"))
    servers: list[subprocess.Popen[bytes]] = []
    with up.net.create():
        try:
            for i in ALL:
                with up.log(i).open("wb") as log:
                    servers.append(subprocess.Popen(
                        [*up.net.exec_prefix(i), sys.executable, "-c", SERVER,
                         up.net.address(i), str(PORT)],
                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            for i in ALL:
                wait_until(lambda i=i: up.log(i).read_text().startswith("ready"),  # type: ignore[misc]
                           server_ready_s, what=f"the server in n{i}")
            yield up
        finally:
            for server in servers:
                server.kill()
            for server in servers:
                server.wait(timeout=server_ready_s)


@pytest.fixture
def up(hosts_up: Hosts) -> Iterator[Hosts]:
    """The module's network, healed after each test."""
    yield hosts_up
    hosts_up.net.heal()


@pytest.fixture
def net(up: Hosts) -> HostNet:
    return up.net


def probe(net: HostNet, source: int, targets: list[int]) -> tuple[dict[int, str], str]:
    """From member `source`: one datagram to each target, then a TCP echo. Returns "ok" or
    "silent" (or the error's name) by target, and the tag the datagrams carried."""
    tag = f"from{source}-{time.monotonic_ns()}"
    out = subprocess.run(
        [*net.exec_prefix(source), sys.executable, "-c", PROBE, str(connect_timeout_s), tag,
         *(net.address(t) for t in targets)],
        capture_output=True, text=True, check=True, timeout=probe_timeout_s).stdout
    by_address = json.loads(out)
    return {t: by_address[net.address(t)] for t in targets}, tag


def heard(up: Hosts, receiver: int, tag: str) -> bool:
    """Whether node `receiver`'s server logged the datagram tagged `tag`."""
    time.sleep(datagram_wait_s)
    return tag in up.log(receiver).read_text()


def reach(net: HostNet, source: int, targets: list[int]) -> dict[int, bool]:
    return {t: result == "ok" for t, result in probe(net, source, targets)[0].items()}


def test_every_member_reaches_every_node(net: HostNet) -> None:
    for source in [0, *ALL]:
        assert reach(net, source, ALL) == dict.fromkeys(ALL, True), f"from {source}"


def test_nodes_have_their_own_addresses(net: HostNet) -> None:
    addresses = [net.address(i) for i in net.members()]
    assert len(set(addresses)) == len(addresses)
    assert all(a.startswith("10.") for a in addresses)
    assert net.exec_prefix(2) == ["ip", "netns", "exec", net.node_ns(2)]
    assert net.node_ns(2).startswith(net.prefix) and net.client_ns.startswith(net.prefix)


def test_cut_silences_one_pair_only(up: Hosts, net: HostNet) -> None:
    net.cut(1, 2)
    results, tag = probe(net, 1, [2, 3])
    assert results == {2: "silent", 3: "ok"}
    assert not heard(up, 2, tag)
    results, tag = probe(net, 2, [1, 3])
    assert results == {1: "silent", 3: "ok"}
    assert not heard(up, 1, tag)
    assert reach(net, 3, [1, 2]) == {1: True, 2: True}
    assert reach(net, 0, ALL) == dict.fromkeys(ALL, True)


def test_one_way_cut_lets_the_other_direction_through(up: Hosts, net: HostNet) -> None:
    net.cut(1, 2, one_way=True)
    _, tag = probe(net, 1, [2])
    assert not heard(up, 2, tag)
    _, tag = probe(net, 2, [1])
    assert heard(up, 1, tag)
    assert reach(net, 1, [3]) == {3: True}
    assert net.rules(1) == []  # only the receiver drops
    assert net.rules(2) == [f"-A INPUT -s {net.address(1)}/32 -j DROP"]


def test_partition_splits_the_groups(net: HostNet) -> None:
    net.partition([[1], [2, 3]])
    assert reach(net, 1, [2, 3]) == {2: False, 3: False}
    assert reach(net, 2, [1, 3]) == {1: False, 3: True}
    assert reach(net, 0, ALL) == dict.fromkeys(ALL, True)


def test_isolate_client(net: HostNet) -> None:
    net.isolate_client(1)
    assert reach(net, 0, ALL) == {1: False, 2: True, 3: True}
    assert reach(net, 2, [1]) == {1: True}


def test_heal_removes_every_rule(net: HostNet) -> None:
    net.partition([[1], [2, 3]])
    net.isolate_client(3)
    net.cut(1, 2)  # already cut: no second rule
    assert len(net.rules(1)) == 2
    net.heal()
    assert all(net.rules(i) == [] for i in net.members())
    for source in [0, *ALL]:
        assert reach(net, source, ALL) == dict.fromkeys(ALL, True), f"from {source}"


def test_slow_links_other_than_bandwidth_are_refused(net: HostNet) -> None:
    links = [Link(1, 2, LinkKind.RAFT)]
    for kwargs, name in (({"latency_ms": 100}, "latency"), ({"slice_bytes": 64}, "slicer"),
                         ({"limit_bytes": 1024}, "limit_data"),
                         ({"reset_after_ms": 500}, "reset_peer")):
        with pytest.raises(HostModeUnsupported, match=name):
            net.slow(links, **kwargs)  # type: ignore[arg-type]


def test_bandwidth_is_a_tbf_until_healed(net: HostNet) -> None:
    def qdiscs(i: int) -> str:
        return subprocess.run([*net.exec_prefix(i), "tc", "qdisc", "show", "dev", hosts.DEVICE],
                              capture_output=True, text=True, check=True,
                              timeout=probe_timeout_s).stdout

    net.slow([Link(1, 2, LinkKind.RAFT)], rate_kbps=64)
    assert "tbf" in qdiscs(1) and "tbf" in qdiscs(2) and "tbf" not in qdiscs(3)
    assert reach(net, 1, [2]) == {2: True}
    net.heal()
    assert "tbf" not in qdiscs(1) and "tbf" not in qdiscs(2)


def root_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                         check=True, timeout=probe_timeout_s).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines())


def test_destroy_leaves_nothing_even_after_a_failed_create(
        net: HostNet, monkeypatch: pytest.MonkeyPatch) -> None:
    before = root_links()
    second = HostNet(2).create()
    assert sorted(n for n in hosts.list_namespaces() if n.startswith(second.prefix)) == sorted(
        [second.bridge_ns, second.client_ns, second.node_ns(1), second.node_ns(2)])
    assert root_links() == before  # every veth lives in the run's namespaces
    second.destroy()
    second.destroy()  # idempotent
    assert not [n for n in hosts.list_namespaces() if n.startswith(second.prefix)]

    broken = HostNet(2)
    calls: list[int] = []

    def fail_on_node_2(i: int) -> None:
        calls.append(i)
        if i == 2:
            raise hosts.HostNetError("made to fail")
        HostNet._add_member(broken, i)

    monkeypatch.setattr(broken, "_add_member", fail_on_node_2)
    with pytest.raises(hosts.HostNetError, match="made to fail"):
        broken.create()
    assert calls == [0, 1, 2]
    assert not [n for n in hosts.list_namespaces() if n.startswith(broken.prefix)]
    assert net.bridge_ns in hosts.list_namespaces()  # another run's are untouched


def test_cleanup_stale_removes_only_runs_that_are_over(net: HostNet) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=probe_timeout_s)
    dead = f"{hosts.NS_PREFIX}{gone.pid}-dead-n1"
    live = f"{hosts.NS_PREFIX}{os.getpid()}-live-n1"
    # a run whose maker died while its inside run (in its client namespace) still runs
    orphan = [f"{hosts.NS_PREFIX}{gone.pid}-orphan-{role}" for role in ("client", "n1")]
    made = [dead, live, *orphan]
    for name in made:
        subprocess.run(["ip", "netns", "add", name], check=True, timeout=probe_timeout_s)
    inside = subprocess.Popen(["ip", "netns", "exec", orphan[0], "sleep", "60"],
                              stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: bool(subprocess.run(
            ["ip", "netns", "pids", orphan[0]], capture_output=True, text=True,
            timeout=probe_timeout_s).stdout.strip()), server_ready_s, what="a process inside")
        removed = hosts.cleanup_stale()
        assert dead in removed and live not in removed and not set(orphan) & set(removed)
        names = hosts.list_namespaces()
        assert dead not in names and live in names and net.bridge_ns in names
        inside.kill()
        inside.wait(timeout=probe_timeout_s)
        assert set(orphan) <= set(hosts.cleanup_stale())
    finally:
        inside.kill()
        inside.wait(timeout=probe_timeout_s)
        for name in made:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True,
                           timeout=probe_timeout_s)
