"""The `raftlog` command: run a node or a local cluster, and manage streams, consumers, messages
and placement.

    raftlog node --data DIR --grpc 127.0.0.1:7400          run a node (SIGTERM drains)
    raftlog stream create|info|ls|update|rm|purge|get|last|subjects|scan ...
    raftlog stream create NAME --source SPEC | stream sources  copy from other streams, the tails
    raftlog pub STREAM SUBJECT [PAYLOAD...]                 publish (args, stdin lines, or load)
    raftlog pub ... --delay 30s | stream scheduled|unschedule  delayed messages, listed, cancelled
    raftlog consumer create|info|ls|rm ...
    raftlog fetch|sub STREAM CONSUMER                       read messages and ack them
    raftlog hash|set|queue create|rm|info|ls ...            collections over streams
    raftlog hash set|get|del|getall|fields|len NAME KEY ... (set: add|remove|ismember|members;
                                                            queue: push|pop|peek|len)
    raftlog kv add|info|ls|rm|put|get|create|update|del|purge|touch|keys|history|watch ...
    raftlog obj add|buckets|rm-bucket|put|get|info|ls|rm|revisions ...  object buckets
    raftlog topic create|ls|info|rm|publish|group-add|offsets|seek ...  partitioned topics
    raftlog txn prepare|commit|rollback|ls ...              two-phase publishes
    raftlog health                                          is the node serving?
    raftlog cluster up|down|status|join|leave               a local or real cluster
    raftlog cluster overrides|stats|watch|rebalance|clear-authority
    raftlog stream route NAME                               why a stream lives where it does
    raftlog stream migrate NAME NODE [--pin] | pin | unpin  move a stream's primary
    raftlog numaflow-source --stream S --consumer C --socket PATH   a Numaflow source
    raftlog top --dir DIR | --metrics HOST:PORT,...         live per-node and per-stream view

Every command that talks to a node takes `--server HOST:PORT` (default: $RAFTLOG_SERVER or
127.0.0.1:7400), `--timeout` and `--json` (one JSON document on stdout, proto field names).
Exit status: 0 done, 1 the node refused or failed the request (`error: REASON: message` on
stderr), 2 bad usage, 130 interrupted. Shared option handling lives in `base`, the commands in
`streams`, `publish`, `consumers` and `cluster` (and the modules it names), parsing and rendering
in `format`.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

from raftlog.base import limits
from raftlog.node.cli import format as fmt
from raftlog.node.cli import grpc_stack
from raftlog.node.cli.auth import add_auth_commands
from raftlog.node.cli.base import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    UsageError,
    address,
    address_list,
    common_options,
    seconds,
    typed,
    warn,
)
from raftlog.node.cli.cluster import register as add_cluster_commands
from raftlog.node.cli.collections import add_collection_commands
from raftlog.node.cli.consumers import add_consumer_commands
from raftlog.node.cli.kv import add_kv_commands
from raftlog.node.cli.numaflow import add_numaflow_command
from raftlog.node.cli.objects import add_object_commands
from raftlog.node.cli.streams import add_stream_commands
from raftlog.node.cli.top import add_top_command
from raftlog.node.cli.topics import add_topic_commands
from raftlog.node.cli.transactions import add_txn_commands
from raftlog.node.config import NodeConfig, default_peer_address
from raftlog.node.transport.credentials import WeakSecret, read_secret_file

CHAOS_COMMAND = "chaos"
AUDIT_COMMAND = "audit"
# Commands that are packages above the node's, run as `python -m raftlog.<package>`.
_HANDED_OVER = {CHAOS_COMMAND: "raftlog.chaos", AUDIT_COMMAND: "raftlog.audit"}


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] and args_in[0] in _HANDED_OVER:
        return _hand_over(_HANDED_OVER[args_in[0]], args_in[1:])
    parser = build_parser()
    try:
        args = _parse(parser, argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.run is _run_node:  # the `raftlog` script loaded grpc already: a node re-executes
        grpc_stack.reexec_node(args_in)
    try:
        return int(args.run(args))
    except UsageError as exc:
        warn(f"error: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        warn("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `raftlog stream ls | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR


# ---------------------------------------------------------------------------------------------
# Parser.


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """argparse fills a `nargs="*"` positional only before the first option, so in
    `raftlog pub S SUBJ -H k=v PAYLOAD` the payload is left over: give it to `pub`."""
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    before, dashes, after = _split_at_dashes(extra)
    if getattr(args, "command", None) == "pub" and not any(a.startswith("-") for a in before):
        args.payloads = [*args.payloads, *before, *after]  # after `--` anything is a payload
        return args
    parser.error(f"unrecognized arguments: {' '.join(before + dashes + after)}")


def _split_at_dashes(args: list[str]) -> tuple[list[str], list[str], list[str]]:
    if "--" not in args:
        return args, [], []
    at = args.index("--")
    return args[:at], ["--"], args[at + 1 :]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftlog",
        description="raftlog: a Raft-replicated log of messages served over gRPC.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common_options(per_command=False)],
        # No prefixes of the options above: `cluster up --tls` would be an ambiguous prefix
        # of --tls-ca/--tls-cert/--tls-key here, before the command's own parser sees it.
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"raftlog {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_node(commands)
    add_stream_commands(commands)
    add_cluster_commands(commands)
    add_consumer_commands(commands)
    add_collection_commands(commands)
    add_kv_commands(commands)
    add_object_commands(commands)
    add_topic_commands(commands)
    add_txn_commands(commands)
    add_auth_commands(commands)
    add_numaflow_command(commands)
    add_top_command(commands)
    commands.add_parser(CHAOS_COMMAND, add_help=False,
                        help="break a local cluster on purpose and check nothing acknowledged "
                        "is lost (`raftlog chaos --help`)")
    commands.add_parser(AUDIT_COMMAND, add_help=False,
                        help="export every replica, prove with Spark that they agree, repair "
                        "where they do not (`raftlog audit --help`)")
    return parser


def _hand_over(module: str, argv: list[str]) -> NoReturn:
    """`raftlog chaos ...` and `raftlog audit ...` are packages above the node's (the chaos
    harness, the Spark audit): handed over to `python -m MODULE` in this process's place."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *argv])


