"""A local cluster: N `raftlog node` processes on loopback, started, awaited, stopped and
reported from one directory. Used by `raftlog cluster up|down|status` and by chaos/cluster.py.

This module owns the layout of that directory (node i, 1-based):

    DIR/n{i}/      the node's data          DIR/n{i}.log   its stdout and stderr (appended)
    DIR/n{i}.pid   line 1: the pid; line 2: the exact command line, as a JSON list
    DIR/cluster.secret   the cluster secret (mode 0600), made by `up` unless one is given

and the ports: node i serves gRPC on `base_port + 3*(i-1)`, Raft on the port after it and its
peer listener on the one after that, all on 127.0.0.1; `--peers` names the other nodes' Raft
addresses.

Safety rules, in the order they are applied:
- `up` checks every port and every pid file before starting any process, and refuses when a
  port is taken or a pid file names a node that is still running.
- A pid is signalled only after `/proc/PID/cmdline` shows `--data` with that node's data
  directory, and then through a pidfd opened *before* the check, so a pid the kernel recycled
  to another process in the meantime is never signalled.
- Every wait has a bound (`*_timeout_s`); SIGTERM becomes SIGKILL when it runs out.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raftlog.node.transport.credentials import (
    SECRET_FILE_NAME,
    WeakSecret,
    ensure_secret_file,
    read_secret_file,
)
from raftlog.v1 import cluster_pb2, cluster_pb2_grpc

host = "127.0.0.1"
nodes_max = 32
ports_per_node = 3  # gRPC, Raft, peer listener
ready_timeout_s_default = 60.0
stop_timeout_s_default = 15.0  # SIGTERM -> SIGKILL; the node drains for up to 5 s
kill_wait_s = 5.0  # after SIGKILL
poll_period_s = 0.05
probe_timeout_s = 1.0  # one health or status call while waiting
log_tail_bytes = 4000

_PID_FILE_RE = re.compile(r"n(\d+)\.pid")


class Refusal(enum.Enum):
    """Why a local-cluster action did not happen; the name is printed as the error reason."""

    INVALID_ARGUMENT = "the request itself is wrong"
    PORT_IN_USE = "a port the cluster needs is taken"
    ALREADY_RUNNING = "a pid file names a node that is running"
    START_FAILED = "a node process exited while starting"
    NOT_READY = "the cluster did not become ready in time"
    STOP_FAILED = "a node survived SIGKILL"


class LocalClusterError(Exception):
    def __init__(self, reason: Refusal, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class ProcessState(enum.Enum):
    RUNNING = "running"
    EXITED = "exited"
    # The pid is alive but its command line does not name this node's data dir: the kernel
    # gave the pid to another process after the node ended.
    PID_REUSED = "pid-reused"


class StopOutcome(enum.Enum):
    STOPPED = "stopped"  # exited after SIGTERM
    KILLED = "killed"  # needed SIGKILL (or was asked for it)
    NOT_RUNNING = "not-running"
    REFUSED = "refused-pid-reused"  # the pid belongs to another process: not signalled
    UNREADABLE = "unreadable-pid-file"
    SURVIVED = "survived-sigkill"


# ---------------------------------------------------------------------------------------------
# Plan: names, ports and paths, without touching anything.


@dataclass(frozen=True)
class NodeSpec:
    index: int  # 1-based
    root: Path  # the cluster directory, absolute
    base_port: int
    peers: tuple[str, ...]  # Raft addresses of the other nodes

    @property
    def node_id(self) -> str:
        return f"n{self.index}"

    @property
    def grpc_port(self) -> int:
        return self.base_port + ports_per_node * (self.index - 1)

    @property
    def raft_port(self) -> int:
        return self.grpc_port + 1

    @property
    def peer_port(self) -> int:
        return self.grpc_port + 2

    @property
    def peer_address(self) -> str:
        return f"{host}:{self.peer_port}"

    @property
    def secret_path(self) -> Path:
        return self.root / SECRET_FILE_NAME

    @property
    def grpc_address(self) -> str:
        return f"{host}:{self.grpc_port}"

    @property
    def raft_address(self) -> str:
        return f"{host}:{self.raft_port}"

    @property
    def data_dir(self) -> Path:
        return self.root / self.node_id

    @property
    def log_path(self) -> Path:
        return self.root / f"{self.node_id}.log"

    @property
    def pid_path(self) -> Path:
        return self.root / f"{self.node_id}.pid"


def plan(*, nodes: int, base_port: int, data_dir: Path) -> list[NodeSpec]:
    if not 1 <= nodes <= nodes_max:
        raise LocalClusterError(
            Refusal.INVALID_ARGUMENT, f"--nodes must be 1..{nodes_max}, not {nodes}"
        )
    top_port = base_port + ports_per_node * nodes - 1
    if base_port < 1024 or top_port > 65535:
        raise LocalClusterError(
            Refusal.INVALID_ARGUMENT,
            f"ports {base_port}..{top_port} are outside 1024..65535 "
            f"({nodes} nodes take {ports_per_node * nodes} ports from --base-port)",
        )
    root = data_dir.resolve()
    raft = [f"{host}:{base_port + ports_per_node * i + 1}" for i in range(nodes)]
    return [
        NodeSpec(index=i, root=root, base_port=base_port, peers=(*raft[: i - 1], *raft[i:]))
        for i in range(1, nodes + 1)
    ]


def node_command(spec: NodeSpec, *, secret_file: Path | None, python: str) -> list[str]:
    """`secret_file` None: the cluster directory's own (see `ensure_secret`)."""
    command = [python, "-m", "raftlog.node.cli", "node", "--data", str(spec.data_dir)]
    command += ["--grpc", spec.grpc_address, "--raft", spec.raft_address]
    command += ["--peer", spec.peer_address, "--node-id", spec.node_id]
    if spec.peers:
        command += ["--peers", ",".join(spec.peers)]
    command += ["--secret-file", str((secret_file or spec.secret_path).resolve())]
    return command


