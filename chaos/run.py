"""One chaos run: a local cluster with a Toxiproxy proxy on every link, a workload (publishers
through random nodes with msg_ids and retries, unary and batched; a consumer that fetches and
acks; a prober publishing every 50 ms; a reader), a seeded schedule of faults, then heal,
convergence, and the checkers over the whole history (`run_chaos`, `raftlog chaos run`).
Then, unless `config.audit` is off, the healed cluster is audited: once the metadata is quiescent
(every member at the same applied Raft index) the nodes stop, and every member's data directory
is exported offline and audited with Spark (chaos/final_audit.py); the audit's outcome is the
report's `audit` section, and a run whose audit is not clean is not ok.

In hosts mode (`config.hosts`, `raftlog chaos run --hosts`) there is no Toxiproxy: every node
runs in its own network namespace on its own address, this process runs in the run's client
namespace (chaos/hosts_run.py puts it there), and the nemeses' network is hosts.HostNet.

Everything is bounded in time and cleaned up: the nodes and the Toxiproxy server this run
started are stopped by pid, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from raftlog.base.clock import FakeClock
from raftlog.chaos import timeline
from raftlog.chaos import workload as wl
from raftlog.chaos.checks.verdict import Verdict, check_all
from raftlog.chaos.cluster import LocalCluster, RaftSettled
from raftlog.chaos.disks import read_stopped_copy
from raftlog.chaos.events import HistoryWriter, Op
from raftlog.chaos.final_audit import AuditSection, run_audit, skipped
from raftlog.chaos.hosts import HostNet
from raftlog.chaos.hosts_run import attached_net
from raftlog.chaos.links import Net, ProxyNet
from raftlog.chaos.nemesis import NEMESES, POWER_NEMESES, SPARE_NEMESES, Schedule
from raftlog.chaos.nodeproc import free_port
from raftlog.chaos.powerfs import PowerFs
from raftlog.chaos.recorded import PROBE_NAME, FaultEvent, Read, final_state, to_history
from raftlog.chaos.toxiproxy.launch import ToxiproxyProcess, start_toxiproxy
from raftlog.node.cli import localcluster
from raftlog.node.cli.localcluster import NodeSpec, ProcessState
from raftlog.v1 import cluster_pb2, streams_pb2, streams_pb2_grpc

STREAM = "chaos"
SUBJECT_PREFIX = "chaos"
CONSUMER = "auditor"
# Ack calls of the consumer at once, running while it fetches on: its saves overlap, so the
# nodes gather them (consumer_save_gather_ms) as they do a busy consumer's.
CONSUMER_ACKS_INFLIGHT = 4
probe_period_s = 0.05  # the prober publishes this often, each with its own deadline
probe_timeout_s = 1.0
read_period_s = 0.1
read_timeout_s = 1.0
call_timeout_s = 2.0
route_timeout_s = 2.0
membership_call_timeout_s = 30.0  # one JoinNode, LeaveNode or MigrateStream call
membership_timeout_s = 60.0  # retries of one membership change until it is done
membership_retry_s = 0.5
heal_timeout_s = 60.0  # after the last fault: every node back and the replicas converged
settle_timeout_s = 30.0  # then: every member at the same applied Raft index, before the stop
drain_timeout_s = 30.0  # the consumer's drain after the publishers stop
batch_size = 10  # the batched publisher's PublishBatch size


@dataclass(frozen=True)
class RunConfig:
    workdir: Path
    nodes: int = 3
    duration_s: float = 60.0
    nemeses: tuple[str, ...] = ()
    rate_per_s: float = 200.0  # messages per second, over both publishers
    seed: int = 0
    fault_s: tuple[float, float] = (4.0, 8.0)
    quiet_s: tuple[float, float] = (3.0, 6.0)
    hosts: bool = False  # each node in its own network namespace (chaos/hosts.py)
    audit: bool = True  # export the stopped nodes and audit them with Spark (final_audit.py)

    @property
    def replicas(self) -> int:
        return min(3, self.nodes)

    @property
    def spares(self) -> int:
        """Nodes planned beside the members, started only to join (the join-leave nemesis)."""
        return int(bool(SPARE_NEMESES & set(self.nemeses)))

    @property
    def power(self) -> bool:
        """The nodes' data directories go on the power-loss file system (chaos/powerfs)."""
        return bool(POWER_NEMESES & set(self.nemeses))


