"""`raftlog chaos` (`python -m raftlog.chaos`): `run` breaks a local cluster on purpose and
checks that nothing acknowledged is lost; `toxiproxy` runs the bundled Toxiproxy server alone.

`run --hosts` puts each node in its own network namespace with its own 10.x address on a
bridge and makes partitions with iptables instead of Toxiproxy (root only; chaos/hosts.py,
chaos/hosts_run.py). It refuses the nemeses it cannot make: latency, bandwidth, slicer and
limit-data.

A run ends with an audit of the healed cluster: the stopped nodes' data directories are exported
and `raftlog audit run` (Spark, local) compares every copy; its report goes to DIR/audit/ and its
outcome into report.json's `audit` section. `--no-audit` skips it.

Exit status of `run`: 0 when every check passed and the audit was clean (or skipped), 1 when a
check failed or the audit found divergences or failed (the report says which, and the command
that reproduces the run is printed) or the run did not finish, 2 for a usage error or when
--hosts cannot run on this machine (the reason says what to run).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

from raftlog.chaos.nemesis import HOSTS_REFUSED, NEMESES, parse_nemeses
from raftlog.chaos.toxiproxy import __main__ as toxiproxy_main

EXIT_FAILED = 1
EXIT_USAGE = 2
nodes_choices = (3, 5)


def _duration(text: str) -> float:
    value = float(text.removesuffix("s"))
    if value <= 0:
        raise ValueError("a duration must be positive")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raftlog chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = commands.add_parser("run", help="a chaos run against a local cluster")
    run.add_argument("--nodes", type=int, choices=nodes_choices, default=3)
    run.add_argument("--duration", type=_duration, default=60.0, metavar="S",
                     help="seconds of workload under faults (default 60)")
    run.add_argument("--nemesis", type=parse_nemeses, default=[], metavar="LIST",
                     help="comma-separated faults: " + ", ".join(sorted(NEMESES))
                     + " (default none)")
    run.add_argument("--rate", type=float, default=200.0, metavar="R",
                     help="messages per second published (default 200)")
    run.add_argument("--seed", type=int, default=None, help="default: a random one")
    run.add_argument("--dir", type=Path, default=None,
                     help="where the cluster, history and report go (default: a new temp dir)")
    run.add_argument("--json", action="store_true", help="print the report as JSON")
    run.add_argument("--hosts", action="store_true",
                     help="each node in its own network namespace with its own address, "
                     "partitions by iptables (root only; no " + ", ".join(sorted(HOSTS_REFUSED))
                     + ")")
    run.add_argument("--no-audit", dest="audit", action="store_false",
                     help="skip the audit of the healed cluster at the end (an offline export "
                     "of every node and a Spark job, about 30-60 s)")
    toxiproxy = commands.add_parser("toxiproxy", add_help=False,
                                    help="the bundled Toxiproxy server (its --help)")
    toxiproxy.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _hosts_refusal(args: argparse.Namespace) -> str | None:
    """Why `run --hosts` cannot go ahead (None: it can)."""
    from raftlog.chaos import hosts_run
    from raftlog.chaos.hosts import ensure_hosts

    refused = sorted(set(args.nemesis) & set(HOSTS_REFUSED))
    if refused:
        why = "; ".join(f"{name} ({HOSTS_REFUSED[name]})" for name in refused)
        return (f"hosts mode refuses {why}. Leave out --hosts (the loopback mode, with "
                "Toxiproxy) to run them")
    if hosts_run.inside():
        return None
    reason = ensure_hosts()
    return None if reason is None else f"cannot run on this machine: {reason}"


def _run(args: argparse.Namespace) -> int:
    from raftlog.chaos import hosts_run
    from raftlog.chaos.run import RunConfig, run_chaos  # the cluster machinery loads here

    if args.hosts and (refusal := _hosts_refusal(args)) is not None:
        print(f"raftlog chaos run --hosts: {refusal}", file=sys.stderr)
        return EXIT_USAGE
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="raftlog-chaos-"))
    config = RunConfig(workdir=workdir, nodes=args.nodes, duration_s=args.duration,
                       nemeses=tuple(args.nemesis), rate_per_s=args.rate, seed=seed,
                       hosts=args.hosts, audit=args.audit)
    if args.hosts and not hosts_run.inside():
        try:
            status = hosts_run.run_outside(config, json_out=args.json, progress=_progress)
        except TimeoutError as exc:
            print(f"raftlog chaos run --hosts: {exc}", file=sys.stderr)
            return EXIT_FAILED
        return status if status in (0, EXIT_FAILED, EXIT_USAGE) else EXIT_FAILED
    result = run_chaos(config, progress=_progress)
    if args.json:
        import json

        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result.verdict.summary())
        print(result.audit.summary())
        print(f"report: {workdir / 'report.json'}  history: {result.history_path}  "
              f"timeline: {workdir / 'timeline.html'} (.png)")
    if not result.ok:
        print(f"reproduce with: {result.replay_command()}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["toxiproxy"]:
        return toxiproxy_main.main(argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.command == "run":
        return _run(args)
    parser.print_help(sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
