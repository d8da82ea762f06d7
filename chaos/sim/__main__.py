"""`python -m raftlog.chaos.sim --seed N [--schedules K] [--nodes 3|5] [--steps S] ...`: runs K
simulated schedules, seeds N..N+K-1, prints one verdict line each and the throughput; for every
failure, its violations, schedule and trace tail, and the one command that replays it. Exit
status 1 when a schedule failed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator, Sequence

from raftlog.chaos.sim.bugs import BUGS
from raftlog.chaos.sim.run import SimConfig, Verdict, run_job


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    defaults = SimConfig()
    parser = argparse.ArgumentParser(prog="python -m raftlog.chaos.sim",
                                     description="Seeded in-process simulation of a raftlog "
                                     "cluster under faults.")
    parser.add_argument("--seed", type=int, required=True, help="seed of the first schedule")
    parser.add_argument("--schedules", type=int, default=1, help="schedules to run (seeds "
                        "seed, seed+1, ...)")
    parser.add_argument("--nodes", type=int, choices=(3, 5), default=defaults.nodes)
    parser.add_argument("--steps", type=int, default=defaults.steps, help="faults per schedule")
    parser.add_argument("--streams", type=int, default=defaults.streams)
    parser.add_argument("--replicas", type=int, choices=(1, 3, 5), default=defaults.replicas)
    parser.add_argument("--publishers", type=int, default=defaults.publishers)
    parser.add_argument("--readers", type=int, default=defaults.readers)
    parser.add_argument("--consumers", type=int, default=defaults.consumers)
    parser.add_argument("--bug", choices=BUGS, default="", help="inject a known bug")
    parser.add_argument("--power-loss", action="store_true", help="power-loss faults too "
                        "(unsynced writes lost)")
    parser.add_argument("--strict", action="store_true", help="known product issues "
                        "(checks.KNOWN_ISSUES) fail a schedule too")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="worker processes (default: one per CPU)")
    parser.add_argument("--stop-on-failure", action="store_true")
    parser.add_argument("--quiet", action="store_true", help="print failures and the summary "
                        "only")
    args = parser.parse_args(argv)
    if args.replicas > args.nodes:
        parser.error("--replicas cannot exceed --nodes")
    return args


def config_of(args: argparse.Namespace) -> SimConfig:
    return SimConfig(nodes=args.nodes, steps=args.steps, streams=args.streams,
                     replicas=args.replicas, publishers=args.publishers, readers=args.readers,
                     consumers=args.consumers,
                     bug=args.bug, power_loss=args.power_loss, strict=args.strict)


def verdicts(seeds: range, config: SimConfig, *, jobs: int) -> Iterator[Verdict]:
    """The verdicts in seed order (runs spread over `jobs` processes)."""
    work = [(seed, config) for seed in seeds]
    if jobs <= 1:
        yield from map(run_job, work)
        return
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        yield from pool.imap(run_job, work)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    config = config_of(args)
    started = time.perf_counter()
    failed: list[Verdict] = []
    done = 0
    virtual_s = cpu_s = 0.0
    for verdict in verdicts(range(args.seed, args.seed + args.schedules), config,
                            jobs=args.jobs):
        done += 1
        virtual_s += verdict.virtual_s
        cpu_s += verdict.cpu_s
        if not verdict.ok:
            failed.append(verdict)
            print(verdict.report(), flush=True)
            if args.stop_on_failure:
                break
        elif not args.quiet:
            print(verdict.line(), flush=True)
    elapsed_s = time.perf_counter() - started
    rate = done / elapsed_s * 60 if elapsed_s > 0 else 0.0
    per_core = done / cpu_s * 60 if cpu_s > 0 else 0.0
    print(f"{done} schedules, {len(failed)} failed, {elapsed_s:.1f} s real, "
          f"{virtual_s:.0f} s virtual: {rate:.0f} schedules/minute "
          f"({args.jobs} process{'es' if args.jobs > 1 else ''}; {per_core:.0f} per CPU-minute)")
    for verdict in failed:
        print(f"replay: {config.replay_command(verdict.seed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
