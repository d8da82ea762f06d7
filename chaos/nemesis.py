"""Nemeses: the faults a chaos run injects, each a `Fault` with a `start` and a `stop`, chosen
and timed by a seeded `Schedule`.

A fault acts on a `Target`: the cluster's processes (kill -9, SIGSTOP, restarts), its links
(partitions and slow links through Toxiproxy, links.py, or partitions by packet filter
between network namespaces in hosts mode, hosts.py) and the machine (busy processes). It
names its victims when it starts (the stream's primary, the Raft leader, random nodes), so the
history says what was broken and when; `majority_connected` says whether a majority of the
nodes can still talk while it lasts (the availability check holds the cluster to its promise
only then).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from raftlog.chaos.links import Link, LinkKind, Net
from raftlog.chaos.powerfs import PowerFs

flap_period_s = (1.0, 2.0)  # a flapping partition changes this often (uniform in the range)
hogs_default = 4  # busy processes beside the nodes for CPU starvation
latency_ms = 100
jitter_ms = 50
reset_toxicity = 0.05  # share of connections a latency fault also resets
reset_after_ms = 500
bandwidth_kbps = 64
slice_bytes = 64
limit_bytes = 64 * 1024
restart_gap_s = 1.0  # between two nodes of a rolling restart
ack_wait_s = 2.0  # power loss of the primary: the longest wait for an acknowledgement


class Target(Protocol):
    """What faults act on (chaos/run.py's ChaosCluster)."""

    rng: random.Random

    @property
    def net(self) -> Net: ...

    def node_indexes(self) -> list[int]: ...

    def running(self) -> list[int]: ...

    async def primary(self) -> int:
        """The index of the run's stream's primary."""
        ...

    async def leader(self) -> int:
        """The index of the Raft leader."""
        ...

    async def replica_set(self) -> list[int]:
        """The indexes of the nodes that hold the run's stream (its primary included)."""
        ...

    async def kill9(self, i: int) -> None: ...

    async def restart(self, i: int) -> None:
        """Starts node i again (after a kill), or stops it gracefully and starts it."""
        ...

    def pid(self, i: int) -> int: ...

    async def ensure_running(self, i: int) -> None:
        """Starts node i again if it is not running (e.g. it stopped on a full disk)."""
        ...

    def disk(self, i: int) -> PowerFs:
        """Node i's data directory file system (runs with power faults only)."""
        ...

    async def kill9_after_ack(self, i: int, *, timeout_s: float) -> None:
        """kill -9 of node i the moment the next write is acknowledged."""
        ...

    def spares(self) -> list[int]:
        """Nodes that are not members yet (they join and leave)."""
        ...

    async def join(self, i: int) -> None: ...

    async def leave(self, i: int) -> None: ...

    async def move_primary(self, i: int) -> None:
        """The run's stream moves its primary to node i."""
        ...


@dataclass
class Started:
    targets: list[int]
    majority_connected: bool = True


class Fault(Protocol):
    name: str

    async def start(self, target: Target) -> Started: ...

    async def stop(self, target: Target) -> None: ...


def _majority(count: int) -> int:
    return count // 2 + 1


async def _majority_left(target: Target, cut_off: Iterable[int]) -> bool:
    """Whether the nodes not in `cut_off` still hold a majority of the cluster (Raft, so a
    failover can happen) and of the stream's copies (so its writes can commit): the stream
    owes its availability only then."""
    gone = set(cut_off)
    nodes = target.node_indexes()
    replicas = await target.replica_set()
    return (len([i for i in nodes if i not in gone]) >= _majority(len(nodes))
            and len([i for i in replicas if i not in gone]) >= _majority(len(replicas)))


@dataclass
class Kill:
    """kill -9 of the primary, the Raft leader, a random node, or two at once; restarted when
    the fault stops."""

    whom: str  # primary | leader | random | two
    name: str = ""
    _killed: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.name = self.name or f"kill-{self.whom}"

    async def start(self, target: Target) -> Started:
        nodes = target.running()
        if self.whom == "primary":
            victims = [await target.primary()]
        elif self.whom == "leader":
            victims = [await target.leader()]
        elif self.whom == "two":
            victims = target.rng.sample(nodes, min(2, len(nodes)))
        else:
            victims = [target.rng.choice(nodes)]
        majority = await _majority_left(target, victims)
        for i in victims:
            await target.kill9(i)
        self._killed = victims
        return Started(victims, majority_connected=majority)

    async def stop(self, target: Target) -> None:
        for i in self._killed:
            await target.restart(i)
        self._killed = []


@dataclass
class PowerLoss:
    """Power loss: the victims are killed (-9) and their disks forget every write not synced
    (`writeback`: a seeded part of it reaches the disk first, out of order); they start again
    when the fault stops. Of the whole cluster, one node, or the primary (killed from inside
    the callback of an acknowledgement it just sent, so the write it acknowledged last is the
    one most likely to be lost)."""

    whom: str  # all | node | primary
    writeback: bool = False
    name: str = ""
    _victims: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.name = self.name or f"power-loss-{self.whom}" + ("-writeback" if self.writeback
                                                              else "")

    async def start(self, target: Target) -> Started:
        nodes = target.running()
        if self.whom == "all":
            victims = list(nodes)
        elif self.whom == "primary":
            victims = [await target.primary()]
        else:
            victims = [target.rng.choice(nodes)]
        majority = await _majority_left(target, victims)
        for i in victims:
            if self.whom == "primary":
                await target.kill9_after_ack(i, timeout_s=ack_wait_s)
            else:
                await target.kill9(i)
        for i in victims:
            disk = target.disk(i)
            if self.writeback:
                seed = target.rng.randrange(2**31)
                await asyncio.to_thread(disk.writeback, seed=seed, fraction=0.5)
            else:
                await asyncio.to_thread(disk.drop)
        self._victims = victims
        return Started(victims, majority_connected=majority)

    async def stop(self, target: Target) -> None:
        for i in self._victims:
            await target.ensure_running(i)
        self._victims = []


@dataclass
class DiskFault:
    """One node's disk fails while the fault lasts: `full` (ENOSPC on every write) or `errors`
    (EIO on every read, write and fsync of its database files). The node is started again
    afterwards if it stopped (a refused write ends it, base/fatal.py)."""

    kind: str  # full | errors
    name: str = ""
    _victims: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.name = self.name or f"disk-{self.kind}"

    async def start(self, target: Target) -> Started:
        victim = target.rng.choice(target.running())
        disk = target.disk(victim)
        if self.kind == "full":
            await asyncio.to_thread(disk.set_full, 0)
        else:
            await asyncio.to_thread(disk.set_eio, "/db/*")
        self._victims = [victim]
        return Started([victim])

    async def stop(self, target: Target) -> None:
        for i in self._victims:
            await asyncio.to_thread(target.disk(i).ok)
            await target.ensure_running(i)
        self._victims = []


@dataclass
class Pause:
    """SIGSTOP of the primary (or the Raft leader); SIGCONT when the fault stops."""

    whom: str = "primary"
    name: str = ""
    _paused: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.name = self.name or f"pause-{self.whom}"

    async def start(self, target: Target) -> Started:
        victim = await (target.primary() if self.whom == "primary" else target.leader())
        os.kill(target.pid(victim), signal.SIGSTOP)
        self._paused = [victim]
        return Started([victim])

    async def stop(self, target: Target) -> None:
        for i in self._paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(target.pid(i), signal.SIGCONT)
        self._paused = []


@dataclass
class Partition:
    """Cuts links (Toxiproxy): isolate the primary or the Raft leader, a random
    majority/minority split, a bridge (only the primary and the Raft leader lose each other),
    one-way (the primary's bytes reach no one; it still hears the others); `flapping` cuts
    and heals every 1-2 s while the fault lasts."""

    kind: str  # primary | leader | majority | bridge | one-way
    flapping: bool = False
    name: str = ""
    _flapper: asyncio.Task[None] | None = None
    _calm: asyncio.Event = field(default_factory=asyncio.Event)  # set: the flapping stops

    def __post_init__(self) -> None:
        self.name = self.name or ("flapping-" if self.flapping else "") + f"partition-{self.kind}"

    async def _cut(self, target: Target) -> list[int]:
        nodes = target.node_indexes()
        net = target.net
        if self.kind in ("primary", "leader", "one-way"):
            victim = await (target.leader() if self.kind == "leader" else target.primary())
            others = [i for i in nodes if i != victim]
            net.partition([[victim], others], one_way=self.kind == "one-way")
            return [victim]
        if self.kind == "bridge":
            primary, leader = await target.primary(), await target.leader()
            if primary == leader:  # no bridge to cut: cut the leader from one other node
                leader = target.rng.choice([i for i in nodes if i != primary])
            net.cut(primary, leader)
            return [primary, leader]
        shuffled = target.rng.sample(nodes, len(nodes))
        minority = shuffled[: (len(nodes) - 1) // 2]
        net.partition([minority, shuffled[len(minority):]])
        return minority

    async def start(self, target: Target) -> Started:
        victims = await self._cut(target)
        if self.flapping:
            self._flapper = asyncio.create_task(self._flap(target))
        # A minority cut off may hold most of the stream's copies (5 nodes, 3 copies); the
        # bridge and one-way cuts leave every node talking to a majority.
        majority = await _majority_left(target, victims) if self.kind in (
            "majority", "primary", "leader") else True
        return Started(victims, majority_connected=majority)

    async def _flap(self, target: Target) -> None:
        """Cuts and heals until `_calm` is set. It is never cancelled: a cancelled await of a
        net change in a worker thread would leave that change running beside stop's heal."""
        cut = True
        while not self._calm.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._calm.wait(), target.rng.uniform(*flap_period_s))
                return
            if cut:
                await asyncio.to_thread(target.net.heal)
            else:
                await self._cut(target)
            cut = not cut

    async def stop(self, target: Target) -> None:
        if self._flapper is not None:
            self._calm.set()
            await self._flapper
            self._flapper = None
        await asyncio.to_thread(target.net.heal)


@dataclass
class SlowLinks:
    """Toxics on every link between nodes: `latency` (100 ms ± 50 ms, a few connections
    reset), `bandwidth`, `slicer`, `limit_data`."""

    kind: str  # latency | bandwidth | slicer | limit-data
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or self.kind

    async def start(self, target: Target) -> Started:
        nodes = target.node_indexes()
        links = [Link(a, b, kind) for a in nodes for b in nodes if a != b for kind in LinkKind]
        net = target.net
        if self.kind == "latency":
            net.slow(links, latency_ms=latency_ms, jitter_ms=jitter_ms)
            net.slow(links, reset_after_ms=reset_after_ms, toxicity=reset_toxicity)
        elif self.kind == "bandwidth":
            net.slow(links, rate_kbps=bandwidth_kbps)
        elif self.kind == "slicer":
            net.slow(links, slice_bytes=slice_bytes)
        else:
            net.slow(links, limit_bytes=limit_bytes)
        return Started(nodes)

    async def stop(self, target: Target) -> None:
        await asyncio.to_thread(target.net.heal)


@dataclass
class CpuStarvation:
    """Busy processes beside the nodes, as many as `hogs`."""

    hogs: int = hogs_default
    name: str = "cpu"
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    async def start(self, target: Target) -> Started:
        self._procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                        stdin=subprocess.DEVNULL)
                       for _ in range(self.hogs)]
        return Started([])

    async def stop(self, target: Target) -> None:
        for proc in self._procs:
            proc.kill()
        for proc in self._procs:
            await asyncio.to_thread(proc.wait)
        self._procs = []


