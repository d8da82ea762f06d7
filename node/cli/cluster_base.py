"""What the `raftlog cluster` command modules share: the Cluster service's stub, and the
subcommands that work on local processes (`cluster up|secret|down`, and `status` with --data),
which report a `LocalClusterError` as `error: REASON: message` with exit status 1.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raftlog.node.cli import format as fmt
from raftlog.node.cli import localcluster
from raftlog.node.cli.base import EXIT_ERROR, warn
from raftlog.node.cli.client import Client
from raftlog.v1 import cluster_pb2_grpc

LocalHandler = Callable[[argparse.Namespace], int]


def stub(client: Client) -> cluster_pb2_grpc.ClusterAsyncStub:
    return cluster_pb2_grpc.ClusterStub(client.channel)


def add_data(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--data",
        type=Path,
        required=required,
        metavar="DIR",
        help="the local cluster's directory (DIR/n1, DIR/n1.log, DIR/n1.pid, ...)",
    )


def local_leaf(
    commands: Any, name: str, handler: LocalHandler, help_text: str
) -> argparse.ArgumentParser:
    """A subcommand that works on local processes: only --json, no node connection."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON document"
    )
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=help_text, description=help_text, parents=[options]
    )
    parser.set_defaults(run=guarded(handler))
    return parser


def guarded(handler: LocalHandler) -> LocalHandler:
    def run(args: argparse.Namespace) -> int:
        args.json = getattr(args, "json", False)
        try:
            return handler(args)
        except localcluster.LocalClusterError as exc:
            warn(fmt.error_text(exc.reason.name, exc.message, {}))
            return EXIT_ERROR

    return run