@dataclass
class RunResult:
    config: RunConfig
    verdict: Verdict
    faults: list[dict[str, Any]] = field(default_factory=list)
    acknowledged: int = 0
    elapsed_s: float = 0.0
    history_path: str = ""
    copies: list[str] = field(default_factory=list)  # the replica copies compared
    audit: AuditSection = field(default_factory=skipped)
    raft_before_stop: dict[str, Any] = field(default_factory=dict)  # RaftSettled.to_dict()

    @property
    def ok(self) -> bool:
        return self.verdict.ok and self.audit.ok

    def replay_command(self) -> str:
        c = self.config
        return (f"raftlog chaos run --nodes {c.nodes} --duration {c.duration_s:g} --nemesis "
                f"{','.join(c.nemeses) or 'none'} --rate {c.rate_per_s:g} --seed {c.seed}"
                + (" --hosts" if c.hosts else ""))

    def to_dict(self) -> dict[str, Any]:
        config = asdict(self.config)
        config["workdir"] = str(self.config.workdir)
        return {"config": config, "ok": self.ok, "elapsed_s": round(self.elapsed_s, 3),
                "acknowledged": self.acknowledged, "faults": self.faults,
                "verdict": self.verdict.to_dict(), "copies_compared": self.copies,
                "raft_before_stop": self.raft_before_stop, "audit": self.audit.to_dict(),
                "history": self.history_path,
                "replay": self.replay_command()}


