"""One simulated run (`run_schedule`): build N nodes on a virtual-time loop, form the cluster,
create the streams, run the clients while the seeded fault schedule plays, heal, let the
cluster settle, and check what the clients were told against what the nodes hold.

Everything random comes from `random.Random(f"{seed}:{purpose}")`, one generator per purpose
(network, Raft, faults, clients, crashes, disks), so a seed reproduces the run exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from raftlog.base.errors import InvariantViolation, RaftlogError
from raftlog.chaos.sim.bugs import REPLICA_ACKS_BEFORE_FSYNC, injected
from raftlog.chaos.sim.checks import KNOWN_ISSUES, Assignment, Copy, Violation, check
from raftlog.chaos.sim.clock import SimClock
from raftlog.chaos.sim.faults import Fault, make_schedule
from raftlog.chaos.sim.loop import SimDeadlock, SimLivelock, VirtualTimeLoop
from raftlog.chaos.sim.network import CLIENT, LinkSettings, SimNetwork
from raftlog.chaos.sim.node import SimNode
from raftlog.chaos.sim.raft import SimRaft
from raftlog.chaos.sim.trace import Trace
from raftlog.chaos.sim.workload import CONSUMER, Clients, History, consumer_ack_wait_ms
from raftlog.internal import raft_pb2
from raftlog.node.cluster.coordinator import ClusterNode
from raftlog.node.consumers.config import validate_config as validate_consumer_config
from raftlog.node.engine.stream import ROLE_PRIMARY
from raftlog.node.engine.stream_config import validate_config as validate_stream_config
from raftlog.raft import commands
from raftlog.v1 import consumers_pb2, types_pb2

setup_timeout_s = 10.0  # virtual seconds for the cluster to form and the streams to exist
settle_timeout_s = 30.0  # virtual seconds after the heal for the copies to converge
commit_grace_s = 1.0  # virtual seconds after that for the replicas' commit seqs to follow
poll_s = 0.05  # virtual seconds between checks of a condition
fsync_s_min = 0.0001  # a healthy disk's fsync, seeded in this range (DESIGN §3: ~0.2 ms)
fsync_s_max = 0.001
latency_s_min = 0.0002  # a healthy link's one-way latency, seeded per run in this range
latency_s_max = 0.002
clock_rate_skew_max = 0.001  # a node's monotonic clock runs at 1 +- this
log_records_kept_max = 20  # ERROR log records a verdict keeps
stored_bytes_max = 1 << 40  # a copy is read whole for the final check
stop_wait_s = 1.0  # virtual seconds the end of a run waits for its cancelled tasks


@dataclass(frozen=True)
class SimConfig:
    """The shape of a run; with the seed, everything that decides it."""

    nodes: int = 3
    steps: int = 20
    streams: int = 2
    replicas: int = 3
    publishers: int = 2
    readers: int = 1
    consumers: int = 1  # consumer clients (each with the durable consumer of one stream)
    bug: str = ""
    power_loss: bool = False  # power-loss faults in the schedules (see faults.py)
    strict: bool = False  # known issues (checks.KNOWN_ISSUES) fail a run too

    def replay_command(self, seed: int) -> str:
        """The one command that replays the run of `seed`."""
        command = (f"python -m raftlog.chaos.sim --seed {seed} --schedules 1 "
                   f"--nodes {self.nodes} --steps {self.steps}")
        defaults = SimConfig()
        for name in ("streams", "replicas", "publishers", "readers", "consumers"):
            if getattr(self, name) != getattr(defaults, name):
                command += f" --{name} {getattr(self, name)}"
        command += f" --bug {self.bug}" if self.bug else ""
        command += " --power-loss" if self.power_loss else ""
        return command + (" --strict" if self.strict else "")


@dataclass
class Verdict:
    """The outcome of one run."""

    seed: int
    config: SimConfig
    violations: list[Violation]
    digest: str
    virtual_s: float = 0.0
    real_s: float = 0.0
    cpu_s: float = 0.0  # CPU time of the run's process (its share of a loaded machine aside)
    acked: int = 0
    attempts: int = 0
    delivered: int = 0
    failovers: int = 0
    schedule: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)
    errors_logged: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[Violation]:
        """The violations that fail the run (known issues only when strict)."""
        return [v for v in self.violations
                if self.config.strict or v.kind not in KNOWN_ISSUES]

    @property
    def known(self) -> list[Violation]:
        return [v for v in self.violations if v not in self.failures]

    @property
    def ok(self) -> bool:
        return not self.failures

    def line(self) -> str:
        status = "ok  " if self.ok else "FAIL"
        kinds = sorted({v.kind for v in self.failures})
        known = sorted({v.kind for v in self.known})
        return (f"{status} seed={self.seed} digest={self.digest} acked={self.acked} "
                f"attempts={self.attempts} delivered={self.delivered} "
                f"failovers={self.failovers} "
                f"virtual={self.virtual_s:.1f}s real={self.real_s:.2f}s"
                + (f" errors={len(self.errors_logged)}" if self.errors_logged else "")
                + (f" violations={','.join(kinds)}" if kinds else "")
                + (f" known={','.join(known)}" if known else ""))

    def report(self) -> str:
        """What a failure prints: the violations, the schedule, the trace's tail, the replay
        command."""
        lines = [self.line(), "violations:", *(f"  {v}" for v in self.failures),
                 *(f"  (known issue) {v}" for v in self.known),
                 "schedule:", *(f"  {f}" for f in self.schedule),
                 "trace tail:", *(f"  {t}" for t in self.tail)]
        if self.errors_logged:
            lines += ["errors logged:", *(f"  {e}" for e in self.errors_logged)]
        lines += ["replay with:", f"  {self.config.replay_command(self.seed)}"]
        return "\n".join(lines)


class Simulation:
    """The world of one run; see the module docstring."""

    def __init__(self, seed: int, config: SimConfig, loop: VirtualTimeLoop) -> None:
        self.config = config
        self.loop = loop
        self.trace = Trace(loop.time)
        setup = self._rng(seed, "setup")
        self.ids = tuple(f"n{i}" for i in range(1, config.nodes + 1))
        latency_s = setup.uniform(latency_s_min, latency_s_max)
        self.network = SimNetwork(rng=self._rng(seed, "network"), trace=self.trace,
                                  base=LinkSettings(latency_s=latency_s, jitter_s=latency_s))
        self.raft = SimRaft(nodes=self.ids, network=self.network, rng=self._rng(seed, "raft"),
                            trace=self.trace)
        self._disk_rng = self._rng(seed, "disk")
        self._crash_rng = self._rng(seed, "crash")
        self._slow_fsync_s: dict[str, float] = {}
        self.nodes = {node: self._node(node, setup) for node in self.ids}
        self.schedule = make_schedule(self._rng(seed, "faults"), nodes=self.ids,
                                      steps=config.steps, power_loss=config.power_loss)
        self.streams = tuple(f"s{i}" for i in range(1, config.streams + 1))
        self.history = History()
        self.clients = Clients(nodes=self.nodes, network=self.network,
                               rng=self._rng(seed, "clients"), trace=self.trace,
                               streams=self.streams, history=self.history)
        self.loop_errors: list[str] = []
        self.invariant_errors: list[str] = []
        self.logged: list[str] = []  # raftlog's ERROR records (quiet_logs)
        loop.set_exception_handler(self._on_loop_error)

    @staticmethod
    def _rng(seed: int, purpose: str) -> random.Random:
        return random.Random(f"{seed}:{purpose}")

    def _node(self, node_id: str, setup: random.Random) -> SimNode:
        clock = SimClock(self.loop, rate=1 + setup.uniform(-clock_rate_skew_max,
                                                           clock_rate_skew_max))
        node = SimNode(node_id=node_id, loop=self.loop, network=self.network, raft=self.raft,
                       clock=clock, fsync_s=lambda: self._fsync_s(node_id),
                       lying_replica=self.config.bug == REPLICA_ACKS_BEFORE_FSYNC)
        node.peers_of = lambda peer: self.nodes.get(peer)
        return node

    def _fsync_s(self, node_id: str) -> float:
        slow = self._slow_fsync_s.get(node_id, 0.0)
        return slow or self._disk_rng.uniform(fsync_s_min, fsync_s_max)

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        text = f"{context.get('message', '')}: {error!r}"
        if isinstance(error, InvariantViolation):
            self.invariant_errors.append(text)
        elif len(self.loop_errors) < log_records_kept_max:
            self.loop_errors.append(text)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        return self.loop.create_task(coro, context=self.network.root)

    # ----------------------------------------------------------------- the run

    async def run(self) -> list[Violation]:
        self._spawn(self.raft.run())
        for node in self.nodes.values():
            await node.boot()
        await self._until(self._registered, setup_timeout_s, "the cluster to form")
        await self._create_streams()
        publishers = [self._spawn(self.clients.publisher(i))
                      for i in range(self.config.publishers)]
        workers = [*publishers,
                   *(self._spawn(self.clients.reader(i)) for i in range(self.config.readers)),
                   *(self._spawn(self.clients.consumer(i)) for i in range(self.config.consumers))]
        started_s = self.loop.time()
        for fault in self.schedule:
            await asyncio.sleep(max(0.0, started_s + fault.at_s - self.loop.time()))
            await self.apply(fault)
        await self._heal_all()
        self.clients.stopping = True
        settle_started_s = self.loop.time()
        await self._wait(lambda: all(p.done() for p in publishers), settle_timeout_s)
        self.clients.draining = True
        settled = await self._wait(
            lambda: self._converged(commits=False) and all(w.done() for w in workers),
            settle_started_s + settle_timeout_s - self.loop.time())
        if settled:  # the commit seqs follow within a heartbeat or two
            await self._wait(self._converged, commit_grace_s)
        self.trace.note("settled" if settled else "not-settled")
        assignments = self._assignments()
        violations = check(history=self.history, copies=self._copies(), assignments=assignments)
        if len(assignments) < len(self.streams):
            violations.append(Violation("not-converged", "no Raft leader knows every stream"))
        violations += [Violation("invariant", text) for text in self.invariant_errors[:3]]
        violations += [Violation("invariant", text) for text in self.logged
                       if InvariantViolation.__name__ in text][:3]
        if not settled and not any(v.kind == "not-converged" for v in violations):
            violations.append(Violation("not-converged", "the clients did not finish"))
        return violations

    async def _wait(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        deadline = self.loop.time() + timeout_s
        while not condition():
            if self.loop.time() >= deadline:
                return False
            await asyncio.sleep(poll_s)
        return True

    async def _until(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        if not await self._wait(condition, timeout_s):
            raise SetupFailed(f"waited {timeout_s} s for {what}")

    def _registered(self) -> bool:
        return all(node.up and len(node.parts.group.state.members) == len(self.ids)
                   and node.parts.cluster.caught_up() for node in self.nodes.values())

    async def _create_streams(self) -> None:
        proposer = self.nodes[self.ids[0]].parts.cluster
        for name in self.streams:
            # Normalised as the API does before proposing (node/ops/raft_first.py).
            config = validate_stream_config(types_pb2.StreamConfig(
                name=name, replicas=self.config.replicas))
            primary, replicas = proposer.new_placement(config)
            await self._propose(proposer, commands.stream_create(
                config=config, replicas=replicas, primary=primary), exists="STREAM_EXISTS")
            await self._propose(proposer, commands.consumer_create(
                stream=name, config=validate_consumer_config(consumers_pb2.ConsumerConfig(
                    name=CONSUMER, ack_wait_ms=consumer_ack_wait_ms),
                    stream_subjects=config.subjects)), exists="CONSUMER_EXISTS")
        await self._until(self._converged, setup_timeout_s, "the streams to be created")
        self.trace.note("streams", " ".join(f"{name}:{a.primary}:{','.join(a.replicas)}"
                                            for name, a in sorted(self._assignments().items())))

    async def _propose(self, proposer: ClusterNode, command: raft_pb2.RaftCommand, *,
                       exists: str) -> None:
        """Commits a setup command, retried (an unknown outcome may have committed it)."""
        for _ in range(int(setup_timeout_s / poll_s)):
            try:
                await proposer.propose(command)
                return
            except RaftlogError as err:
                if err.reason.name == exists:
                    return
                await asyncio.sleep(poll_s)
        raise SetupFailed(f"could not commit {command.WhichOneof('command')}")

    # ----------------------------------------------------------------- faults

    async def apply(self, fault: Fault) -> None:
        self.trace.note("fault", fault.describe())
        kind, nodes, others = fault.kind, fault.nodes, fault.others
        if kind in ("crash", "power-loss"):
            lost, left = await self.nodes[nodes[0]].crash(self._crash_rng,
                                                          power_loss=kind == "power-loss")
            self.trace.note("crashed", f"{nodes[0]} lost {lost} unsynced batches; {left} "
                            "tasks would not stop")
        elif kind == "restart" and not self.nodes[nodes[0]].up:
            await self.nodes[nodes[0]].boot()
        elif kind in ("isolate", "split"):
            pairs = _across(nodes, others)
            if kind == "isolate" and fault.value:
                pairs |= _across(nodes, (CLIENT,))
            self.network.block(pairs)
        elif kind == "bridge":
            self.network.block(_across(nodes, others))
        elif kind == "one-way":
            self.network.block({(nodes[0], other) for other in others})
        elif kind == "slow-link":
            link = LinkSettings(latency_s=fault.value, jitter_s=fault.value / 2,
                                loss_p=fault.extra)
            self.network.set_link(nodes[0], others[0], link)
            self.network.set_link(others[0], nodes[0], link)
        elif kind == "duplicate":
            for a, b in ((nodes[0], others[0]), (others[0], nodes[0])):
                self.network.set_link(a, b, dataclasses.replace(self.network.settings(a, b),
                                                                dup_p=fault.value))
        elif kind == "reset-link":
            self.network.reset_calls(nodes[0], others[0])
        elif kind == "slow-disk":
            self._slow_fsync_s[nodes[0]] = fault.value
        elif kind == "clock-jump":
            self.nodes[nodes[0]].clock.jump_wall(int(fault.value))
        elif kind == "election":
            self.raft.depose()
        elif kind == "heal":
            self.network.heal()

    async def _heal_all(self) -> None:
        self.trace.note("heal-all")
        self.network.heal()
        self._slow_fsync_s.clear()
        for node in self.nodes.values():
            if not node.up:
                await node.boot()

    # ----------------------------------------------------------------- final state

    def _assignments(self) -> dict[str, Assignment]:
        leader = self.raft.leader
        view = self.raft.views.get(leader) if leader is not None else None
        if view is None:
            return {}
        return {name: Assignment(primary=a.primary, replicas=tuple(a.replicas),
                                 fence_epoch=a.fence_epoch)
                for name, a in view.state.streams.items() if name in self.streams}

    def _converged(self, *, commits: bool = True) -> bool:
        """Every stream's named primary serves everything it holds as committed, and every
        replica holds as much (and, with `commits`, knows the same commit seq)."""
        assignments = self._assignments()
        if len(assignments) < len(self.streams):
            return False
        copies = self._copies(values=False)
        for name, assignment in assignments.items():
            primary = copies.get(name, {}).get(assignment.primary)
            if primary is None or not primary.serving or primary.commit_seq != primary.last_seq:
                return False
            for node in assignment.replicas:
                copy = copies[name].get(node)
                if copy is None or copy.last_seq != primary.last_seq or (
                        commits and copy.commit_seq != primary.commit_seq):
                    return False
        return True

    def _copies(self, *, values: bool = True) -> dict[str, dict[str, Copy]]:
        """Every up node's copy of every stream (with `values`, the stored bytes too)."""
        found: dict[str, dict[str, Copy]] = {}
        for node_id, node in self.nodes.items():
            if not node.up:
                continue
            for name, stream in node.parts.engine.streams.items():
                stored = stream.stored_values(from_seq=stream.first_seq, to_seq=stream.last_seq,
                                              bytes_max=stored_bytes_max) if values else []
                found.setdefault(name, {})[node_id] = Copy(
                    node=node_id, role=stream.role,
                    serving=stream.role == ROLE_PRIMARY and stream.deposed is None,
                    epoch=stream.record.epoch, first_seq=stream.first_seq,
                    last_seq=stream.last_seq, commit_seq=stream.commit_seq,
                    stored={seq: v for seq, v in enumerate(stored, start=stream.first_seq) if v})
        return found

    def failovers(self) -> int:
        count = 0
        for data in self.raft.log:
            command = raft_pb2.RaftCommand.FromString(data)
            if command.WhichOneof("command") == "stream_promotes":
                count += len(command.stream_promotes.promotes)
        return count

    async def stop(self) -> None:
        """Ends every task of the run (nodes first), so the loop can close cleanly."""
        for node in self.nodes.values():
            await self.loop.owners.cancel_owned(node.owner)
        others = [task for task in asyncio.all_tasks(self.loop)
                  if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        if others:
            await asyncio.wait(others, timeout=stop_wait_s)


class SetupFailed(Exception):
    """The cluster did not form, or the streams were not created, in time."""


def _across(side: tuple[str, ...], other: tuple[str, ...]) -> set[tuple[str, str]]:
    """Both directions between every node of `side` and every node of `other`."""
    return {pair for a in side for b in other for pair in ((a, b), (b, a))}


@contextlib.contextmanager
def quiet_logs(kept: list[str]) -> Iterator[None]:
    """raftlog's ERROR records go to `kept` (a few) instead of stderr; lower levels are off,
    which also saves the time of formatting them."""
    logger = logging.getLogger("raftlog")
    saved = (logger.level, logger.propagate, list(logger.handlers))

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if len(kept) < log_records_kept_max:
                kind = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] \
                    else ""
                kept.append(f"{record.name}: {record.getMessage()} {kind}".strip())

    logger.handlers = [Keep(logging.ERROR)]
    logger.setLevel(logging.ERROR)
    logger.propagate = False
    try:
        yield
    finally:
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers = saved[2]


