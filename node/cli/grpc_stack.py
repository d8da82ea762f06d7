"""Which of gRPC core's I/O stacks a node process runs on, chosen before grpc is imported.

grpcio 1.85 (pinned) serves accepted connections and drives client channels on its EventEngine
by default. On these machines its older iomgr stack costs less a call: a bare grpc.aio health
check took 390-410 µs of the server's CPU (p50 0.63-0.66 ms) on the EventEngine and
300-325 µs (p50 0.53-0.55 ms) on iomgr, and a node's own health check 440 against 345 µs
(docs/benchmarks.md, "Thirteenth pass"). gRPC core reads its experiments once, when grpc is
first imported, from the GRPC_EXPERIMENTS environment variable, so a node process that has not
chosen yet re-executes itself (same pid) with the choice in its environment. A GRPC_EXPERIMENTS
the operator set (even empty) is kept as it is.

Only `raftlog node` chooses: client commands, the benchmarks' clients and the tests run on
grpcio's defaults. This module must not import grpc.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

EXPERIMENTS_VARIABLE = "GRPC_EXPERIMENTS"
NODE_EXPERIMENTS = "-event_engine_listener,-event_engine_client"  # iomgr, both directions
NODE_COMMAND = "node"


def node_environment(environ: Mapping[str, str]) -> dict[str, str] | None:
    """The environment a node process should run in, or None when `environ` already chooses
    gRPC's experiments (ours, or the operator's)."""
    if EXPERIMENTS_VARIABLE in environ:
        return None
    return {**environ, EXPERIMENTS_VARIABLE: NODE_EXPERIMENTS}


def reexec_node(argv: Sequence[str]) -> None:
    """For `raftlog node ...` (`argv` without the program name): unless the environment already
    chooses, replaces this process (same pid, same open files) with `python -m raftlog.node.cli`
    and `argv` in the node's environment. Returns only when nothing had to change."""
    environ = node_environment(os.environ)
    if environ is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "raftlog.node.cli", *argv], environ)
