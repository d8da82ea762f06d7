"""Separate hosts for a chaos run: every node in its own network namespace with its own 10.x
address on a Linux bridge, and partitions made by a packet filter instead of proxies
(`HostNet`, the network of `raftlog chaos run --hosts`). Root only; `ensure_hosts()` says why
not and what to run when this machine cannot do it.

One run owns these namespaces, all named `rlc-<id>-<role>` with the run id `<pid>-<tag>`
(`<pid>` is the process that made them, so `cleanup_stale` can tell a crashed run's leftovers
from a live run's):

    rlc-<id>-br       the bridge `br0`, with one veth port per member (`p0` the client, `pN`)
    rlc-<id>-client   the harness's own workload: eth0 at 10.A.B.2/24
    rlc-<id>-n<i>     node i: eth0 at 10.A.B.<10+i>/24, loopback up

Every veth is made inside the namespaces themselves (one end in the member's, the other in the
bridge's), so nothing in the root namespace changes: no interface, route or firewall rule. The
subnet 10.A.B.0/24 is derived from the run id; it only has to look distinct, because a member
has no route out of its own bridge.

Faults are DROP rules in the receiver's INPUT chain: `cut(a, b)` drops a's packets at b and
b's at a; `one_way` drops only at b, so b's packets still reach a but a's replies (TCP
handshakes and acks included) do not reach b. A dropped packet gets no answer, so the sender
sees silence, like a real partition. Bandwidth is `tc tbf` on a member's eth0 (everything it
sends, not one link); latency, jitter, slicing, data limits and resets have no kernel support
here (no netem), so `slow` refuses them with `HostModeUnsupported`.

iptables: `ensure_hosts` installs it with apt-get when it is missing (as chaos/powerfs/install.py
does fuse3) and probes, in a scratch namespace, `iptables` (on Debian 12 the nft variant behind
the alternatives link), then `iptables-legacy`, then `iptables-nft`; the first that can add and
delete a rule there is used. On the machine this was written on (Debian 12, kernel 6.18) both
variants work and `iptables` (nft) is the one used.

Every subprocess has a timeout; `destroy()` deletes every namespace with this run's prefix
(idempotent, and also after a crash half way through `create()`).
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType

from raftlog.chaos.apt import apt_install
from raftlog.chaos.links import Link

NS_PREFIX = "rlc-"  # every namespace this harness makes starts with it
BRIDGE = "br0"
DEVICE = "eth0"  # a member's end of its veth, inside its own namespace
CLIENT = 0  # the client's index, as in links.Link
client_host = 2  # the client's last address byte
node_host_base = 10  # node i's last address byte is node_host_base + i
nodes_max = 32
subnet_second_low = 200  # the subnet's second byte is in [low, low + span)
subnet_second_span = 50
ip_timeout_s = 10.0
iptables_timeout_s = 10.0
iptables_lock_wait_s = 5  # iptables -w: how long to wait for the xtables lock
tc_timeout_s = 10.0
tbf_burst_bytes = 16 * 1024
tbf_queue_ms = 400  # tbf `latency`: how long a packet may wait before it is dropped
IPTABLES_CANDIDATES = ("iptables", "iptables-legacy", "iptables-nft")


class HostNetError(RuntimeError):
    """A command that sets up or changes the namespaces failed (the message has its stderr)."""


class HostModeUnsupported(RuntimeError):
    """A fault that hosts mode cannot make (use the loopback mode, with Toxiproxy)."""


# ---------------------------------------------------------------------------------------------
# Commands.


def _run(command: Sequence[str], *, timeout_s: float) -> str:
    """Runs `command`, returns its stdout; raises HostNetError when it fails or times out."""
    try:
        result = subprocess.run(list(command), capture_output=True, text=True, check=False,
                                stdin=subprocess.DEVNULL, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise HostNetError(f"`{shlex.join(command)}` took over {timeout_s} s") from None
    except OSError as exc:
        raise HostNetError(f"`{shlex.join(command)}`: {exc}") from None
    if result.returncode != 0:
        detail = result.stderr.strip() or result.stdout.strip() or "no output"
        raise HostNetError(f"`{shlex.join(command)}` exited {result.returncode}: {detail}")
    return result.stdout


def _ip(*args: str) -> str:
    return _run(["ip", *args], timeout_s=ip_timeout_s)


def list_namespaces() -> list[str]:
    """Every named network namespace (`ip netns list`)."""
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def current_namespace() -> str:
    """The name of the network namespace this process is in ('' for the root namespace, or
    one without a name)."""
    return _ip("netns", "identify").strip()


def _delete_namespace(name: str) -> None:
    """Deletes one namespace; one that is already gone is not an error."""
    try:
        _ip("netns", "delete", name)
    except HostNetError:
        if name in list_namespaces():
            raise


def _owner_pid(name: str, prefix: str) -> int | None:
    """The pid in `rlc-<pid>-<tag>-<role>`, or None when `name` is not of that form."""
    if not name.startswith(prefix) or not name.startswith(NS_PREFIX):
        return None
    parts = name[len(NS_PREFIX):].split("-")
    if len(parts) != 3 or not parts[0].isdigit():
        return None
    return int(parts[0])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale(prefix: str = NS_PREFIX) -> list[str]:
    """Deletes the namespaces under `prefix` left by runs of this harness that are over: the
    process that made them is gone (a crash, a SIGKILL) and no process is left in the run's
    client namespace (where its workload ran). Returns the names deleted. Processes still in a
    node's namespace are not signalled (this harness ends only processes it started, by pid):
    they keep it alive, unnamed, until they exit."""
    runs: dict[str, list[str]] = {}
    for name in list_namespaces():
        if _owner_pid(name, prefix) is not None:
            runs.setdefault(name.rsplit("-", 1)[0], []).append(name)
    stale: list[str] = []
    for run, names in runs.items():
        owner = _owner_pid(names[0], prefix)
        client = f"{run}-client"
        if (owner is not None and _alive(owner)) or (client in names and _pids(client)):
            continue
        for name in _teardown_order(names):
            _delete_namespace(name)
        stale += names
    return stale


def _pids(name: str) -> list[int]:
    """The processes in namespace `name` (`ip netns pids`; none if it is gone)."""
    try:
        return [int(pid) for pid in _ip("netns", "pids", name).split()]
    except HostNetError:
        if name in list_namespaces():
            raise
        return []


def _teardown_order(names: Iterable[str]) -> list[str]:
    """Members before bridges, so no veth outlives its bridge port for long."""
    return sorted(names, key=lambda name: name.endswith("-br"))


# ---------------------------------------------------------------------------------------------
# Can this machine do it?


@dataclass(frozen=True)
class _Probe:
    reason: str | None
    iptables: str | None


def _install_iptables() -> str | None:
    """Installs iptables as root; returns None on success, else why not."""
    return apt_install("iptables", commands=IPTABLES_CANDIDATES)


def _probe_namespace(name: str) -> _Probe:
    """In the scratch namespace `name`: a bridge, a veth pair, and the first iptables that
    can add and delete a rule."""
    try:
        _ip("-n", name, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
    except HostNetError as exc:
        return _Probe(f"cannot make a bridge or a veth pair in a network namespace: {exc}",
                      None)
    failures: list[str] = []
    for candidate in IPTABLES_CANDIDATES:
        if shutil.which(candidate) is None:
            continue
        rule = ["INPUT", "-s", "10.255.255.1/32", "-j", "DROP"]
        try:
            for action in ("-A", "-D"):
                _run(["ip", "netns", "exec", name, candidate, "-w", str(iptables_lock_wait_s),
                      action, *rule], timeout_s=iptables_timeout_s)
        except HostNetError as exc:
            failures.append(str(exc))
            continue
        return _Probe(None, candidate)
    return _Probe("no iptables variant works inside a network namespace: "
                  + ("; ".join(failures) or "none is installed"), None)


@functools.cache
def _probe() -> _Probe:
    if not sys.platform.startswith("linux"):
        return _Probe(f"hosts mode needs Linux network namespaces, not {sys.platform}", None)
    if os.geteuid() != 0:
        return _Probe("hosts mode needs root (network namespaces, veth pairs, iptables): run "
                      "the harness as root, e.g. `sudo -E raftlog chaos run --hosts ...`, or "
                      "leave out --hosts for the loopback mode", None)
    if shutil.which("ip") is None:
        return _Probe("the `ip` command is missing: run `apt-get install -y iproute2`", None)
    if not any(shutil.which(name) for name in IPTABLES_CANDIDATES):
        reason = _install_iptables()
        if reason is not None:
            return _Probe(reason, None)
    name = f"{NS_PREFIX}{os.getpid()}-probe{secrets.token_hex(2)}-x"
    try:
        _ip("netns", "add", name)
    except HostNetError as exc:
        return _Probe(f"cannot make a network namespace ({exc}); in a container, start it "
                      "with `--cap-add NET_ADMIN --cap-add SYS_ADMIN` (or --privileged)", None)
    try:
        return _probe_namespace(name)
    finally:
        _delete_namespace(name)


def ensure_hosts() -> str | None:
    """None when hosts mode can run here; otherwise the reason and what to run. Installs
    iptables with apt-get when root and it is missing (once per process)."""
    return _probe().reason


def new_run_id() -> str:
    """`<pid>-<4 hex digits>`: unique among live runs, and names the process that owns it."""
    return f"{os.getpid()}-{secrets.token_hex(2)}"


# ---------------------------------------------------------------------------------------------
# The network of one run.


class HostNet:
    """`with HostNet(nodes=3).create() as net:` ... members are numbered like links.Link:
    0 the client, 1..nodes the nodes."""

    def __init__(self, nodes: int, *, run_id: str | None = None) -> None:
        if not 1 <= nodes <= nodes_max:
            raise ValueError(f"nodes must be 1..{nodes_max}, not {nodes}")
        self.nodes = nodes
        self.run_id = run_id or new_run_id()
        if _owner_pid(f"{NS_PREFIX}{self.run_id}-x", NS_PREFIX) is None:
            raise ValueError(f"a run id is <pid>-<tag> without other dashes, not {run_id!r}")
        digest = hashlib.sha256(self.run_id.encode()).digest()
        second = subnet_second_low + digest[0] % subnet_second_span
        self.subnet = ipaddress.IPv4Network(f"10.{second}.{digest[1]}.0/24")
        self._drops: set[tuple[int, int]] = set()  # (receiver, sender)
        self._shaped: set[int] = set()  # members with a tbf on their eth0
        self._lock = threading.Lock()  # faults are made and healed from worker threads

    # -- names and addresses ----------------------------------------------------------------

    @property
    def prefix(self) -> str:
        return f"{NS_PREFIX}{self.run_id}-"

    @property
    def bridge_ns(self) -> str:
        return f"{self.prefix}br"

    @property
    def client_ns(self) -> str:
        return f"{self.prefix}client"

    def node_ns(self, i: int) -> str:
        self._check_node(i)
        return f"{self.prefix}n{i}"

    def members(self) -> list[int]:
        return [CLIENT, *range(1, self.nodes + 1)]

    def namespace(self, i: int) -> str:
        """Member i's namespace (0: the client's)."""
        return self.client_ns if i == CLIENT else self.node_ns(i)

    def address(self, i: int) -> str:
        """Member i's IPv4 address (0: the client's)."""
        host = client_host if i == CLIENT else node_host_base + self._check_node(i)
        return str(self.subnet.network_address + host)

    def exec_prefix(self, i: int) -> list[str]:
        """Put before a command to run it in member i's namespace (0: the client's)."""
        return ["ip", "netns", "exec", self.namespace(i)]

    def _check_node(self, i: int) -> int:
        if not 1 <= i <= self.nodes:
            raise KeyError(f"no node {i} (nodes are 1..{self.nodes})")
        return i

    # -- lifecycle --------------------------------------------------------------------------

    def create(self) -> HostNet:
        """Makes the bridge and every member; on any failure deletes what it made and
        raises."""
        try:
            _ip("netns", "add", self.bridge_ns)
            _ip("-n", self.bridge_ns, "link", "set", "lo", "up")
            _ip("-n", self.bridge_ns, "link", "add", BRIDGE, "type", "bridge")
            _ip("-n", self.bridge_ns, "link", "set", BRIDGE, "up")
            for i in self.members():
                self._add_member(i)
        except BaseException:
            self.destroy()
            raise
        return self

    def _add_member(self, i: int) -> None:
        name, port = self.namespace(i), f"p{i}"
        _ip("netns", "add", name)
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "link", "add", DEVICE, "type", "veth", "peer", "name", port,
            "netns", self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "set", port, "master", BRIDGE, "up")
        _ip("-n", name, "addr", "add", f"{self.address(i)}/{self.subnet.prefixlen}",
            "dev", DEVICE)
        _ip("-n", name, "link", "set", DEVICE, "up")

    def destroy(self) -> None:
        """Deletes every namespace with this run's prefix (their veths and the bridge go with
        them). Safe to call any number of times. Processes still inside a namespace keep it
        alive, unnamed, until they exit: stop them first."""
        self._drops.clear()
        self._shaped.clear()
        mine = [name for name in list_namespaces() if name.startswith(self.prefix)]
        for name in _teardown_order(mine):
            _delete_namespace(name)

    def __enter__(self) -> HostNet:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.destroy()

    # -- faults -----------------------------------------------------------------------------

    def _iptables(self, receiver: int, action: str, sender: int) -> None:
        iptables = _probe().iptables
        if iptables is None:
            raise HostNetError(f"hosts mode cannot run here: {ensure_hosts()}")
        _run([*self.exec_prefix(receiver), iptables, "-w", str(iptables_lock_wait_s), action,
              "INPUT", "-s", f"{self.address(sender)}/32", "-j", "DROP"],
             timeout_s=iptables_timeout_s)

    def _drop(self, receiver: int, sender: int) -> None:
        """Member `receiver` drops every packet from `sender` (once, however often asked)."""
        with self._lock:
            if (receiver, sender) not in self._drops:
                self._iptables(receiver, "-A", sender)
                self._drops.add((receiver, sender))

    def cut(self, a: int, b: int, *, one_way: bool = False) -> None:
        """Nothing passes between a and b (`one_way`: nothing from a reaches b; b's packets
        still reach a)."""
        self._check_node(a)
        self._check_node(b)
        self._drop(b, a)
        if not one_way:
            self._drop(a, b)

    def partition(self, groups: Sequence[Iterable[int]], *, one_way: bool = False) -> None:
        """Cuts every pair of nodes that are in different groups (`one_way`: from the earlier
        group to the later)."""
        sets = [sorted(set(group)) for group in groups]
        for x, first in enumerate(sets):
            for second in sets[x + 1:]:
                for a in first:
                    for b in second:
                        self.cut(a, b, one_way=one_way)

    def isolate_client(self, i: int) -> None:
        """The client cannot reach node i, nor node i the client."""
        self._check_node(i)
        self._drop(i, CLIENT)
        self._drop(CLIENT, i)

    def slow(self, links: Iterable[Link], *, latency_ms: int = 0, jitter_ms: int = 0,
             rate_kbps: int = 0, reset_after_ms: int | None = None,
             slice_bytes: int = 0, limit_bytes: int = 0, toxicity: float = 1.0) -> None:
        """ProxyNet.slow's signature; only a bandwidth cap (`rate_kbps`, KB/s) can be made
        here: a tbf on the eth0 of every member at either end of `links`, which caps all it
        sends, not only those links. Anything else raises HostModeUnsupported."""
        unsupported = [name for name, asked in (
            ("latency", bool(latency_ms)), ("jitter", bool(jitter_ms)),
            ("reset_peer", reset_after_ms is not None), ("slicer", bool(slice_bytes)),
            ("limit_data", bool(limit_bytes)), ("toxicity below 1", toxicity < 1.0)) if asked]
        if unsupported:
            raise HostModeUnsupported(
                f"{', '.join(unsupported)}: not available in hosts mode (no netem or proxy "
                "between the namespaces); run without --hosts (the loopback mode, with "
                "Toxiproxy) for slow-link faults")
        if not rate_kbps:
            return
        if shutil.which("tc") is None:
            raise HostModeUnsupported("bandwidth: the `tc` command is missing (apt-get install "
                                      "-y iproute2), or run without --hosts")
        ends = sorted({end for link in links for end in (link.source, link.target)})
        for i in ends:
            _run([*self.exec_prefix(i), "tc", "qdisc", "replace", "dev", DEVICE, "root", "tbf",
                  "rate", f"{rate_kbps * 8}kbit", "burst", str(tbf_burst_bytes),
                  "latency", f"{tbf_queue_ms}ms"], timeout_s=tc_timeout_s)
            self._shaped.add(i)

    def heal(self) -> None:
        """Removes every rule and bandwidth cap this net added."""
        with self._lock:
            self._heal()

    def _heal(self) -> None:
        for receiver, sender in sorted(self._drops):
            self._iptables(receiver, "-D", sender)
            self._drops.discard((receiver, sender))
        for i in sorted(self._shaped):
            _run([*self.exec_prefix(i), "tc", "qdisc", "del", "dev", DEVICE, "root"],
                 timeout_s=tc_timeout_s)
            self._shaped.discard(i)

    def rules(self, i: int) -> list[str]:
        """Member i's INPUT rules, as `iptables -S INPUT` prints them (for tests and
        reports)."""
        iptables = _probe().iptables or IPTABLES_CANDIDATES[0]
        out = _run([*self.exec_prefix(i), iptables, "-w", str(iptables_lock_wait_s), "-S",
                    "INPUT"], timeout_s=iptables_timeout_s)
        return [line for line in out.splitlines() if line.startswith("-A ")]
