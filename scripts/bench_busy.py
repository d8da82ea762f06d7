"""Busy-machine benchmark (issue 10, item 6): a 3-node cluster beside N CPU-bound processes.

For each N in --hogs (default 4 and 8), with N processes spinning on the CPU (`while True:
pass`, default priority) beside the nodes:

    1. idle: a fresh 3-node cluster holding --streams R3 streams (a few messages each), watched
       for --duration seconds (default 300): Raft elections (the rise of the highest Raft term
       any node reports) and failovers (the rise of the streams' fence epochs, read with
       Cluster.ExplainRoute), sampled every second; targets 0 failovers, at most 1 election;
    2. kill -9 failover trials (scripts/bench_failover.py, --trials, default 10) with the
       processes still spinning; target p50 <= 1.5 s.

A table goes to stderr, ONE JSON document to stdout. The hogs and every node are stopped by pid
at the end, also on error or SIGTERM.

    scripts/bench-busy                     4 and 8 hogs, 5 minutes each, 10 trials each
    scripts/bench-busy --quick             4 hogs, 60 s, 3 trials
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import bench_failover  # scripts/ is sys.path[0]
import grpc

from raftlog.chaos.cluster import LocalCluster
from raftlog.v1 import cluster_pb2, streams_pb2, types_pb2

ROOT = Path(os.environ.get("RAFTLOG_ROOT") or Path(__file__).resolve().parents[1])

SCHEMA = "raftlog-bench-busy/1"
sample_period_s = 1.0
call_timeout_s = 5.0
cluster_ready_timeout_s = 120.0
messages_per_stream = 10
target_failovers = 0
target_elections_max = 1
target_failover_p50_s = 1.5
HOG = "while True:\n    pass\n"


@dataclass(frozen=True)
class Plan:
    hogs: tuple[int, ...]
    duration_s: float
    streams: int
    trials: int
    hog_nice: int = 0  # below 0: each hog weighs more than a node (root only)


FULL = Plan(hogs=(4, 8), duration_s=300.0, streams=300, trials=10)
QUICK = Plan(hogs=(4,), duration_s=60.0, streams=100, trials=3)


def _log(text: str) -> None:
    print(f"[bench-busy] {text}", file=sys.stderr, flush=True)


class Hogs:
    """N CPU-bound processes of our own, stopped by pid. Each in its own session: with the
    kernel's autogroup scheduling (on here) processes of one session share one CPU share, so
    hogs started in one session would weigh as one process against the nodes (each node runs in
    a session of its own)."""

    def __init__(self, count: int, *, nice: int = 0) -> None:
        def lower_or_raise() -> None:
            if nice:
                os.setpriority(os.PRIO_PROCESS, 0, nice)

        self.processes = [subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.DEVNULL,
                                           start_new_session=True, preexec_fn=lower_or_raise)
                          for _ in range(count)]

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
        for process in self.processes:
            process.wait(timeout=10)


def _load() -> float:
    return os.getloadavg()[0]


def _epochs(cluster: LocalCluster, names: list[str]) -> dict[str, int]:
    epochs = {}
    for name in names:
        for i in sorted(cluster.running):
            try:
                route = cluster.cluster(i).ExplainRoute(
                    cluster_pb2.ExplainRouteRequest(stream=name), timeout=call_timeout_s)
            except grpc.RpcError:
                continue
            epochs[name] = int(route.fence_epoch)
            break
    return epochs


def _create(cluster: LocalCluster, names: list[str]) -> None:
    for name in names:
        deadline = time.monotonic() + 30
        while True:
            try:
                cluster.streams(1).CreateStream(streams_pb2.CreateStreamRequest(
                    config=types_pb2.StreamConfig(name=name, replicas=3)),
                    timeout=call_timeout_s)
                cluster.streams(1).PublishBatch(streams_pb2.PublishBatchRequest(
                    stream=name, entries=[streams_pb2.PublishEntry(subject="s", payload=b"x")
                                          for _ in range(messages_per_stream)]),
                    timeout=call_timeout_s)
                break
            except grpc.RpcError as exc:
                if time.monotonic() > deadline:
                    raise
                _log(f"creating {name}: {exc.code().name}; retrying")
                time.sleep(0.5)


def observe_idle(workdir: Path, plan: Plan, hogs: int) -> dict[str, Any]:
    """Phase 1: an idle cluster beside the hogs, for plan.duration_s."""
    cluster = LocalCluster(workdir / f"idle-{hogs}", nodes=3)
    try:
        cluster.start_all(timeout_s=cluster_ready_timeout_s)
        names = [f"busy-{k}" for k in range(plan.streams)]
        _create(cluster, names)
        first_terms = cluster.raft_terms(timeout_s=call_timeout_s)
        first_epochs = _epochs(cluster, names)
        term0 = max(first_terms)
        started = time.monotonic()
        samples: list[dict[str, Any]] = []
        while time.monotonic() - started < plan.duration_s:
            time.sleep(sample_period_s)
            terms = cluster.raft_terms(timeout_s=call_timeout_s)
            samples.append({"t_s": round(time.monotonic() - started, 1),
                            "term_max": max(terms, default=0), "load1": _load()})
            if len(samples) % 30 == 0:
                _log(f"{hogs} hogs: {samples[-1]['t_s']:.0f} s, Raft term {term0} -> "
                     f"{samples[-1]['term_max']}, load {samples[-1]['load1']:.1f}")
        last_epochs = _epochs(cluster, names)
        term1 = max(cluster.raft_terms(timeout_s=call_timeout_s), default=term0)
        failovers = sum(last_epochs.get(n, 0) - first_epochs.get(n, 0) for n in names)
        return {"streams": len(names), "duration_s": plan.duration_s,
                "elections": term1 - term0, "raft_term_first": term0, "raft_term_last": term1,
                "failovers": failovers,
                "streams_failed_over": sum(1 for n in names
                                           if last_epochs.get(n, 0) > first_epochs.get(n, 0)),
                "load1_p50": round(statistics.median(s["load1"] for s in samples), 1)
                if samples else None}
    finally:
        cluster.stop_all()


def run(plan: Plan, *, seed: int, quick: bool) -> dict[str, Any]:
    runs = []
    with tempfile.TemporaryDirectory(prefix="raftlog-bench-busy-") as workdir:
        for count in plan.hogs:
            _log(f"starting {count} CPU-bound processes")
            hogs = Hogs(count, nice=plan.hog_nice)
            try:
                time.sleep(2.0)
                idle = observe_idle(Path(workdir), plan, count)
                _log(f"{count} hogs, idle: {idle}")
                trials_plan = bench_failover.Plan(**{
                    **asdict(bench_failover.QUICK if quick else bench_failover.FULL),
                    "trials": plan.trials})
                failover = bench_failover.run_trials(trials_plan, seed=seed, quick=quick)
            finally:
                hogs.stop()
            recover = failover["summary"]["recover_s"]
            runs.append({
                "hogs": count, "idle": idle,
                "failover": {"summary": failover["summary"], "checks": failover["checks"],
                             "error": failover["error"]},
                "checks": {
                    "failovers": idle["failovers"] == target_failovers,
                    "elections": idle["elections"] <= target_elections_max,
                    "failover_p50": recover["p50"] is not None
                    and recover["p50"] <= target_failover_p50_s,
                    "nothing_lost": failover["checks"]["failover_all_acked_present"],
                }})
    return {"schema": SCHEMA, "meta": {
        "plan": asdict(plan), "quick": quick, "seed": seed, "nproc": os.cpu_count(),
        "python": platform.python_version(), "targets": {
            "failovers": target_failovers, "elections_max": target_elections_max,
            "failover_p50_s": target_failover_p50_s}}, "runs": runs}


def table(document: dict[str, Any]) -> str:
    lines = ["", "raftlog beside CPU-bound processes (3 nodes, R3 streams)",
             f"{'hogs':>4} {'load':>5} {'idle_s':>6} {'elections':>9} {'failovers':>9} "
             f"{'kill9 p50_s':>11} {'max_s':>6} {'acked':>7} {'lost':>5}"]
    for run_ in document["runs"]:
        idle, summary = run_["idle"], run_["failover"]["summary"]
        recover = summary["recover_s"]
        lost = summary["acked_missing"] + summary["acked_wrong_seq"] + summary["duplicates"]
        lines.append(
            f"{run_['hogs']:>4} {idle['load1_p50'] or 0:>5.1f} {idle['duration_s']:>6.0f} "
            f"{idle['elections']:>9} {idle['failovers']:>9} "
            f"{bench_failover._seconds(recover['p50']):>11} "
            f"{bench_failover._seconds(recover['max']):>6} {summary['acked']:>7} {lost:>5}")
    lines.append(f"targets: {target_failovers} failovers, at most {target_elections_max} "
                 f"election while idle; kill -9 failover p50 <= {target_failover_p50_s} s")
    return "\n".join(lines)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the `finally`s that stop everything


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench-busy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 hogs, 60 s, 3 trials")
    parser.add_argument("--hogs", help="comma-separated hog counts (default 4,8)")
    parser.add_argument("--duration", type=float, help="idle seconds per hog count")
    parser.add_argument("--streams", type=int, help="R3 streams in the idle cluster")
    parser.add_argument("--trials", type=int, help="kill -9 trials per hog count")
    parser.add_argument("--seed", type=int, help="workload seed of the trials")
    parser.add_argument("--hog-nice", type=int, help="nice value of the hogs (default 0; "
                        "negative, as root, makes each outweigh a node)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {}
    if args.hogs:
        overrides["hogs"] = tuple(int(h) for h in args.hogs.split(","))
    for name, field in (("duration", "duration_s"), ("streams", "streams"),
                        ("trials", "trials"), ("hog_nice", "hog_nice")):
        value = getattr(args, name)
        if value is not None:
            overrides[field] = value
    plan = Plan(**{**asdict(plan), **overrides})
    seed = args.seed if args.seed is not None else bench_failover.wl.seed_from_env()
    signal.signal(signal.SIGTERM, _terminate)
    document = run(plan, seed=seed, quick=args.quick)
    print(table(document), file=sys.stderr)
    print(json.dumps(document, indent=2))
    failed = [r for r in document["runs"] if not r["checks"]["nothing_lost"]
              or r["failover"]["error"]]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