@dataclass
class RollingRestart:
    """Every node in turn stopped gracefully and started again, one at a time."""

    name: str = "rolling-restart"

    async def start(self, target: Target) -> Started:
        for i in target.node_indexes():
            await target.restart(i)
            await asyncio.sleep(restart_gap_s)
        return Started(target.node_indexes())

    async def stop(self, target: Target) -> None:
        return None


@dataclass
class JoinLeave:
    """A new node joins on an empty disk and takes over the stream's primary; when the fault
    stops it leaves again (the stream and its copies move off it first) and its disk is
    emptied, so the next window's join starts from nothing too."""

    name: str = "join-leave"
    _joined: list[int] = field(default_factory=list)

    async def start(self, target: Target) -> Started:
        spares = target.spares()
        if not spares:
            raise RuntimeError("join-leave needs a spare node (the run plans one)")
        node = spares[0]
        self._joined = [node]
        await target.join(node)
        await target.move_primary(node)
        return Started([node])

    async def stop(self, target: Target) -> None:
        for i in self._joined:
            await target.leave(i)
        self._joined = []


NEMESES: dict[str, Callable[[], Fault]] = {
    "kill-primary": lambda: Kill("primary"),
    "kill-leader": lambda: Kill("leader"),
    "kill-random": lambda: Kill("random"),
    "kill-two": lambda: Kill("two"),
    "pause-primary": lambda: Pause("primary"),
    "partition-primary": lambda: Partition("primary"),
    "partition-leader": lambda: Partition("leader"),
    "majority": lambda: Partition("majority"),
    "bridge": lambda: Partition("bridge"),
    "one-way": lambda: Partition("one-way"),
    "flapping": lambda: Partition("primary", flapping=True),
    "latency": lambda: SlowLinks("latency"),
    "bandwidth": lambda: SlowLinks("bandwidth"),
    "slicer": lambda: SlowLinks("slicer"),
    "limit-data": lambda: SlowLinks("limit-data"),
    "cpu": lambda: CpuStarvation(),
    "rolling-restart": lambda: RollingRestart(),
    "join-leave": lambda: JoinLeave(),
    "power-loss-all": lambda: PowerLoss("all"),
    "power-loss-node": lambda: PowerLoss("node"),
    "power-loss-primary": lambda: PowerLoss("primary"),
    "power-loss-writeback": lambda: PowerLoss("node", writeback=True),
    "disk-full": lambda: DiskFault("full"),
    "disk-errors": lambda: DiskFault("errors"),
}
# The nemeses that need each node's data directory on the power-loss file system.
POWER_NEMESES = frozenset({"power-loss-all", "power-loss-node", "power-loss-primary",
                           "power-loss-writeback", "disk-full", "disk-errors"})
