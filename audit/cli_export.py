"""`raftlog audit export --out DIR`: every member of a running cluster (online), or one stopped
node's data directory (offline), to DIR/<node_id>/ in the layout of schema.py.

    raftlog audit export --out EXPORT --cluster 127.0.0.1:7400[,...] [--secret-file FILE]
    raftlog audit export --out EXPORT --data-dir DATA/n2 --node-id n2

Online, every member GetClusterStatus lists exports itself (Cluster.ExportAudit, an admin call:
the cluster secret is needed); a member that fails is reported on stderr, the others are still
exported, and the exit status is 1. Offline, a data directory whose RocksDB a running node holds
is refused (export that node online). An existing DIR/<node_id> is refused unless --force.
Progress goes to stderr; stdout gets one line per exported node (`--json`: one JSON document).

Exit status: 0 every node exported; 1 a node was not; 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from raftlog.audit import schema
from raftlog.audit.export import SOURCE_OFFLINE, ExportExists, export_node
from raftlog.audit.export_client import FetchError, cluster_members, fetch_node
from raftlog.audit.export_source import SourceError
from raftlog.base.clock import SystemClock
from raftlog.base.errors import RaftlogError
from raftlog.node.cli.base import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    address_list,
    credential_from,
    env_path,
    typed,
)
from raftlog.node.cli.client import SECRET_FILE_ENV, describe_failure

offline_progress_period_s = 1.0  # offline progress lines, at most this often


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "export", help="export every replica (Parquet) for `raftlog audit run`",
        description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="the export directory; each node goes to DIR/<node_id>/")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--cluster", type=typed(address_list), metavar="ADDR[,ADDR...]",
                       help="a running cluster: client addresses of one or more members")
    where.add_argument("--data-dir", type=Path, metavar="PATH",
                       help="a stopped node's data directory (offline)")
    parser.add_argument("--node-id", help="with --data-dir: the node's id")
    parser.add_argument("--secret-file", dest="admin_secret_file", type=Path, metavar="FILE",
                        default=env_path(SECRET_FILE_ENV),
                        help="the cluster secret, for --cluster (default: $RAFTLOG_SECRET_FILE)")
    parser.add_argument("--force", action="store_true",
                        help="replace a node's export already in DIR")
    parser.add_argument("--skip-messages", action="store_true",
                        help="leave the messages table empty (streams, consumers, metadata only)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.cluster is not None:
            if args.node_id:
                raise UsageError("--node-id goes with --data-dir")
            exported, failed = _online(args)
        else:
            if not args.node_id:
                raise UsageError("--data-dir needs --node-id")
            exported, failed = _offline(args)
    except UsageError as err:
        _warn(f"error: {err}")
        return EXIT_USAGE
    _report(args, exported, failed)
    return EXIT_ERROR if failed or not exported else EXIT_OK


def _online(args: argparse.Namespace) -> tuple[list[schema.Manifest], dict[str, str]]:
    credential = credential_from(args)
    try:
        members = cluster_members(args.cluster)
    except grpc.RpcError as err:
        return [], {"cluster": describe_failure(err, address=",".join(args.cluster))}
    existing = [m.node_id for m in members if (args.out / m.node_id).exists()]
    if existing and not args.force:
        return [], {node: f"error: {args.out / node} already holds an export (--force replaces "
                    "it)" for node in existing}
    exported: list[schema.Manifest] = []
    failed: dict[str, str] = {}
    for member in members:
        _warn(f"{member.node_id}: exporting from {member.address}")
        started = time.monotonic()
        try:
            manifest = fetch_node(member, args.out, credential=credential,
                                  skip_messages=args.skip_messages, replace=args.force,
                                  progress=_progress_of(member.node_id))
        except grpc.RpcError as err:
            failed[member.node_id] = describe_failure(err, address=member.address)
        except (FetchError, ExportExists, OSError) as err:
            failed[member.node_id] = f"error: {err}"
        else:
            exported.append(manifest)
            _done(manifest, elapsed_s=time.monotonic() - started)
    return exported, failed


def _offline(args: argparse.Namespace) -> tuple[list[schema.Manifest], dict[str, str]]:
    node_id: str = args.node_id
    started = time.monotonic()
    try:
        manifest = export_node(args.data_dir, args.out, node_id=node_id, source=SOURCE_OFFLINE,
                               clock=SystemClock(), skip_messages=args.skip_messages,
                               replace=args.force, progress=_table_progress(node_id))
    except RaftlogError as err:
        return [], {node_id: f"error: {err.reason.name}: {err.message}"}
    except (SourceError, ExportExists, OSError) as err:
        return [], {node_id: f"error: {err}"}
    _done(manifest, elapsed_s=time.monotonic() - started)
    return [manifest], {}


def _progress_of(node_id: str) -> Callable[[str], None]:
    return lambda text: _warn(f"{node_id}: {text}")


def _table_progress(node_id: str) -> Callable[[str, int], None]:
    reported = [0.0]

    def progress(table: str, rows: int) -> None:
        now = time.monotonic()
        if table != schema.MESSAGES_FILE or now - reported[0] >= offline_progress_period_s:
            reported[0] = now
            _warn(f"{node_id}: {table} {rows:,} rows")

    return progress


def _done(manifest: schema.Manifest, *, elapsed_s: float) -> None:
    messages = manifest.rows.get(schema.MESSAGES_FILE, 0)
    _warn(f"{manifest.node}: exported {messages:,} messages ({manifest.source}) in "
          f"{elapsed_s:.1f} s")


def _report(args: argparse.Namespace, exported: list[schema.Manifest],
            failed: dict[str, str]) -> None:
    if args.json:
        print(json.dumps({"out": str(args.out),
                          "exported": {m.node: m.rows for m in exported},
                          "failed": failed}, sort_keys=True))
    else:
        for manifest in exported:
            print(f"{args.out / manifest.node}: {manifest.source} export, applied index "
                  f"{manifest.applied_index}, rows {manifest.rows}")
    for node, why in failed.items():
        _warn(f"{node}: not exported: {why.removeprefix('error: ')}")


def _warn(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
