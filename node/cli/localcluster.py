"""A local cluster: N `raftlog node` processes on loopback, started, awaited, stopped and
reported from one directory. Used by `raftlog cluster up|down|status`, chaos/cluster.py and
scripts/bench.py, which import everything from here.

This module owns the cluster's lifecycle: `up` (check every node, then start them all),
`status` (what the pid files record and whether each node still runs) and `down`. The rest is
split by concern, and re-exported:

- `localcluster_layout`  the directory layout, ports and node command lines (`plan`), the
                         cluster secret, and `LocalClusterError` with its `Refusal` reasons.
- `localcluster_procs`   one node process: pid files, `/proc` checks, pidfd-pinned `stop`.
- `localcluster_wait`    waiting until the nodes serve (`wait_serving`) and the cluster has a
                         leader and every member (`wait_ready`).

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
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from raftlog.node.cli import certs
from raftlog.node.cli.localcluster_layout import (
    LocalClusterError,
    NodeSpec,
    Refusal,
    ensure_secret,
    host,
    node_command,
    nodes_max,
    plan,
    ports_per_node,
)
from raftlog.node.cli.localcluster_procs import (
    LocalNode,
    PidRecord,
    ProcessState,
    StopOutcome,
    StopResult,
    kill_wait_s,
    log_tail,
    log_tail_bytes,
    pid_files,
    poll_period_s,
    process_state,
    read_pid_file,
    stop,
    write_pid_file,
)
from raftlog.node.cli.localcluster_procs import _cmdline as _cmdline  # for the process tests
from raftlog.node.cli.localcluster_wait import (
    channel_to,
    is_serving,
    probe_timeout_s,
    ready_timeout_s_default,
    wait_ready,
    wait_serving,
)

__all__ = [
    "LocalClusterError",
    "LocalNode",
    "NodeProcessStatus",
    "NodeSpec",
    "PidRecord",
    "ProcessState",
    "Refusal",
    "StopOutcome",
    "StopResult",
    "channel_to",
    "check_can_start",
    "down",
    "ensure_secret",
    "host",
    "is_serving",
    "kill_wait_s",
    "log_tail",
    "log_tail_bytes",
    "node_command",
    "nodes_max",
    "pid_files",
    "plan",
    "poll_period_s",
    "port_in_use",
    "ports_per_node",
    "probe_timeout_s",
    "process_state",
    "read_pid_file",
    "ready_timeout_s_default",
    "start_node",
    "start_specs",
    "status",
    "stop",
    "stop_timeout_s_default",
    "up",
    "wait_ready",
    "wait_serving",
    "write_pid_file",
]

stop_timeout_s_default = 15.0  # SIGTERM -> SIGKILL; the node drains for up to 5 s


# ---------------------------------------------------------------------------------------------
# What the pid files record.


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
        if spec.host != host:
            continue  # its own address in its own network namespace: nothing else binds there
        for port in (spec.grpc_port, spec.raft_port, spec.peer_port):
            if port_in_use(port):
                raise LocalClusterError(
                    Refusal.PORT_IN_USE,
                    f"port {port} ({spec.node_id}) on {host} is in use; pick another --base-port",
                )


def start_node(spec: NodeSpec, *, secret_file: Path | None, python: str,
               extra_args: Sequence[str] = (), prefix: Sequence[str] = (),
               tls: bool = False) -> LocalNode:
    """Starts one node detached (own session, stdin /dev/null, output appended to its log)
    and records it in its pid file. Does not wait for it to serve. `extra_args` go after the
    node's own flags (e.g. the chaos harness's `--dial`s); `prefix` before its python (e.g.
    `ip netns exec NS`, see `node_command`). `tls`: with its certificate under DIR/tls, issued
    by the cluster's CA when it has none yet."""
    check_can_start([spec])
    spec.data_dir.mkdir(parents=True, exist_ok=True)
    secret_file = ensure_secret(spec.root, secret_file)
    if tls:
        certs.ensure_issued(spec.root, [spec.node_id, certs.CLIENT_NAME])
    command = [*node_command(spec, secret_file=secret_file, python=python, prefix=prefix,
                             tls=tls), *extra_args]
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
    extra_args: Callable[[NodeSpec], Sequence[str]] | None = None,
    tls: bool = False,
) -> list[LocalNode]:
    """Starts the cluster's nodes without waiting for them (see `wait_ready`). Checks every
    node before starting any; if one fails to start, the ones already started are stopped.
    `tls`: a CA under DIR/tls (kept when there is one) and new certificates for every node."""
    specs = plan(nodes=nodes, base_port=base_port, data_dir=data_dir)
    return start_specs(specs, secret_file=secret_file, python=python, extra_args=extra_args,
                       tls=tls)


def start_specs(
    specs: Sequence[NodeSpec],
    *,
    secret_file: Path | None,
    python: str = sys.executable,
    extra_args: Callable[[NodeSpec], Sequence[str]] | None = None,
    prefix: Callable[[NodeSpec], Sequence[str]] | None = None,
    tls: bool = False,
) -> list[LocalNode]:
    """`up` for nodes already planned (e.g. some of a plan's nodes, the others kept aside to
    join later). `prefix(spec)` goes before that node's python (see `node_command`)."""
    specs[0].root.mkdir(parents=True, exist_ok=True)
    check_can_start(specs)
    if tls:
        certs.write_cluster_tls(specs[0].root, [spec.node_id for spec in specs])
    started: list[LocalNode] = []
    try:
        for spec in specs:
            started.append(start_node(spec, secret_file=secret_file, python=python,
                                      extra_args=extra_args(spec) if extra_args else (),
                                      prefix=prefix(spec) if prefix else (), tls=tls))
    except BaseException:
        stop([node.record() for node in started], timeout_s=stop_timeout_s_default)
        raise
    return started


# ---------------------------------------------------------------------------------------------
# Stopping.


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