class ChaosCluster:
    """The cluster under test, as nemeses see it (nemesis.Target): behind Toxiproxy, or with
    `host_net` each node in its own network namespace (hosts mode)."""

    def __init__(self, config: RunConfig, toxiproxy: ToxiproxyProcess | None, *,
                 host_net: HostNet | None = None) -> None:
        if (toxiproxy is None) == (host_net is None):
            raise ValueError("a chaos cluster needs a Toxiproxy server or a HostNet (one)")
        self.rng = random.Random(f"{config.seed}:nemesis")
        self._config = config
        self._toxiproxy = toxiproxy
        self._host_net = host_net
        self._proxies: ProxyNet | None = None
        self.disks: dict[int, PowerFs] = {}
        self.cluster = LocalCluster(
            config.workdir / "cluster", nodes=config.nodes, prepare=self._prepare,
            node_args=self._node_args, spares=config.spares,
            host_of=host_net.address if host_net else None,
            command_prefix=self._command_prefix if host_net else None)
        self._ack_hooks: list[Callable[[], None]] = []

    def _prepare(self, specs: list[NodeSpec]) -> None:
        if self._toxiproxy is not None:
            self._proxies = ProxyNet(specs, api_host=self._toxiproxy.host,
                                     api_port=self._toxiproxy.port).create()
        if self._config.power:
            self.unmount()
            for spec in specs:
                backing = self._config.workdir / "disks" / spec.node_id
                backing.mkdir(parents=True, exist_ok=True)
                spec.data_dir.mkdir(parents=True, exist_ok=True)
                self.disks[spec.index] = PowerFs.mount(backing, spec.data_dir)

    def unmount(self) -> None:
        for disk in self.disks.values():
            disk.unmount()
        self.disks.clear()

    def disk(self, i: int) -> PowerFs:
        return self.disks[i]

    async def ensure_running(self, i: int) -> None:
        node = self.cluster.nodes.get(i)
        alive = (node is not None and i in self.cluster.running
                 and localcluster.process_state(node.record()) is ProcessState.RUNNING)
        if not alive:
            if i in self.cluster.running:
                await asyncio.to_thread(self.cluster.kill9, i)
            await asyncio.to_thread(self.cluster.start, i)

    def _node_args(self, spec: NodeSpec) -> list[str]:
        return self._proxies.dial_args(spec) if self._proxies is not None else []

    def _command_prefix(self, spec: NodeSpec) -> list[str]:
        """Hosts mode: node i runs in its own namespace."""
        return self._host_net.exec_prefix(spec.index) if self._host_net is not None else []

    @property
    def net(self) -> Net:
        if self._host_net is not None:
            return self._host_net
        if self._proxies is None:
            raise RuntimeError("the cluster's proxies are made when it starts")
        return self._proxies

    def _client_address(self, i: int) -> str:
        """Where clients call node i: its client proxy, or in hosts mode the node itself."""
        if self._host_net is not None:
            return self.cluster.specs[i].grpc_address
        if self._proxies is None:
            raise RuntimeError("the cluster's proxies are made when it starts")
        return self._proxies.client_address(i)

    def node_indexes(self) -> list[int]:
        return sorted(self.cluster.specs)

    def running(self) -> list[int]:
        return sorted(self.cluster.running)

    def addresses(self) -> list[str]:
        """Where clients call: each node's client proxy (hosts mode: each node)."""
        return [self._client_address(i) for i in self.node_indexes()]

    def node_of(self) -> dict[str, str]:
        return {self._client_address(i): f"n{i}" for i in self.node_indexes()}

    def peer_access(self) -> wl.PeerAccess:
        access = self.cluster.peer_access()
        peer_of = dict(access.peer_of)
        for i, spec in self.cluster.specs.items():
            peer_of[self._client_address(i)] = spec.peer_address
        return wl.PeerAccess(credential=access.credential, peer_of=peer_of)

    async def _route(self) -> cluster_pb2.RouteExplanation | None:
        """The stream's route, asked of the running nodes directly (not through their client
        proxies); None when no one answers."""
        addresses = [self.cluster.spec(i).grpc_address for i in self.running()]
        try:
            return await wl.explain_route(addresses, STREAM, timeout_s=route_timeout_s)
        except grpc.RpcError:
            return None

    async def primary(self) -> int:
        """A random running node when no one names one."""
        route = await self._route()
        if route is None or not route.primary:
            return self.rng.choice(self.running())
        return self.cluster.index_of(route.primary)

    async def replica_set(self) -> list[int]:
        """Every node when no one answers."""
        route = await self._route()
        if route is None or not route.replicas:
            return self.node_indexes()
        return sorted(self.cluster.index_of(node) for node in route.replicas)

    async def leader(self) -> int:
        leader = await asyncio.to_thread(self.cluster.leader_id, among=self.running())
        return self.cluster.index_of(leader) if leader else self.rng.choice(self.running())

    async def kill9(self, i: int) -> None:
        await asyncio.to_thread(self.cluster.kill9, i)

    async def restart(self, i: int) -> None:
        if i in self.cluster.running:
            await asyncio.to_thread(self.cluster.stop, i)
        await asyncio.to_thread(self.cluster.start, i)

    def pid(self, i: int) -> int:
        return self.cluster.node(i).pid

    # -- right after an acknowledgement --------------------------------------------------

    def acked(self) -> None:
        """Told by the publishers the moment a write is acknowledged (before anything else
        runs on the loop)."""
        for hook in list(self._ack_hooks):
            hook()

    async def kill9_after_ack(self, i: int, *, timeout_s: float) -> None:
        """kill -9 of node i from inside the next acknowledgement's callback, so the node
        dies right after it acknowledged; after `timeout_s` without one, at once."""
        fired = asyncio.Event()
        pid = self.pid(i)

        def on_ack() -> None:
            if not fired.is_set():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                fired.set()

        self._ack_hooks.append(on_ack)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fired.wait(), timeout_s)
        finally:
            self._ack_hooks.remove(on_ack)
        await self.kill9(i)  # reaps it (or kills it now if no ack came)

    # -- membership ----------------------------------------------------------------------

    def spares(self) -> list[int]:
        return sorted(self.cluster.spare_specs)

    async def join(self, i: int) -> None:
        """Starts spare i on an empty data directory and joins it through a running member."""
        spec = self.cluster.spec(i)
        await asyncio.to_thread(_empty, spec.data_dir)
        await asyncio.to_thread(self.cluster.start, i)
        request = cluster_pb2.JoinNodeRequest(
            node_id=spec.node_id, raft_address=spec.raft_address,
            grpc_address=spec.grpc_address, peer_address=spec.peer_address)
        await self._admin("JoinNode", request, done={"NODE_EXISTS"}, avoid=i)

    async def leave(self, i: int) -> None:
        """Takes node i out of the cluster (its copies and primaries move first), stops it
        and empties its data directory."""
        request = cluster_pb2.LeaveNodeRequest(node_id=self.cluster.spec(i).node_id)
        await self._admin("LeaveNode", request, done={"NODE_NOT_FOUND"}, avoid=i)
        await asyncio.to_thread(self.cluster.stop, i)
        await asyncio.to_thread(_empty, self.cluster.spec(i).data_dir)

    async def move_primary(self, i: int) -> None:
        """The run's stream moves its primary to node i (MigrateStream)."""
        request = cluster_pb2.MigrateStreamRequest(stream=STREAM,
                                                   target=self.cluster.spec(i).node_id)
        await self._admin("MigrateStream", request, done=set(), avoid=None)

    async def _admin(self, method: str, request: Any, *, done: set[str],
                     avoid: int | None) -> None:
        """One admin call through a random running member, retried until it succeeds (or
        fails with a reason in `done`) or `membership_timeout_s` passes."""
        deadline = time.monotonic() + membership_timeout_s
        while True:
            via = self.rng.choice([i for i in self.running() if i != avoid])
            call = getattr(self.cluster.cluster(via), method)
            try:
                await asyncio.to_thread(call, request, timeout=membership_call_timeout_s)
                return
            except grpc.RpcError as exc:
                reason = wl.error_name(exc)
                if reason in done:
                    return
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"{method} through n{via} still failing after "
                                       f"{membership_timeout_s} s: {reason}") from exc
            await asyncio.sleep(membership_retry_s)


