"""`raftlog audit repair --plan FILE --cluster ADDR --secret-file FILE [--apply]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import grpc

from raftlog.audit.export_client import cluster_members
from raftlog.audit.peers import PeerError, PeerNode, describe
from raftlog.audit.repair import Outcome, PlanError, apply_plan, load_plan
from raftlog.node.cli.base import UsageError, credential_from, env_path
from raftlog.node.cli.client import SECRET_FILE_ENV

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


def register(commands: Any) -> None:
    repair = commands.add_parser(
        "repair", help="apply a repair plan through the peer API (dry run unless --apply)",
        description="Apply the repair plan `raftlog audit run` wrote. Without --apply every "
        "step is shown (a record step with the copy's current state) and nothing changes. A "
        "step on a copy or a consumer that moved since the export, or on the copy a serving "
        "primary holds, is refused and the others go on; audit again afterwards.")
    repair.add_argument("--plan", type=Path, required=True, metavar="FILE")
    repair.add_argument("--cluster", required=True, metavar="ADDR[,ADDR...]",
                        help="client address(es) of any member")
    repair.add_argument("--secret-file", dest="admin_secret_file", type=Path, metavar="FILE",
                        default=env_path(SECRET_FILE_ENV),
                        help="the cluster secret (default: $RAFTLOG_SECRET_FILE)")
    repair.add_argument("--apply", action="store_true", help="change the copies")
    repair.add_argument("--json", action="store_true",
                        help="one JSON document on stdout: each step with its outcome")
    repair.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        actions = load_plan(args.plan)
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        credential = credential_from(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if credential is None:
        print("error: --secret-file (or $RAFTLOG_SECRET_FILE) is needed: the peer API takes "
              "only callers holding the cluster secret", file=sys.stderr)
        return EXIT_USAGE
    try:
        members = cluster_members([a.strip() for a in args.cluster.split(",") if a.strip()])
    except grpc.RpcError as exc:
        print(f"error: no node answered GetClusterStatus: {describe(exc)}", file=sys.stderr)
        return EXIT_REFUSED
    nodes: dict[str, PeerNode] = {}
    for member in members:
        try:
            nodes[member.node_id] = PeerNode(member, credential)
        except PeerError as exc:
            print(f"warning: {exc}", file=sys.stderr)
    mode = "applying" if args.apply else "dry run (nothing changes; --apply to act)"
    print(f"{len(actions)} steps, {mode}", file=sys.stderr)
    try:
        outcomes = apply_plan(actions, nodes, dry_run=not args.apply,
                              report=(lambda _: None) if args.json else _print)
    finally:
        for node in nodes.values():
            node.close()
    if args.json:
        print(json.dumps({"applied": bool(args.apply), "steps": [
            {"node": o.action.node, "stream": o.action.stream, "action": o.action.action,
             "status": o.status, "detail": o.detail, "why": o.action.why,
             "touches_committed": o.action.touches_committed} for o in outcomes]}, indent=2))
    refused = [outcome for outcome in outcomes if outcome.status == "refused"]
    return EXIT_REFUSED if refused else EXIT_OK


def _print(outcome: Outcome) -> None:
    committed = " [touches committed records: " + outcome.action.why + "]" \
        if outcome.action.touches_committed else ""
    print(f"{outcome.status:>8}  {outcome.action.describe()}{committed}\n"
          f"          {outcome.detail}", flush=True)
