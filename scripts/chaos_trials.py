"""The chaos trial matrix of issue 12: every nemesis, N trials of 60 s on 3 nodes and M on 5.

Each trial is one `python -m raftlog.chaos run --nodes K --duration S --nemesis NAME --seed SEED
--dir OUT/<K>n/<NAME>/<SEED>/run` (which ends with the audit of the healed cluster; `--no-audit` is
passed on to every trial), run one after another (they share the machine's cores, and
availability figures mean nothing when two clusters compete). The matrix is restartable: a trial
with a `done` file is skipped, so stopping (Ctrl-C, or a file named STOP in OUT) and starting
again goes on where it stopped. Rounds interleave the node counts and nemeses, so a matrix cut
short still covers every nemesis.

At the end (or with --table alone) it prints one row per (nodes, nemesis): trials, acknowledged,
each safety count, failovers, the longest unavailable window and recovery p50/max pooled over the
trials (recoveries after events that left a majority able to talk). --md prints a Markdown table.
Exit status 1 when any trial found an anomaly or ended without a report.

    scripts/chaos-trials --out /tmp/trials                        the whole matrix, about 2.5 h
    scripts/chaos-trials --out /tmp/trials --nemesis kill-primary,bridge --trials3 1 --trials5 0
    scripts/chaos-trials --out /tmp/trials --table --md           the table of what has run
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raftlog.chaos.checks.availability import measure_availability
from raftlog.chaos.events import read_history
from raftlog.chaos.nemesis import NEMESES

MATRIX = ("none", "kill-primary", "kill-leader", "kill-two", "pause-primary",
          "partition-primary", "bridge", "majority", "one-way", "flapping", "latency", "cpu",
          "rolling-restart", "join-leave", "power-loss-all", "power-loss-node",
          "power-loss-primary", "disk-full")
SAFETY = ("lost", "duplicate", "wrong-seq", "gap", "two-payloads", "producer-order",
          "ack-undone", "ack-floor-backwards", "split-brain", "stale-read", "replica-differs",
          "replica-missing")
trial_timeout_s = 600.0  # a trial still running after this is killed and counted as an error
ROOT = Path(__file__).resolve().parent.parent


def plan(trials3: int, trials5: int) -> list[tuple[int, int]]:
    """(nodes, trial number) rounds: 3-node rounds with the 5-node ones spread among them."""
    threes = [(3, k) for k in range(1, trials3 + 1)]
    fives = [(5, k) for k in range(1, trials5 + 1)]
    rounds: list[tuple[int, int]] = []
    while threes or fives:
        rounds += threes[:2]
        del threes[:2]
        rounds += fives[:1]
        del fives[:1]
    return rounds


def seed_of(nodes: int, nemesis_index: int, trial: int) -> int:
    return 1000 * nodes + 50 * nemesis_index + trial


def commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def run_matrix(out: Path, nemeses: list[str], rounds: list[tuple[int, int]], *,
               duration_s: float, rate: float, audit: bool = True) -> None:
    for nodes, trial in rounds:
        for nemesis in nemeses:
            if (out / "STOP").exists():
                print("STOP file found, stopping", file=sys.stderr)
                return
            seed = seed_of(nodes, MATRIX.index(nemesis) if nemesis in MATRIX else 49, trial)
            trial_dir = out / f"{nodes}n" / nemesis / str(seed)
            if (trial_dir / "done").exists():
                continue
            trial_dir.mkdir(parents=True, exist_ok=True)
            began = time.monotonic()
            command = [sys.executable, "-m", "raftlog.chaos", "run", "--nodes", str(nodes),
                       "--duration", str(duration_s), "--nemesis", nemesis, "--rate", str(rate),
                       "--seed", str(seed), "--dir", str(trial_dir / "run"),
                       *([] if audit else ["--no-audit"])]
            with open(trial_dir / "log", "w", encoding="utf-8") as log:
                try:
                    rc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, timeout=trial_timeout_s,
                                        check=False).returncode
                except subprocess.TimeoutExpired:
                    rc = -1
            wall_s = time.monotonic() - began
            (trial_dir / "done").write_text(json.dumps({"rc": rc, "wall_s": wall_s,
                                                        "commit": commit()}))
            print(f"{time.strftime('%H:%M:%S')} {nodes}n {nemesis:<18} seed {seed} exit {rc} "
                  f"{wall_s:.0f} s", file=sys.stderr, flush=True)


@dataclass
class Row:
    nodes: int
    nemesis: str
    reports: list[dict[str, Any]]
    errors: list[str]  # trial directories that ended without a report
    recoveries: list[float]
    commits: list[str]

    def cells(self) -> list[str]:
        verdicts = [report["verdict"] for report in self.reports]

        def total(*keys: str) -> str:
            return str(sum(verdict.get(key, 0) for verdict in verdicts for key in keys))

        longest = [v["longest_window_s"] for v in verdicts if v["longest_window_s"] is not None]
        trials = str(len(self.reports)) + (f" +{len(self.errors)} err" if self.errors else "")
        return [f"{self.nodes}", self.nemesis, trials, total("acknowledged"), total("lost"),
                total("duplicate"), total("wrong-seq"), total("ack-undone"),
                total("split-brain"), total("replica-differs", "replica-missing"),
                total("failovers"), f"{max(longest):.2f}" if longest else "-",
                f"{statistics.median(self.recoveries):.2f}" if self.recoveries else "-",
                f"{max(self.recoveries):.2f}" if self.recoveries else "-",
                f"{sum(1 for report in self.reports if report['ok'])}/{len(self.reports)}",
                ",".join(sorted(set(self.commits)))]


HEAD = ["nodes", "nemesis", "trials", "acknowledged", "lost", "dup", "wrong seq", "acks undone",
        "split brain", "replicas differ", "failovers", "longest unavailable s",
        "recovery p50 s", "recovery max s", "clean", "commit"]


def collect(out: Path, nemeses: list[str]) -> list[Row]:
    rows = []
    for nodes in (3, 5):
        for nemesis in nemeses:
            row = Row(nodes, nemesis, [], [], [], [])
            for trial_dir in sorted((out / f"{nodes}n" / nemesis).glob("*")):
                done_path = trial_dir / "done"
                if not done_path.exists():
                    continue
                row.commits.append(json.loads(done_path.read_text()).get("commit", "?"))
                report_path = trial_dir / "run" / "report.json"
                if not report_path.exists():
                    row.errors.append(str(trial_dir))
                    continue
                row.reports.append(json.loads(report_path.read_text()))
                measured = measure_availability(read_history(trial_dir / "run" / "history.jsonl"),
                                                instant_faults=frozenset(NEMESES))
                row.recoveries += [recovery.recover_s for recovery in measured.recoveries
                                   if recovery.majority and recovery.recover_s is not None]
            if row.reports or row.errors:
                rows.append(row)
    return rows


def print_table(rows: list[Row], *, markdown: bool) -> None:
    table = [row.cells() for row in rows]
    if markdown:
        print("| " + " | ".join(HEAD) + " |")
        print("|" + "---|" * len(HEAD))
        for cells in table:
            print("| " + " | ".join(cells) + " |")
        return
    widths = [max(len(cell) for cell in column) for column in zip(HEAD, *table, strict=False)]
    for cells in [HEAD, *table]:
        print("  ".join(cell.rjust(width) for cell, width in zip(cells, widths, strict=True)))


def failures(rows: list[Row]) -> list[str]:
    found = [f"{path}: ended without a report (see its log)" for row in rows
             for path in row.errors]
    for row in rows:
        for report in row.reports:
            if not report["ok"]:
                counts: dict[str, object] = {
                    key: report["verdict"][key] for key in (*SAFETY, "unavailable")
                    if report["verdict"].get(key)}
                audit = report.get("audit") or {}
                if not audit.get("ok", True):
                    counts["audit"] = (f"{audit.get('status')} {audit.get('divergences') or ''}"
                                       f" {audit.get('reason') or ''}".strip())
                found.append(f"{row.nodes}n {row.nemesis} seed {report['verdict']['seed']}: "
                             f"{counts}; replay: {report.get('replay', '?')}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="results directory")
    parser.add_argument("--nemesis", default=",".join(MATRIX), metavar="LIST",
                        help="comma-separated nemesis names (default: the whole matrix)")
    parser.add_argument("--trials3", type=int, default=5, help="trials on 3 nodes (default 5)")
    parser.add_argument("--trials5", type=int, default=2, help="trials on 5 nodes (default 2)")
    parser.add_argument("--duration", type=float, default=60.0, metavar="S")
    parser.add_argument("--rate", type=float, default=200.0, metavar="R")
    parser.add_argument("--no-audit", dest="audit", action="store_false",
                        help="passed on to every trial: no audit at the end of it")
    parser.add_argument("--table", action="store_true", help="only print the table")
    parser.add_argument("--md", action="store_true", help="the table in Markdown")
    args = parser.parse_args(argv)
    nemeses = [name.strip() for name in args.nemesis.split(",") if name.strip()]
    unknown = [name for name in nemeses if name != "none" and name not in NEMESES]
    if unknown:
        parser.error(f"unknown nemesis {', '.join(unknown)}; known: none, {', '.join(NEMESES)}")
    if not args.table:
        args.out.mkdir(parents=True, exist_ok=True)
        try:
            run_matrix(args.out, nemeses, plan(args.trials3, args.trials5),
                       duration_s=args.duration, rate=args.rate, audit=args.audit)
        except KeyboardInterrupt:
            print("interrupted; run again to go on", file=sys.stderr)
    rows = collect(args.out, nemeses)
    print_table(rows, markdown=args.md)
    found = failures(rows)
    for line in found:
        print("FAILED", line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