def _empty(directory: Path) -> None:
    """Removes what `directory` holds (it may be a mount point, so it stays)."""
    if not directory.exists():
        return
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


class Reader:
    """GetStreamInfo through a random node every read_period_s: the last seq it reports."""

    def __init__(self, addresses: list[str], rng: random.Random) -> None:
        self._addresses = addresses
        self._rng = rng
        self.reads: list[Read] = []
        self._stopping = False

    def stop(self) -> None:
        self._stopping = True

    async def run(self) -> None:
        channels = {a: grpc.aio.insecure_channel(a) for a in self._addresses}
        try:
            while not self._stopping:
                address = self._rng.choice(self._addresses)
                stub = streams_pb2_grpc.StreamsStub(channels[address])  # type: ignore[no-untyped-call]
                sent = time.monotonic()
                try:
                    info = await stub.GetStreamInfo(
                        streams_pb2.GetStreamInfoRequest(name=STREAM), timeout=read_timeout_s)
                    self.reads.append(Read(address, sent, time.monotonic(),
                                           int(info.state.last_seq)))
                except grpc.RpcError as exc:
                    self.reads.append(Read(address, sent, time.monotonic(), None,
                                           wl.error_name(exc)))
                await asyncio.sleep(read_period_s)
        finally:
            for channel in channels.values():
                await channel.close(None)