_EXAMPLES = """\
examples:
  raftlog node --data ./data --grpc 127.0.0.1:7400
  raftlog stream create orders --subjects 'orders.>' --max-age 7d
  raftlog pub orders orders.eu.created '{"id": 1}' '{"id": 2}'
  seq 100 | raftlog pub orders orders.eu.created
  raftlog consumer create orders billing --filter 'orders.eu.>'
  raftlog fetch orders billing --batch 10
  raftlog stream ls --json
"""


def _add_node(commands: Any) -> None:
    node = commands.add_parser(
        "node",
        help="run a node",
        description="Run a raftlog node "
        "in the foreground. SIGTERM or Ctrl-C drains it and exits 0.",
    )
    node.add_argument("--data", required=True, metavar="DIR", type=Path, help="data directory")
    node.add_argument(
        "--grpc",
        default="127.0.0.1:7400",
        metavar="HOST:PORT",
        type=typed(address),
        help="gRPC listen address (default 127.0.0.1:7400)",
    )
    node.add_argument(
        "--node-id", default="", metavar="ID", help="stable node name (default: the gRPC address)"
    )
    node.add_argument(
        "--raft",
        default=None,
        metavar="HOST:PORT",
        type=typed(address),
        help="Raft listen address; omit for a single node without Raft",
    )
    node.add_argument(
        "--peers",
        default=(),
        metavar="A,B",
        type=typed(address_list),
        help="Raft addresses of the other members, comma-separated",
    )
    replace_dead_after = os.environ.get("RAFTLOG_REPLACE_DEAD_AFTER")
    node.add_argument(
        "--replace-dead-after",
        default=seconds(replace_dead_after) if replace_dead_after else None,
        metavar="DURATION",
        type=typed(seconds),
        help="re-create a replica held by a member silent this long elsewhere (default "
        f"{fmt.human_duration_ms(int(limits.replace_dead_after_s_default * 1000))}, "
        "or $RAFTLOG_REPLACE_DEAD_AFTER)",
    )
    node.add_argument(
        "--peer",
        default=None,
        metavar="HOST:PORT",
        type=typed(address),
        help="peer listener for node-to-node calls (default: the Raft host, Raft port + 1)",
    )
    node.add_argument(
        "--dial",
        action="append",
        default=[],
        metavar="ADDR=VIA",
        type=typed(dial_pair),
        help="connect to VIA whenever connecting to a member at ADDR (its Raft, peer or "
        "client address); repeatable. For proxies on every link (raftlog chaos)",
    )
    node.add_argument(
        "--secret-file",
        type=Path,
        default=Path(os.environ["RAFTLOG_SECRET_FILE"]) if os.environ.get(
            "RAFTLOG_SECRET_FILE") else None,
        metavar="FILE",
        help="file holding the cluster secret, required with --raft "
        "(default $RAFTLOG_SECRET_FILE; `raftlog cluster secret > FILE` makes one)",
    )
    node.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="default INFO",
    )
    node.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text (default) or json: one JSON object per line with the node id and each "
        "call's request id, stream and consumer (docs/logging.md)",
    )
    node.add_argument(
        "--metrics",
        default=None,
        metavar="HOST:PORT",
        type=typed(address),
        help="serve Prometheus metrics on http://HOST:PORT/metrics (default: off; "
        "docs/metrics.md)",
    )
    node.add_argument("--connections-max", type=int, default=None, metavar="N",
                      help="clients with calls open at once on the client port; a call from "
                      "one more is RESOURCE_EXHAUSTED (default: no limit; docs/quotas.md)")
    node.add_argument("--subscriptions-max", type=int, default=None, metavar="N",
                      help="Subscribe calls open at once on this node (default "
                      "limits.subscriptions_max; docs/quotas.md)")
    node.add_argument("--log-repeat-window", type=float, default=None, metavar="SECONDS",
                      help="at most limits.log_repeats_max lines of one template are written "
                      "per window; the rest are counted in one summary line (default "
                      "limits.log_repeat_window_s; docs/logging.md)")
    _add_node_tls(node)
    node.set_defaults(run=_run_node)


