"""`raftlog audit cluster up|down`: a local Spark standalone cluster for `audit run --master`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from raftlog.audit import standalone

DEFAULT_DIR = ".spark-cluster"


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "cluster", help="start or stop a local Spark standalone master and workers "
        "(from the installed pyspark, loopback only)")
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--dir", default=DEFAULT_DIR, type=Path,
                        help=f"where the pids, settings and logs live (default {DEFAULT_DIR})")
    parser.add_argument("--workers", type=int, default=1, help="workers to start (default 1)")
    parser.add_argument("--cores", type=int, default=2, help="cores per worker (default 2)")
    parser.add_argument("--port", type=int, default=None,
                        help="the master's port (default: a free one)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "up":
            if args.workers < 1 or args.cores < 1:
                print("raftlog audit cluster: --workers and --cores must be at least 1",
                      file=sys.stderr)
                return 2
            state = standalone.up(args.dir, workers=args.workers, port=args.port,
                                  cores=args.cores)
            print(f"{len(state.pids) - 1} workers registered; web UI {state.web_url}",
                  file=sys.stderr)
            print(state.master_url)
        else:
            for line in standalone.down(args.dir):
                print(line, file=sys.stderr)
    except standalone.ClusterError as error:
        print(f"raftlog audit cluster: {error}", file=sys.stderr)
        return 1
    return 0