async def _workload(config: RunConfig, target: ChaosCluster, progress: Callable[[str], None]
                    ) -> _Collected:
    addresses = target.addresses()
    await wl.create_stream(addresses, STREAM, subjects=[f"{SUBJECT_PREFIX}.>"],
                           replicas=config.replicas)
    half = config.rate_per_s / 2
    publishers = [
        wl.Publisher(addresses, wl.PublisherConfig(
            stream=STREAM, subject_prefix=SUBJECT_PREFIX, name="p1", subjects=4,
            count_max=10**9, duration_s_max=config.duration_s, rate_per_s=half,
            call_timeout_s=call_timeout_s),
            seed=config.seed, on_ack=target.acked),
        wl.Publisher(addresses, wl.PublisherConfig(
            stream=STREAM, subject_prefix=SUBJECT_PREFIX, name="p2", subjects=4,
            count_max=10**9, duration_s_max=config.duration_s, rate_per_s=half,
            batch_size=batch_size, call_timeout_s=call_timeout_s),
            seed=config.seed, on_ack=target.acked),
        wl.Publisher(addresses, wl.PublisherConfig(
            stream=STREAM, subject_prefix=f"{SUBJECT_PREFIX}.probe", name=PROBE_NAME,
            count_max=10**9, duration_s_max=config.duration_s,
            rate_per_s=1 / probe_period_s, call_timeout_s=probe_timeout_s),
            seed=config.seed, on_ack=target.acked),
    ]
    consumer = wl.Consumer(addresses, wl.ConsumerConfig(
        stream=STREAM, name=CONSUMER, duration_s_max=config.duration_s + heal_timeout_s
        + drain_timeout_s, call_timeout_s=call_timeout_s, acks_inflight=CONSUMER_ACKS_INFLIGHT),
        seed=config.seed)
    await consumer.create()
    reader = Reader(addresses, random.Random(f"{config.seed}:reader"))
    schedule = Schedule(list(config.nemeses), target.rng, fault_s=config.fault_s,
                        quiet_s=config.quiet_s)
    started_at = time.monotonic()
    faults: list[FaultEvent] = []

    def on_event(name: str, phase: str, targets: list[int], majority: bool, since: float
                 ) -> None:
        at = started_at + since
        faults.append(FaultEvent(at, name, phase, tuple(f"n{i}" for i in targets), majority))
        progress(f"{at - started_at:7.1f} s  {phase:5} {name} "
                 f"{','.join(f'n{i}' for i in targets)}")

    consume_task = asyncio.create_task(consumer.run())
    read_task = asyncio.create_task(reader.run())
    published = await asyncio.gather(
        *(p.run() for p in publishers),
        schedule.run(target, duration_s=config.duration_s,
                     clock=lambda: time.monotonic() - started_at, on_event=on_event))
    reader.stop()
    await read_task
    progress("faults over: healing, restarting, waiting for the replicas to converge")
    await _heal(target)
    consumer.stop(drain_timeout_s=drain_timeout_s)
    consumed = await consume_task
    contents = await wl.read_stream(addresses, STREAM)
    peer = target.peer_access()
    await wl.wait_replicas_converged(addresses, STREAM, copies_min=config.replicas,
                                     timeout_s=heal_timeout_s, peer=peer)
    survey = await wl.read_replicas(addresses, STREAM, peer=peer)
    history = to_history(started_at=started_at, stream=STREAM, node_of=target.node_of(),
                         published=[h for h in published if h is not None],
                         consumed=[consumed], reads=reader.reads, faults=faults)
    history_path = config.workdir / "history.jsonl"
    with HistoryWriter.open(history_path, clock=FakeClock()) as writer:
        for op in history:
            writer.append(op)
    return _Collected(history, contents, survey, [asdict(w) for w in schedule.windows],
                      str(history_path))


@dataclass
class _Collected:
    """What a run gathered for the checks."""

    history: list[Op]
    contents: wl.StreamContents
    survey: wl.ReplicaSurvey
    faults: list[dict[str, Any]]
    history_path: str


def _read_disks(target: ChaosCluster, survey: wl.ReplicaSurvey) -> None:
    """Each stopped node's copy, read from its database, joins the survey."""
    for i in target.node_indexes():
        spec = target.cluster.spec(i)
        copy = read_stopped_copy(spec.data_dir, STREAM, node=spec.node_id)
        if copy is None:
            survey.notes.append(f"{spec.node_id}: no copy of {STREAM!r} on its disk")
        else:
            survey.copies.append(copy)


def _settle(target: ChaosCluster, progress: Callable[[str], None]) -> RaftSettled:
    """Waits (bounded) until the metadata is quiescent, so that the nodes stop at the same
    applied Raft index: their stopped copies and metadata views are then comparable. A cluster
    that does not settle is noted in the report and stopped anyway."""
    settled = target.cluster.wait_raft_settled(settle_timeout_s)
    applied = ", ".join(f"{node} {index}" for node, index in settled.seen.applied().items())
    if settled.settled:
        progress(f"metadata quiescent after {settled.waited_s:.1f} s: applied index {applied}")
    else:
        progress(f"metadata not quiescent after {settle_timeout_s:g} s (members "
                 f"{', '.join(settled.seen.members) or 'unknown'}; applied {applied}): "
                 "stopping anyway")
    return settled


