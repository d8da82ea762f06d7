"""Failover benchmark of raftlog (issue 4): kill -9 of a stream's primary under a steady publisher.

Starts its own 3-node cluster (loopback ports, a temporary directory, processes stopped by pid
at the end, also on error or SIGTERM) and runs `--trials` trials. Each trial:

    1. creates a fresh R3 stream (`failover-<trial>`), limits retention;
    2. starts a sync publisher (one publish in flight, 0.5 s call timeout, unthrottled unless
       --rate) on a node that is NOT the stream's primary, moving to the next node on failure and
       retrying with the same msg_id (chaos/workload.py);
    3. after --pre-s seconds, kill -9 of the stream's primary (Cluster.ExplainRoute);
    4. measures `recover_s`, the time from the kill to the ack of the first publish sent after it
       (as the JetStream peer does), giving up after --recover-timeout-s;
    5. publishes --post-s more seconds, restarts the killed node, waits until the three replicas
       agree (`restart_catchup_s`), stops the publisher, and checks every acknowledged message
       is present exactly once at its seq and the replicas are identical (`acked` vs `present`).

A table goes to stderr, ONE JSON document to stdout (p50 = median, max, totals). With --peer the
JetStream peer's failover phase (`../shared/peers/jetstream/run --phases failover`) runs after it,
for the ratio of medians. Exit status 1 when a trial lost or misplaced an acknowledged message,
did not recover, or the peer failed; targets (p50 <= 1.3 s, max <= 3 s) are reported in
`checks` without changing the status.

    scripts/bench-failover                 10 trials, about 2-3 minutes
    scripts/bench-failover --quick         3 short trials
    scripts/bench-failover --peer          also JetStream's failover (adds about 1-2 minutes)

Differences from the peer: raftlog acks after an fsync on a majority, JetStream 2.9 does not
fsync; the peer's publisher uses a new msg id per attempt, ours retries with the same one.
"""

from __future__ import annotations

import argparse
import asyncio
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

import grpc

from raftlog.chaos import workload as wl
from raftlog.chaos.cluster import LocalCluster

ROOT = Path(os.environ.get("RAFTLOG_ROOT") or Path(__file__).resolve().parents[1])

PEER_RUN = ROOT.parent / "shared" / "peers" / "jetstream" / "run"
SCHEMA = "raftlog-bench-failover/1"

payload_bytes = 128
publish_call_timeout_s = 0.5  # as the peer's failover publisher
cluster_ready_timeout_s = 60.0
restart_timeout_s = 30.0
converge_timeout_s = 30.0
trial_publish_bound_s = 300.0  # the publisher stops by itself after this, whatever happens
peer_timeout_s = 900.0
peer_timeout_quick_s = 300.0
target_p50_s = 1.3
target_max_s = 3.0


@dataclass(frozen=True)
class Plan:
    trials: int
    pre_s: float  # publishing before the kill
    post_s: float  # publishing after recovery, before the restart
    recover_timeout_s: float
    rate_per_s: float | None


FULL = Plan(trials=10, pre_s=3.0, post_s=3.0, recover_timeout_s=20.0, rate_per_s=None)
QUICK = Plan(trials=3, pre_s=2.0, post_s=2.0, recover_timeout_s=15.0, rate_per_s=None)


@dataclass
class Trial:
    trial: int
    stream: str
    primary: str  # the node killed
    was_raft_leader: bool
    new_primary: str
    fence_epoch: int  # after the failover
    recover_s: float | None
    outage_s: float | None
    max_ack_gap_s: float
    restart_catchup_s: float | None
    acked: int
    present: int
    acked_missing: int
    acked_wrong_seq: int
    duplicates: int
    divergence: int
    unacked_but_present: int
    replicas_compared: int
    publish_p50_ms: float  # acknowledged publishes, send to ack, the whole trial
    publish_errors: dict[str, int]
    seed: int

    @property
    def lost_anything(self) -> bool:
        return bool(self.acked_missing or self.acked_wrong_seq or self.duplicates
                    or self.divergence or self.present != self.acked)


def _log(text: str) -> None:
    print(f"[bench-failover] {text}", file=sys.stderr, flush=True)


