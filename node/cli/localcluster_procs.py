"""The node processes of a local cluster, one at a time: their pid files, whether a recorded
pid is still that node (`/proc/PID/cmdline`), and stopping them safely.

Safety rules:
- A pid is signalled only after `/proc/PID/cmdline` shows `--data` with that node's data
  directory, and then through a pidfd opened *before* the check, so a pid the kernel recycled
  to another process in the meantime is never signalled.
- Every wait has a bound; SIGTERM becomes SIGKILL when it runs out.
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
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from raftlog.node.cli.localcluster_layout import NodeSpec

kill_wait_s = 5.0  # after SIGKILL
poll_period_s = 0.05
log_tail_bytes = 4000

_PID_FILE_RE = re.compile(r"n(\d+)\.pid")


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

    @property
    def metrics_address(self) -> str:
        """Where it serves Prometheus metrics ("" when started without --metrics)."""
        return _option(self.command, "--metrics")


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


# ---------------------------------------------------------------------------------------------
# A node this process started.


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


# ---------------------------------------------------------------------------------------------
# Stopping.


def deadline_iter(timeout_s: float) -> Iterator[float]:
    """Yields the time left, at most every poll_period_s, until `timeout_s` has passed. Every
    wait of a local cluster polls with it (`localcluster_wait` too)."""
    deadline = time.monotonic() + timeout_s
    while (remaining_s := deadline - time.monotonic()) > 0:
        yield remaining_s
        time.sleep(min(poll_period_s, max(0.0, deadline - time.monotonic())))


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
    for _ in deadline_iter(timeout_s):
        done |= {i: outcome for i, held in pinned.items() if i not in done and held.exited()}
        if len(done) == len(pinned):
            break
    return done

