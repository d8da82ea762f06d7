"""`python -m raftlog.audit` (and `raftlog audit`): export, run, repair, cluster."""

from __future__ import annotations

import argparse
import sys

from raftlog.audit import cli_export, cli_repair, cli_run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftlog audit",
        description="Export every replica of every stream, prove with Spark that they agree, "
        "and repair them where they do not.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    cli_export.register(commands)
    cli_run.register(commands)
    cli_repair.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return 2
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