def _audit(config: RunConfig, target: ChaosCluster, settled: RaftSettled,
           progress: Callable[[str], None]) -> AuditSection:
    """The stopped members' data directories exported and audited (chaos/final_audit.py)."""
    if not config.audit:
        return skipped()
    members = settled.seen.members or tuple(target.cluster.spec(i).node_id
                                            for i in target.node_indexes())
    dirs = [(node, target.cluster.spec(target.cluster.index_of(node)).data_dir)
            for node in members]
    progress(f"auditing {', '.join(members)}: offline exports, then Spark")
    section = run_audit(dirs, config.workdir / "audit", progress=progress)
    progress(section.summary().splitlines()[0])
    return section


def _judge(config: RunConfig, collected: _Collected, audit: AuditSection,
           settled: RaftSettled) -> RunResult:
    history = collected.history
    verdict = check_all(history, final_state(collected.contents, collected.survey),
                        seed=config.seed, instant_faults=frozenset(NEMESES))
    title = (f"raftlog chaos: {config.nodes} nodes, {','.join(config.nemeses) or 'no faults'}, "
             f"seed {config.seed}")
    png = timeline.write_png(history, config.workdir / "timeline.png", title=title)
    timeline.write_html(history, config.workdir / "timeline.html", png=png, title=title,
                        summary=verdict.summary(), audit=audit.summary(),
                        audit_link=_relative(audit.report_html, config.workdir))
    return RunResult(config=config, verdict=verdict, acknowledged=verdict.acknowledged,
                     faults=collected.faults, history_path=collected.history_path,
                     copies=sorted(copy.node for copy in collected.survey.copies),
                     audit=audit, raft_before_stop=settled.to_dict())


def _relative(path: str, start: Path) -> str:
    """`path` relative to `start` when under it (a link from a page in `start`), else as is."""
    if not path:
        return ""
    with contextlib.suppress(ValueError):
        return str(Path(path).relative_to(start))
    return path


async def _heal(target: ChaosCluster) -> None:
    await asyncio.to_thread(target.net.heal)
    for disk in target.disks.values():
        await asyncio.to_thread(disk.ok)
    for i in target.node_indexes():
        await target.ensure_running(i)
    await asyncio.to_thread(target.cluster.wait_for_leader, heal_timeout_s)


def run_chaos(config: RunConfig, *, progress: Callable[[str], None] = print) -> RunResult:
    """Runs the whole thing; the report lands in workdir/report.json. With `config.hosts` this
    process must be the inside run of `raftlog chaos run --hosts` (hosts_run.attached_net)."""
    config.workdir.mkdir(parents=True, exist_ok=True)
    begun = time.monotonic()
    host_net = attached_net(config) if config.hosts else None
    toxiproxy = None if host_net else start_toxiproxy("127.0.0.1", free_port())
    target = ChaosCluster(config, toxiproxy, host_net=host_net)
    try:
        if host_net is not None:
            progress(f"hosts mode, in {host_net.client_ns}: starting {config.nodes} nodes")
        elif toxiproxy is not None:
            progress(f"toxiproxy at {toxiproxy.url} "
                     f"({'bundled' if toxiproxy.bundled else 'binary'}); "
                     f"starting {config.nodes} nodes")
        target.cluster.start_all()
        collected = asyncio.run(_workload(config, target, progress))
        settled = _settle(target, progress)
        progress("stopping the nodes; reading each one's copy from its disk")
        target.cluster.stop_all()
        _read_disks(target, collected.survey)
        # Before unmount(): a power-loss run's data directories are on its FUSE disks.
        audit = _audit(config, target, settled, progress)
    finally:
        target.cluster.stop_all()
        target.unmount()
        if toxiproxy is not None:
            toxiproxy.stop()
    result = _judge(config, collected, audit, settled)
    result.elapsed_s = time.monotonic() - begun
    (config.workdir / "report.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return result