async def _run_trial(cluster: LocalCluster, plan: Plan, trial: int, seed: int) -> Trial:
    addresses = [cluster.address(i) for i in sorted(cluster.specs)]
    stream = f"failover-{trial}"
    await wl.create_stream(addresses, stream, subjects=[f"{stream}.>"], replicas=3)
    route = await wl.explain_route(addresses, stream)
    victim = cluster.index_of(route.primary)
    client_node = next(a for a in addresses if a != cluster.address(victim))
    publisher = wl.Publisher(addresses, wl.PublisherConfig(
        stream=stream, subject_prefix=f"{stream}.data", name=f"t{trial}", count_max=10**8,
        duration_s_max=trial_publish_bound_s, payload_bytes=payload_bytes,
        rate_per_s=plan.rate_per_s, call_timeout_s=publish_call_timeout_s,
        first_node=client_node), seed=seed)
    task = asyncio.create_task(publisher.run())
    try:
        await asyncio.sleep(plan.pre_s)
        leader = await asyncio.to_thread(cluster.leader_id)
        fault_at = publisher.clock()
        await asyncio.to_thread(cluster.kill9, victim)
        recover_s = await publisher.wait_ack_sent_after(fault_at,
                                                        timeout_s=plan.recover_timeout_s)
        await asyncio.sleep(plan.post_s)
        after = await wl.explain_route([cluster.address(i) for i in sorted(cluster.running)],
                                       stream)
        restart_at = time.monotonic()
        await asyncio.to_thread(cluster.start, victim, timeout_s=restart_timeout_s)
        caught_up_s = await wl.wait_caught_up(addresses, stream, replica=cluster.address(victim),
                                              timeout_s=converge_timeout_s,
                                              peer=cluster.peer_access())
        catchup_s = None if caught_up_s is None else time.monotonic() - restart_at
    finally:
        publisher.stop()
        history = await task
    report = await wl.audit(addresses, stream, seed=seed, published=[history],
                            replicas_required=3, converge_timeout_s=converge_timeout_s,
                            peer=cluster.peer_access())
    timing = wl.failover_timing([history], fault_at=fault_at)
    return Trial(
        trial=trial, stream=stream, primary=route.primary, was_raft_leader=leader == route.primary,
        new_primary=after.primary, fence_epoch=int(after.fence_epoch), recover_s=recover_s,
        outage_s=timing.outage_s, max_ack_gap_s=timing.max_ack_gap_s,
        restart_catchup_s=catchup_s, acked=report.acked, present=report.present,
        acked_missing=len(report.acked_missing), acked_wrong_seq=len(report.acked_wrong_seq),
        duplicates=len(report.duplicates), divergence=len(report.divergence),
        unacked_but_present=report.unacked_present, replicas_compared=report.replicas_compared,
        publish_p50_ms=round(1000 * statistics.median(
            [a.done_at - a.sent_at for a in history.attempts if a.seq] or [0.0]), 3),
        publish_errors=dict(history.errors()), seed=seed)


async def _run_trials(cluster: LocalCluster, plan: Plan, seed: int,
                      trials: list[Trial]) -> None:
    for trial in range(1, plan.trials + 1):
        result = await _run_trial(cluster, plan, trial, seed + trial)
        recover = "none" if result.recover_s is None else f"{result.recover_s:.3f} s"
        _log(f"trial {trial}/{plan.trials}: killed {result.primary}"
             f"{' (Raft leader)' if result.was_raft_leader else ''} -> {result.new_primary}, "
             f"recover {recover}, acked {result.acked}, present {result.present}")
        trials.append(result)


def run_trials(plan: Plan, *, seed: int, quick: bool = False) -> dict[str, Any]:
    """Starts a 3-node cluster in a temporary directory, runs the trials, stops the cluster
    (by pid, whatever happened). The raftlog part of the JSON: meta, summary, checks, trials,
    and `error` when a trial could not finish (the trials before it are kept)."""
    trials: list[Trial] = []
    error = None
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="raftlog-bench-failover-") as workdir:
        cluster = LocalCluster(Path(workdir) / "cluster", nodes=3)
        try:
            cluster.start_all(timeout_s=cluster_ready_timeout_s)
            _log(f"cluster up: {', '.join(cluster.address(i) for i in sorted(cluster.specs))}; "
                 f"seed={seed}")
            asyncio.run(_run_trials(cluster, plan, seed, trials))
        except (grpc.RpcError, wl.CollectError, RuntimeError, TimeoutError) as exc:
            error = f"trial {len(trials) + 1}: {type(exc).__name__}: {exc}"
            _log(f"FAILED {error}")
            for i in sorted(cluster.nodes):
                _log(f"n{i} log tail:\n{cluster.log_tail(i)}")
        finally:
            cluster.stop_all()
            _log("cluster stopped")
    summary = summarize(trials)
    return {
        "meta": {"plan": asdict(plan), "quick": quick, "seed": seed,
                 "payload_bytes": payload_bytes, "publish_call_timeout_s": publish_call_timeout_s,
                 "fsync_before_ack": True, "python": platform.python_version(),
                 "grpcio": grpc.__version__, "nproc": os.cpu_count(),
                 "duration_s": round(time.monotonic() - started, 1)},
        "summary": summary,
        "checks": checks(trials, summary),
        "trials": [{**asdict(t), "lost_anything": t.lost_anything} for t in trials],
        "error": error,
    }