# The nemeses that need a spare node beside the members.
SPARE_NEMESES = frozenset({"join-leave"})
# The nemeses hosts mode (`--hosts`, hosts.py) refuses, and why.
_NO_NETEM = "needs a proxy or netem between the nodes, and hosts mode has neither"
HOSTS_REFUSED = {
    "latency": _NO_NETEM,
    "slicer": _NO_NETEM,
    "limit-data": _NO_NETEM,
    "bandwidth": "tc tbf can only cap everything a node sends, not its links to the other "
                 "nodes alone",
}


def parse_nemeses(text: str) -> list[str]:
    """A comma-separated list of names from NEMESES ('none' or '' for none)."""
    names = [name.strip() for name in text.split(",") if name.strip() and name != "none"]
    unknown = [name for name in names if name not in NEMESES]
    if unknown:
        raise ValueError(f"unknown nemesis {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(NEMESES))}")
    return names


@dataclass(frozen=True)
class Window:
    """One fault, from its start to its stop (seconds since the run started)."""

    name: str
    start_t: float
    stop_t: float
    targets: tuple[int, ...]
    majority_connected: bool


@dataclass
class Schedule:
    """Quiet, then one fault (picked among `names` by the seed) for `fault_s`, then quiet...
    until `duration_s`; every fault is stopped before `run` returns."""

    names: Sequence[str]
    rng: random.Random
    fault_s: tuple[float, float] = (4.0, 8.0)
    quiet_s: tuple[float, float] = (3.0, 6.0)
    windows: list[Window] = field(default_factory=list)

    async def run(self, target: Target, *, duration_s: float, clock: Callable[[], float],
                  on_event: Callable[[str, str, list[int], bool, float], None]) -> None:
        """`clock()` is seconds since the run started; `on_event(name, phase, targets,
        majority_connected, at)` is told every start and stop, `at` (on `clock()`) the moment
        the fault had hit (the victim killed, the link cut, the node joined and primary) or
        its stop was done (every node back, every link healed)."""
        if not self.names:
            await asyncio.sleep(max(0.0, duration_s - clock()))
            return
        while True:
            await asyncio.sleep(self.rng.uniform(*self.quiet_s))
            length = self.rng.uniform(*self.fault_s)
            if clock() + length >= duration_s:
                break
            name = self.rng.choice(list(self.names))
            fault = NEMESES[name]()
            fault.name = name  # histories and reports use the names the command line takes
            begun = clock()
            started = await fault.start(target)
            on_event(fault.name, "start", started.targets, started.majority_connected, clock())
            try:
                await asyncio.sleep(max(0.0, length - (clock() - begun)))
            finally:
                await fault.stop(target)
                on_event(fault.name, "stop", started.targets, started.majority_connected,
                         clock())
            self.windows.append(Window(fault.name, begun, clock(), tuple(started.targets),
                                       started.majority_connected))
        await asyncio.sleep(max(0.0, duration_s - clock()))