def ensure_secret(root: Path, secret_file: Path | None) -> Path:
    """The secret file the cluster's nodes use: `secret_file` when given (checked), else
    DIR/cluster.secret, created with a new secret (mode 0600) the first time."""
    path = secret_file or root / SECRET_FILE_NAME
    try:
        if secret_file is not None:
            read_secret_file(path)
        else:
            ensure_secret_file(path)
    except (OSError, WeakSecret) as exc:
        raise LocalClusterError(Refusal.INVALID_ARGUMENT, f"cluster secret {path}: {exc}"
                                ) from None
    return path


# ---------------------------------------------------------------------------------------------
# Pid files and what the recorded processes are doing now.


@dataclass(frozen=True)
class PidRecord:
    pid_path: Path
    pid: int
    command: tuple[str, ...]

    @property
    def node_id(self) -> str:
        return self.pid_path.stem

    @property
    def data_dir(self) -> Path:
        return self.pid_path.parent / self.node_id

    @property
    def log_path(self) -> Path:
        return self.pid_path.parent / f"{self.node_id}.log"

    @property
    def grpc_address(self) -> str:
        return _option(self.command, "--grpc")

    @property
    def raft_address(self) -> str:
        return _option(self.command, "--raft")


def _option(command: Sequence[str], name: str) -> str:
    for flag, value in itertools.pairwise(command):
        if flag == name:
            return value
    return ""