def _add_node_tls(node: argparse.ArgumentParser) -> None:
    tls = node.add_argument_group("TLS (docs/tls.md; all three files or none: plaintext)")
    tls.add_argument("--tls-cert", type=Path, metavar="FILE",
                     help="the node's certificate (PEM), served on both ports and presented "
                     "to other nodes; re-read when it changes")
    tls.add_argument("--tls-key", type=Path, metavar="FILE", help="its private key (PEM)")
    tls.add_argument("--tls-ca", type=Path, metavar="FILE",
                     help="the CA every node's certificate chains to; the peer listener "
                     "requires a client certificate it signed")
    tls.add_argument("--tls-client-auth", choices=["none", "require"], default="none",
                     help="whether the client port requires a client certificate signed by "
                     "--tls-ca (default none)")


def dial_pair(text: str) -> tuple[str, str]:
    """ADDR=VIA, two host:port addresses."""
    target, sep, via = text.partition("=")
    if not sep:
        raise ValueError(f"expected ADDR=VIA, not {text!r}")
    return address(target), address(via)


def _version() -> str:
    try:
        return metadata.version("raftlog")
    except metadata.PackageNotFoundError:
        return "unknown"


def _run_node(args: argparse.Namespace) -> int:
    from raftlog.node import server  # the node's dependencies load only for `raftlog node`

    secret = ""
    if args.raft and args.secret_file is None:
        raise UsageError("--raft needs --secret-file: a node of a cluster always has the "
                         "cluster secret (make one with `raftlog cluster secret > FILE`)")
    if args.secret_file is not None:
        try:
            secret = read_secret_file(args.secret_file)
        except OSError as exc:
            raise UsageError(f"cannot read --secret-file: {exc}") from None
        except WeakSecret as exc:
            raise UsageError(f"--secret-file {args.secret_file}: {exc}") from None
    config = NodeConfig(
        data_dir=args.data,
        grpc_address=args.grpc,
        node_id=args.node_id,
        raft_address=args.raft or "",
        peer_address=(args.peer or default_peer_address(args.raft)) if args.raft else "",
        peers=tuple(args.peers),
        cluster_secret=secret,
        log_level=args.log_level,
        log_format=args.log_format,
        log_repeat_window_s=args.log_repeat_window,
        metrics_address=args.metrics or "",
        connections_max=args.connections_max,
        subscriptions_max=args.subscriptions_max,
        replace_dead_after_s=args.replace_dead_after,
        dial=tuple(args.dial),
        **_tls_config(args),
    )
    return server.run(config)


def _tls_config(args: argparse.Namespace) -> dict[str, Any]:
    files = {"--tls-cert": args.tls_cert, "--tls-key": args.tls_key, "--tls-ca": args.tls_ca}
    given = [flag for flag, path in files.items() if path is not None]
    if given and len(given) != len(files):
        missing = ", ".join(flag for flag in files if flag not in given)
        raise UsageError(f"{', '.join(given)} needs {missing} too (docs/tls.md)")
    if not given and args.tls_client_auth != "none":
        raise UsageError("--tls-client-auth needs --tls-cert, --tls-key and --tls-ca")
    return {"tls_cert": args.tls_cert, "tls_key": args.tls_key, "tls_ca": args.tls_ca,
            "tls_client_auth": args.tls_client_auth}
