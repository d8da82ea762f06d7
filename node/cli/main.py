"""The `raftlog` command: run a node or a local cluster, and manage streams, consumers, messages
and placement.

    raftlog node --data DIR --grpc 127.0.0.1:7400          run a node (SIGTERM drains)
    raftlog stream create|info|ls|update|rm|purge|get|last|subjects|scan ...
    raftlog pub STREAM SUBJECT [PAYLOAD...]                 publish (args, stdin lines, or load)
    raftlog consumer create|info|ls|rm ...
    raftlog fetch|sub STREAM CONSUMER                       read messages and ack them
    raftlog health                                          is the node serving?
    raftlog cluster up|down|status|join|leave               a local or real cluster
    raftlog cluster overrides|stats|watch|rebalance|clear-authority
    raftlog stream route NAME                               why a stream lives where it does
    raftlog stream migrate NAME NODE [--pin] | pin | unpin  move a stream's primary

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
from raftlog.node.cli.consumers import add_consumer_commands
from raftlog.node.cli.streams import add_stream_commands
from raftlog.node.config import NodeConfig, default_peer_address
from raftlog.node.transport.credentials import WeakSecret, read_secret_file

CHAOS_COMMAND = "chaos"


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == [CHAOS_COMMAND]:
        return _run_chaos(args_in[1:])
    parser = build_parser()
    try:
        args = _parse(parser, argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
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
    )
    parser.add_argument("--version", action="version", version=f"raftlog {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_node(commands)
    add_stream_commands(commands)
    add_cluster_commands(commands)
    add_consumer_commands(commands)
    commands.add_parser(CHAOS_COMMAND, add_help=False,
                        help="break a local cluster on purpose and check nothing acknowledged "
                        "is lost (`raftlog chaos --help`)")
    return parser


def _run_chaos(argv: list[str]) -> NoReturn:
    """`raftlog chaos ...` is the chaos harness (raftlog.chaos, a package above the node's):
    handed over to `python -m raftlog.chaos` in this process's place."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "raftlog.chaos", *argv])


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
    node.set_defaults(run=_run_node)


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
        replace_dead_after_s=args.replace_dead_after,
        dial=tuple(args.dial),
    )
    return server.run(config)