def run_schedule(seed: int, config: SimConfig) -> Verdict:
    """One run of `seed` (see the module docstring)."""
    started, cpu_started = time.perf_counter(), time.process_time()
    loop = VirtualTimeLoop()
    sim = Simulation(seed, config, loop)
    with injected(config.bug), quiet_logs(sim.logged):
        try:
            violations = loop.run_until_complete(sim.run())
        except (SimDeadlock, SimLivelock, SetupFailed) as err:
            violations = [Violation(type(err).__name__, str(err))]
        except Exception as err:  # a fault of the simulator itself: reported, not hidden
            violations = [Violation("simulator-error", "".join(
                traceback.format_exception(err)).strip())]
        finally:
            virtual_s = loop.time()
            _close(loop, sim)
    return Verdict(
        seed=seed, config=config, violations=violations, digest=sim.trace.digest(),
        virtual_s=virtual_s, real_s=time.perf_counter() - started,
        cpu_s=time.process_time() - cpu_started,
        acked=len(sim.history.acks), attempts=sim.history.attempts,
        delivered=len(sim.history.deliveries),
        failovers=sim.failovers(), schedule=[f.describe() for f in sim.schedule],
        tail=list(sim.trace.tail), errors_logged=sim.logged + sim.loop_errors)


def _close(loop: VirtualTimeLoop, sim: Simulation) -> None:
    """Ends the run's tasks and closes the loop (also after a deadlock or livelock)."""
    with contextlib.suppress(SimDeadlock, SimLivelock):
        loop.run_until_complete(sim.stop())
    with contextlib.suppress(SimDeadlock, SimLivelock):
        loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


def run_job(job: tuple[int, SimConfig]) -> Verdict:
    """`run_schedule` of (seed, config), for a process pool (a module-level function)."""
    return run_schedule(*job)