def write_pid_file(path: Path, *, pid: int, command: Sequence[str]) -> None:
    """Written to a temporary name and renamed, so a reader never sees half a file."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(f"{pid}\n{json.dumps(list(command))}\n")
    partial.replace(path)


def read_pid_file(path: Path) -> PidRecord:
    """Raises ValueError when the file is not `PID\\n["arg", ...]`."""
    lines = path.read_text().splitlines()
    if len(lines) < 2 or not lines[0].strip().isdigit():
        raise ValueError(f"{path}: not a pid file (line 1 a pid, line 2 a JSON list)")
    command = json.loads(lines[1])
    if not isinstance(command, list) or not all(isinstance(arg, str) for arg in command):
        raise ValueError(f"{path}: line 2 is not a JSON list of strings")
    return PidRecord(pid_path=path, pid=int(lines[0]), command=tuple(command))


def pid_files(data_dir: Path) -> list[Path]:
    """DIR/n{i}.pid in node order (n2 before n10)."""
    found = []
    for path in data_dir.resolve().glob("n*.pid"):
        match = _PID_FILE_RE.fullmatch(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def process_state(record: PidRecord) -> ProcessState:
    cmdline = _cmdline(record.pid)
    if cmdline is None:
        return ProcessState.EXITED
    if _names_data_dir(cmdline, record.data_dir):
        return ProcessState.RUNNING
    return ProcessState.PID_REUSED


def _cmdline(pid: int) -> list[str] | None:
    """The live process's argv, or None when it is gone (zombies included: reaped if ours)."""
    _maybe_reap(pid)
    proc = Path(f"/proc/{pid}")
    try:
        stat = (proc / "stat").read_text()
        raw = (proc / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    if stat[stat.rfind(")") + 2 :].startswith("Z"):  # comm may contain spaces and ")"
        return None
    return raw.decode(errors="replace").split("\0")[:-1]


def _names_data_dir(cmdline: Sequence[str], data_dir: Path) -> bool:
    data = _option(cmdline, "--data")
    return bool(data) and Path(data) == data_dir


def _maybe_reap(pid: int) -> None:
    """Collects the exit status when `pid` is our child, so it does not linger as a zombie.
    A `subprocess.Popen` holding that child then reports exit status 0."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


@dataclass(frozen=True)
class NodeProcessStatus:
    node_id: str
    pid: int
    state: ProcessState
    grpc_address: str
    raft_address: str
    log_path: Path

    @property
    def alive(self) -> bool:
        return self.state is ProcessState.RUNNING


def status(data_dir: Path) -> list[NodeProcessStatus]:
    """Each recorded node and whether it is running; unreadable pid files are skipped."""
    statuses = []
    for path in pid_files(data_dir):
        try:
            record = read_pid_file(path)
        except (OSError, ValueError):
            continue
        statuses.append(
            NodeProcessStatus(
                node_id=record.node_id,
                pid=record.pid,
                state=process_state(record),
                grpc_address=record.grpc_address,
                raft_address=record.raft_address,
                log_path=record.log_path,
            )
        )
    return statuses


# ---------------------------------------------------------------------------------------------
# Starting.


@dataclass
class LocalNode:
    spec: NodeSpec
    pid: int
    command: tuple[str, ...]
    # Set when this process started the node; kept so the child is not reported as leaked.
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def node_id(self) -> str:
        return self.spec.node_id

    @property
    def grpc_address(self) -> str:
        return self.spec.grpc_address

    @property
    def raft_address(self) -> str:
        return self.spec.raft_address

    @property
    def log_path(self) -> Path:
        return self.spec.log_path

    def record(self) -> PidRecord:
        return PidRecord(pid_path=self.spec.pid_path, pid=self.pid, command=self.command)

    def log_tail(self) -> str:
        return log_tail(self.spec.log_path)


def log_tail(path: Path) -> str:
    try:
        with path.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - log_tail_bytes))
            return log.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def port_in_use(port: int) -> bool:
    """True when something listens on (or holds) host:port. SO_REUSEADDR keeps a socket left
    in TIME_WAIT by a stopped node from counting as in use."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def check_can_start(specs: Iterable[NodeSpec]) -> None:
    """Raises PORT_IN_USE or ALREADY_RUNNING for the first spec that cannot start. A pid file
    whose process has ended, or whose pid now belongs to another program, is stale and is
    replaced."""
    for spec in specs:
        if spec.pid_path.exists():
            with contextlib.suppress(OSError, ValueError):
                record = read_pid_file(spec.pid_path)
                if process_state(record) is ProcessState.RUNNING:
                    raise LocalClusterError(
                        Refusal.ALREADY_RUNNING,
                        f"{spec.node_id} is already running as pid {record.pid} "
                        f"({spec.pid_path}); stop it with `raftlog cluster down --data "
                        f"{spec.root}`",
                    )
        for port in (spec.grpc_port, spec.raft_port, spec.peer_port):
            if port_in_use(port):
                raise LocalClusterError(
                    Refusal.PORT_IN_USE,
                    f"port {port} ({spec.node_id}) on {host} is in use; pick another --base-port",
                )


def start_node(spec: NodeSpec, *, secret_file: Path | None, python: str) -> LocalNode:
    """Starts one node detached (own session, stdin /dev/null, output appended to its log)
    and records it in its pid file. Does not wait for it to serve."""
    check_can_start([spec])
    spec.data_dir.mkdir(parents=True, exist_ok=True)
    secret_file = ensure_secret(spec.root, secret_file)
    command = node_command(spec, secret_file=secret_file, python=python)
    with spec.log_path.open("ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=spec.root,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
    write_pid_file(spec.pid_path, pid=process.pid, command=command)
    return LocalNode(spec=spec, pid=process.pid, command=tuple(command), process=process)


def up(
    *,
    nodes: int,
    base_port: int,
    data_dir: Path,
    secret_file: Path | None,
    python: str = sys.executable,
) -> list[LocalNode]:
    """Starts the cluster's nodes without waiting for them (see `wait_ready`). Checks every
    node before starting any; if one fails to start, the ones already started are stopped."""
    specs = plan(nodes=nodes, base_port=base_port, data_dir=data_dir)
    specs[0].root.mkdir(parents=True, exist_ok=True)
    check_can_start(specs)
    started: list[LocalNode] = []
    try:
        for spec in specs:
            started.append(start_node(spec, secret_file=secret_file, python=python))
    except BaseException:
        stop([node.record() for node in started], timeout_s=stop_timeout_s_default)
        raise
    return started


# ---------------------------------------------------------------------------------------------
# Waiting.


def _deadline_iter(timeout_s: float) -> Iterator[float]:
    """Yields the time left, at most every poll_period_s, until `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while (remaining_s := deadline - time.monotonic()) > 0:
        yield remaining_s
        time.sleep(min(poll_period_s, max(0.0, deadline - time.monotonic())))


def _check_running(node: LocalNode) -> None:
    exited = (
        node.process.poll() is not None
        if node.process is not None
        else process_state(node.record()) is not ProcessState.RUNNING
    )
    if exited:
        raise LocalClusterError(
            Refusal.START_FAILED,
            f"{node.node_id} (pid {node.pid}) exited; end of {node.log_path}:\n{node.log_tail()}",
        )


def is_serving(channel: grpc.Channel, *, timeout_s: float = probe_timeout_s) -> bool:
    # types-grpcio-health-checking declares HealthStub without its methods.
    stub: Any = health_pb2_grpc.HealthStub(channel)
    try:
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
    except grpc.RpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def wait_serving(nodes: Sequence[LocalNode], timeout_s: float) -> None:
    """Until every node's gRPC health check says SERVING; raises START_FAILED as soon as a node
    exits, NOT_READY at the deadline."""
    with _channels(nodes) as channels:
        waiting = set(range(len(nodes)))
        for remaining_s in _deadline_iter(timeout_s):
            for i in sorted(waiting):
                _check_running(nodes[i])
                if is_serving(channels[i], timeout_s=min(probe_timeout_s, remaining_s)):
                    waiting.discard(i)
            if not waiting:
                return
    names = ", ".join(nodes[i].node_id for i in sorted(waiting))
    raise LocalClusterError(Refusal.NOT_READY, f"not serving within {timeout_s:g} s: {names}")


def wait_ready(nodes: Sequence[LocalNode], timeout_s: float) -> cluster_pb2.ClusterStatus:
    """Until every node serves gRPC health and has caught up with the metadata, and one
    node's GetClusterStatus shows a Raft leader and all of `nodes` as members; returns that
    status."""
    deadline = time.monotonic() + timeout_s
    wait_serving(nodes, timeout_s)
    expected = {node.node_id for node in nodes}
    last_seen = "no answer yet"
    caught_up: set[str] = set()
    with _channels(nodes) as channels:
        for remaining_s in _deadline_iter(deadline - time.monotonic()):
            ready: cluster_pb2.ClusterStatus | None = None
            for node, channel in zip(nodes, channels, strict=True):
                _check_running(node)
                answer = _cluster_status(channel, timeout_s=min(probe_timeout_s, remaining_s))
                if isinstance(answer, str):
                    last_seen = f"{node.node_id}: {answer}"
                    continue
                if answer.caught_up:
                    caught_up.add(node.node_id)
                members = {member.node_id for member in answer.nodes}
                if answer.raft_leader and expected <= members:
                    ready = answer
                else:
                    last_seen = (f"{node.node_id} sees leader {answer.raft_leader or 'none'}, "
                                 f"members {sorted(members)}")
            if ready is not None and caught_up >= expected:
                return ready
            if ready is not None:
                last_seen = f"not caught up yet: {sorted(expected - caught_up)}"
    raise LocalClusterError(
        Refusal.NOT_READY,
        f"no Raft leader with all {len(nodes)} members within {timeout_s:g} s ({last_seen})",
    )


def _cluster_status(channel: grpc.Channel, *, timeout_s: float) -> cluster_pb2.ClusterStatus | str:
    """The node's status, or why there is none (a line of text). A node that does not serve
    the Cluster service never will: that raises NOT_READY at once."""
    try:
        return cluster_pb2_grpc.ClusterStub(channel).GetClusterStatus(
            cluster_pb2.GetClusterStatusRequest(), timeout=timeout_s
        )
    except grpc.RpcError as exc:
        if not isinstance(exc, grpc.Call):
            return str(exc)
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            raise LocalClusterError(
                Refusal.NOT_READY, f"the node does not serve the Cluster service: {exc.details()}"
            ) from None
        return f"{exc.code().name}: {exc.details()}"


@contextlib.contextmanager
def _channels(nodes: Sequence[LocalNode]) -> Iterator[list[grpc.Channel]]:
    channels = [grpc.insecure_channel(node.grpc_address) for node in nodes]
    try:
        yield channels
    finally:
        for channel in channels:
            channel.close()


# ---------------------------------------------------------------------------------------------
# Stopping.


class _Pinned:
    """A process held by a pidfd: once opened, a signal can only reach that process, never one
    that later gets the same pid. Without pidfd support it falls back to the pid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is not None:
            try:
                self.fd = pidfd_open(pid)
            except ProcessLookupError:
                raise
            except OSError:  # kernel without pidfd
                self.fd = None

    def send(self, signum: signal.Signals) -> bool:
        """False when the process is already gone."""
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, signum)
            else:
                os.kill(self.pid, signum)
        except ProcessLookupError:
            return False
        return True

    def exited(self) -> bool:
        if self.fd is not None:
            exited = bool(select.select([self.fd], [], [], 0)[0])  # readable once it exits
            if exited:
                _maybe_reap(self.pid)
            return exited
        return _cmdline(self.pid) is None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclass(frozen=True)
class StopResult:
    node_id: str
    pid: int
    outcome: StopOutcome
    pid_path: Path


def stop(
    records: Sequence[PidRecord], *, timeout_s: float, force: bool = False
) -> list[StopResult]:
    """Signals every recorded node that is still running (SIGTERM, or SIGKILL with `force`),
    waits up to `timeout_s` for all of them together, SIGKILLs the rest, and removes the pid
    file of every node that is no longer running."""
    outcomes: dict[int, StopOutcome] = {}
    pinned: dict[int, _Pinned] = {}
    try:
        for i, record in enumerate(records):
            held = _pin_if_ours(record)
            if isinstance(held, StopOutcome):
                outcomes[i] = held
            elif held.send(signal.SIGKILL if force else signal.SIGTERM):
                pinned[i] = held
            else:
                held.close()
                outcomes[i] = StopOutcome.NOT_RUNNING
        first = StopOutcome.KILLED if force else StopOutcome.STOPPED
        outcomes |= _await_exit(pinned, timeout_s=timeout_s, outcome=first)
        for i in [i for i in pinned if i not in outcomes]:
            pinned[i].send(signal.SIGKILL)
        outcomes |= _await_exit(
            {i: p for i, p in pinned.items() if i not in outcomes},
            timeout_s=kill_wait_s,
            outcome=StopOutcome.KILLED,
        )
    finally:
        for held in pinned.values():
            held.close()
    results = []
    for i, record in enumerate(records):
        outcome = outcomes.get(i, StopOutcome.SURVIVED)
        if outcome not in (StopOutcome.SURVIVED, StopOutcome.UNREADABLE):
            record.pid_path.unlink(missing_ok=True)
        results.append(StopResult(record.node_id, record.pid, outcome, record.pid_path))
    return results


def _pin_if_ours(record: PidRecord) -> _Pinned | StopOutcome:
    """Pins the pid first, then checks its command line: if the check passes, the pidfd is
    known to refer to this node."""
    try:
        held = _Pinned(record.pid)
    except ProcessLookupError:
        return StopOutcome.NOT_RUNNING
    state = process_state(record)
    if state is ProcessState.RUNNING:
        return held
    held.close()
    return StopOutcome.NOT_RUNNING if state is ProcessState.EXITED else StopOutcome.REFUSED


def _await_exit(
    pinned: dict[int, _Pinned], *, timeout_s: float, outcome: StopOutcome
) -> dict[int, StopOutcome]:
    done: dict[int, StopOutcome] = {}
    if not pinned:
        return done
    for _ in _deadline_iter(timeout_s):
        done |= {i: outcome for i, held in pinned.items() if i not in done and held.exited()}
        if len(done) == len(pinned):
            break
    return done


def down(data_dir: Path, timeout_s: float = stop_timeout_s_default) -> list[StopResult]:
    """Stops every node recorded under `data_dir` (see `stop`). An unreadable pid file is
    reported and left in place."""
    records: list[PidRecord] = []
    unreadable: list[StopResult] = []
    for path in pid_files(data_dir):
        try:
            records.append(read_pid_file(path))
        except (OSError, ValueError):
            unreadable.append(StopResult(path.stem, 0, StopOutcome.UNREADABLE, path))
    return stop(records, timeout_s=timeout_s) + unreadable