def with_peer(section: dict[str, Any], peer: dict[str, Any] | None) -> dict[str, Any]:
    """`section` (from run_trials) with the peer's failover figures and the ratio; `peer` is
    the peer's whole JSON (any run that had the failover phase), {"error": ...}, or None."""
    js = None if peer is None or "error" in peer else peer_figures(peer)
    return {**section, "jetstream": js,
            "jetstream_error": None if peer is None else peer.get("error"),
            "ratio": ratio(section["summary"], js)}


def failed(document: dict[str, Any]) -> bool:
    """A trial lost or misplaced an acknowledged message, did not recover or finish, replicas
    differ, or the peer failed. Missed time targets do not count."""
    verdict = document["checks"]
    return (not verdict["failover_all_acked_present"]
            or not verdict["failover_recovered_every_trial"]
            or not verdict["replicas_identical"] or bool(document.get("error"))
            or bool(document.get("jetstream_error")))


def _figure(values: list[float | None]) -> dict[str, Any]:
    """{"p50", "min", "max", "n"}; p50 is the median, as the peer's "median"."""
    present = [v for v in values if v is not None]
    if not present:
        return {"p50": None, "min": None, "max": None, "n": 0}
    return {"p50": round(statistics.median(present), 4), "min": round(min(present), 4),
            "max": round(max(present), 4), "n": len(present)}


def summarize(trials: list[Trial]) -> dict[str, Any]:
    total = {name: sum(getattr(t, name) for t in trials) for name in (
        "acked", "present", "acked_missing", "acked_wrong_seq", "duplicates", "divergence",
        "unacked_but_present")}
    return {
        "recover_s": _figure([t.recover_s for t in trials]),
        "outage_s": _figure([t.outage_s for t in trials]),
        "max_ack_gap_s": _figure([t.max_ack_gap_s for t in trials]),
        "restart_catchup_s": _figure([t.restart_catchup_s for t in trials]),
        "replicas": 3,
        "trials": len(trials),
        "killed_raft_leader": sum(t.was_raft_leader for t in trials),
        **total,
    }


def checks(trials: list[Trial], summary: dict[str, Any]) -> dict[str, Any]:
    recover = summary["recover_s"]
    every = bool(trials) and all(t.recover_s is not None for t in trials)
    return {
        "failover_all_acked_present": not any(t.lost_anything for t in trials),
        "failover_recovered_every_trial": every,
        "replicas_identical": all(t.divergence == 0 and t.replicas_compared == 3 for t in trials),
        "target_p50_s": target_p50_s,
        "target_max_s": target_max_s,
        "meets_p50": every and recover["p50"] is not None and recover["p50"] <= target_p50_s,
        "meets_max": every and recover["max"] is not None and recover["max"] <= target_max_s,
    }


def run_peer(*, trials: int, quick: bool) -> dict[str, Any]:
    """The peer's failover phase (its progress on our stderr); its JSON, or {"error": ...}."""
    return run_peer_command(["--phases", "failover", "--failover-trials", str(trials)],
                            quick=quick,
                            timeout_s=peer_timeout_quick_s if quick else peer_timeout_s)


