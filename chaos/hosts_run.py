"""Hosts mode's two processes (`raftlog chaos run --hosts`).

Outside (`run_outside`, in the root namespace): makes the run's namespaces (hosts.HostNet,
after deleting those of crashed earlier runs), runs the harness again inside the client
namespace as `ip netns exec <client_ns> <python> -m raftlog.chaos run --hosts ...` with
`RAFTLOG_CHAOS_HOSTS_RUN=<run id>` in its environment, waits for it (bounded), then stops any
node it left behind (pid-checked, from the pid files) and deletes the namespaces, whatever
happened. Inside (`attached_net`): run.py finds the run's HostNet by that id and runs the usual
chaos run, its nodes started in their own namespaces and its workload here.

Why a second process: the workload's gRPC C-core runs threads of its own, and `setns` moves
only the calling thread, so switching namespaces inside a process that has used gRPC would
leave its connections half in one namespace and half in another. A process started by
`ip netns exec` is in the client namespace from its first instruction.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from raftlog.chaos import final_audit
from raftlog.chaos.hosts import CLIENT, HostNet, cleanup_stale, current_namespace
from raftlog.node.cli import localcluster

if TYPE_CHECKING:
    from raftlog.chaos.run import RunConfig

HOSTS_RUN_ENV = "RAFTLOG_CHAOS_HOSTS_RUN"  # set inside: the run id of the run's namespaces
inside_overhead_s = 600.0  # beyond --duration: nodes starting, heal, drain, convergence, checks
interrupt_wait_s = 30.0  # after Ctrl-C (which the inside run gets too), its time to clean up


def inside() -> bool:
    """Whether this process is the inside run of hosts mode."""
    return bool(os.environ.get(HOSTS_RUN_ENV))


def net_size(config: RunConfig) -> int:
    """One namespace per planned node: the members and the spares."""
    return config.nodes + config.spares


def attached_net(config: RunConfig) -> HostNet:
    """Inside: the run's HostNet (made outside). Raises unless this process really is in the
    run's client namespace."""
    run_id = os.environ.get(HOSTS_RUN_ENV)
    if not run_id:
        raise RuntimeError("hosts mode runs through `raftlog chaos run --hosts`, which makes "
                           f"the namespaces and sets {HOSTS_RUN_ENV}")
    net = HostNet(net_size(config), run_id=run_id)
    here = current_namespace()
    if here != net.client_ns:
        raise RuntimeError(f"hosts mode: this process is in network namespace "
                           f"{here or '(root)'}, not the run's {net.client_ns}")
    return net


def inside_argv(config: RunConfig, *, json_out: bool) -> list[str]:
    """`raftlog chaos run` arguments that repeat `config` (its seed and directory included)."""
    argv = ["run", "--hosts", "--nodes", str(config.nodes), "--duration", repr(config.duration_s),
            "--nemesis", ",".join(config.nemeses) or "none", "--rate", repr(config.rate_per_s),
            "--seed", str(config.seed), "--dir", str(config.workdir)]
    argv += [] if config.audit else ["--no-audit"]
    return [*argv, "--json"] if json_out else argv


def run_outside(config: RunConfig, *, json_out: bool, progress: Callable[[str], None]) -> int:
    """The whole hosts-mode run; returns the inside run's exit status (its output goes to
    ours). Raises TimeoutError when it takes over `--duration` + inside_overhead_s, plus the
    audit's bound (final_audit.audit_timeout_s) unless it is skipped (it is killed)."""
    for name in cleanup_stale():
        progress(f"deleted network namespace {name}, left by a run that crashed")
    config.workdir.mkdir(parents=True, exist_ok=True)
    with HostNet(net_size(config)).create() as net:
        nodes = ", ".join(f"n{i} {net.address(i)}" for i in range(1, net.nodes + 1))
        progress(f"hosts mode: namespaces {net.prefix}*, client {net.address(CLIENT)}, {nodes}")
        try:
            return _run_inside(net, config, json_out=json_out, progress=progress)
        finally:
            localcluster.down(config.workdir / "cluster")


def _run_inside(net: HostNet, config: RunConfig, *, json_out: bool,
                progress: Callable[[str], None]) -> int:
    command = [*net.exec_prefix(CLIENT), sys.executable, "-m", "raftlog.chaos",
               *inside_argv(config, json_out=json_out)]
    timeout_s = (config.duration_s + inside_overhead_s
                 + (final_audit.audit_timeout_s if config.audit else 0.0))
    # `ip netns exec` execs the python: the child's pid is the inside run's.
    child = subprocess.Popen(command, env={**os.environ, HOSTS_RUN_ENV: net.run_id},
                             stdin=subprocess.DEVNULL)
    try:
        status = child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        progress(f"the run inside {net.client_ns} took over {timeout_s:g} s: killing it")
        child.kill()
        child.wait(timeout=interrupt_wait_s)
        raise TimeoutError(f"hosts-mode run took over {timeout_s:g} s") from None
    except KeyboardInterrupt:
        try:
            child.wait(timeout=interrupt_wait_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=interrupt_wait_s)
        raise
    if status < 0:
        progress(f"the run inside {net.client_ns} was ended by signal {-status}")
    return status