def run_peer_command(args: list[str], *, quick: bool, timeout_s: float) -> dict[str, Any]:
    """Runs `../shared/peers/jetstream/run ARGS` (its progress on our stderr); its JSON, or
    {"error": ...}. Shared with scripts/bench.py."""
    if not os.access(PEER_RUN, os.X_OK):
        return {"error": f"{PEER_RUN} not found or not executable"}
    command = [str(PEER_RUN), *args, *(["--quick"] if quick else [])]
    _log(f"running {' '.join(command)}")
    try:
        completed = subprocess.run(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                   timeout=timeout_s, check=False, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return {"error": f"the peer did not finish within {timeout_s:.0f} s"}
    if completed.returncode != 0:
        return {"error": f"the peer exited with status {completed.returncode}"}
    try:
        document: dict[str, Any] = json.loads(completed.stdout)
    except json.JSONDecodeError as exc:
        return {"error": f"the peer printed no JSON: {exc}"}
    return document


def peer_figures(peer: dict[str, Any]) -> dict[str, Any]:
    failover = peer.get("summary", {}).get("failover", {})
    recover = failover.get("recover_s", {})
    return {
        "recover_s": {"p50": recover.get("median"), "min": recover.get("min"),
                      "max": recover.get("max"), "n": recover.get("n")},
        "acked": failover.get("acked"),
        "present": failover.get("present"),
        "acked_missing": failover.get("acked_missing"),
        "nats_server": peer.get("meta", {}).get("nats_server"),
        "fsync_per_ack": peer.get("meta", {}).get("cluster", {}).get("fsync_per_ack"),
        "checks": peer.get("checks"),
    }


def ratio(ours: dict[str, Any], js: dict[str, Any] | None) -> dict[str, Any]:
    """JetStream's median recovery over ours: how many times faster raftlog fails over."""
    ours_p50 = ours["recover_s"]["p50"]
    theirs = None if js is None else js["recover_s"]["p50"]
    value = round(theirs / ours_p50, 2) if ours_p50 and theirs else None
    return {"jetstream_over_raftlog_recover_p50": value, "target": 4.0}


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(document: dict[str, Any]) -> str:
    lines = ["", "raftlog failover: kill -9 of the stream primary, R3, sync publisher",
             f"{'trial':>5} {'killed':>6} {'leader':>6} {'->':>4} {'recover_s':>9} "
             f"{'outage_s':>9} {'catchup_s':>9} {'acked':>7} {'present':>7} {'lost':>5}"]
    for t in document["trials"]:
        lost = t["acked_missing"] + t["acked_wrong_seq"] + t["duplicates"] + t["divergence"]
        lines.append(
            f"{t['trial']:>5} {t['primary']:>6} {'yes' if t['was_raft_leader'] else '':>6} "
            f"{t['new_primary']:>4} {_seconds(t['recover_s']):>9} {_seconds(t['outage_s']):>9} "
            f"{_seconds(t['restart_catchup_s']):>9} {t['acked']:>7} {t['present']:>7} {lost:>5}")
    summary = document["summary"]
    recover = summary["recover_s"]
    lines.append(f"recover_s p50 {_seconds(recover['p50'])} max {_seconds(recover['max'])} "
                 f"(targets <= {target_p50_s} / <= {target_max_s}); acked {summary['acked']}, "
                 f"present {summary['present']}, missing {summary['acked_missing']}")
    js = document.get("jetstream")
    if js is not None:
        lines.append(f"JetStream recover_s p50 {_seconds(js['recover_s']['p50'])} max "
                     f"{_seconds(js['recover_s']['max'])}; ratio JS/raftlog p50 "
                     f"{document['ratio']['jetstream_over_raftlog_recover_p50']} (target >= 4)")
    elif document.get("jetstream_error"):
        lines.append(f"JetStream: {document['jetstream_error']}")
    if document.get("error"):
        lines.append(f"stopped early: {document['error']}")
    return "\n".join(lines)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the `finally` that stops the cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench-failover", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, help="kill -9 trials (default 10, --quick 3)")
    parser.add_argument("--quick", action="store_true", help="3 short trials")
    parser.add_argument("--peer", action="store_true",
                        help="also run the JetStream peer's failover phase, same trial count")
    parser.add_argument("--rate", type=float, help="publishes per second (default: unthrottled)")
    parser.add_argument("--seed", type=int, help="workload seed (default: $RAFTLOG_WORKLOAD_SEED "
                        "or random)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.trials is not None:
        if not 1 <= args.trials <= 100:
            parser.error("--trials must be 1..100")
        plan = Plan(**{**asdict(plan), "trials": args.trials})
    if args.rate is not None:
        plan = Plan(**{**asdict(plan), "rate_per_s": args.rate})
    seed = args.seed if args.seed is not None else wl.seed_from_env()
    signal.signal(signal.SIGTERM, _terminate)
    section = run_trials(plan, seed=seed, quick=args.quick)
    peer = run_peer(trials=plan.trials, quick=args.quick) if args.peer else None
    document = {"schema": SCHEMA, **with_peer(section, peer)}
    print(table(document), file=sys.stderr)
    print(json.dumps(document, indent=2))
    if failed(document):
        _log(f"FAILED (reproduce the requests with --seed {seed}): "
             f"{json.dumps(document['checks'])} {document.get('error') or ''}")
        return 1
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
