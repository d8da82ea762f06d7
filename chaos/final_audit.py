"""The audit at the end of a chaos run: once the healed cluster's nodes are stopped, every
member's data directory is exported offline into WORKDIR/audit/export/<node> and `raftlog audit
run` (Spark, `local[2]`) audits the export into WORKDIR/audit/ (report.json, report.html,
plan.json; its summary table in summary.txt, each step's stderr in a .log file beside them).

The audit runs as processes (`python -m raftlog.audit ...`): nothing under chaos/ imports
raftlog.audit (tests/unit/layers.py). The exit codes and the report's fields used here are the
audit CLI's (audit/cli_export.py, audit/cli_run.py, audit/report.py).

- `run_audit` does the I/O. The whole step (the exports and the audit) is bounded by
  `audit_timeout_s`; each child runs in a session of its own, so on overrun (or Ctrl-C) its
  process group (the child and the JVM it started) is killed, and nothing else.
- `audit_section` is pure: a step's outcome (exit code or a timeout, the parsed report.json,
  stderr) in, the run report's `audit` section out. A run whose audit did not come back clean
  is not ok.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

audit_timeout_s = 300.0  # the exports and the audit together (a Spark start is 10-20 s here)
kill_wait_s = 10.0  # after SIGKILL of an overrunning step's process group
stderr_tail_lines_max = 20  # of a step that failed, quoted in the report
examples_max = 5  # divergences named in the section (report.json has every one)
spark_master = "local[2]"

# audit/cli_run.py's exit statuses (`raftlog audit run`); `raftlog audit export` exits 0 when
# the node was exported.
EXIT_CLEAN = 0
EXIT_DIVERGENT = 1
EXIT_BAD_INPUT = 2
REPORT_FORMAT = "raftlog-audit-report"  # audit/report.py's REPORT_FORMAT


class AuditStatus(enum.StrEnum):
    CLEAN = "clean"
    DIVERGENT = "divergent"
    BAD_INPUT = "bad input"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class AuditSection:
    """The run report's `audit` section. `divergences`: class -> count (classes found only);
    `reason`: why the status is not clean, in a line; `stderr_tail`: the failed step's."""

    status: AuditStatus
    elapsed_s: float = 0.0
    divergences: dict[str, int] = field(default_factory=dict)
    examples: tuple[str, ...] = ()
    report_json: str = ""
    report_html: str = ""
    applied_index: dict[str, int] = field(default_factory=dict)  # of each export's Raft view
    reason: str = ""
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in (AuditStatus.CLEAN, AuditStatus.SKIPPED)

    def to_dict(self) -> dict[str, Any]:
        return {"status": str(self.status), "ok": self.ok, "elapsed_s": round(self.elapsed_s, 3),
                "divergences": dict(self.divergences), "examples": list(self.examples),
                "report_json": self.report_json or None, "report_html": self.report_html or None,
                "applied_index": dict(self.applied_index), "reason": self.reason or None,
                "stderr_tail": self.stderr_tail or None}

    def summary(self) -> str:
        """A few lines for the terminal and the timeline page."""
        head = f"audit: {self.status}"
        if self.divergences:
            head += " (" + ", ".join(f"{name} {count}" for name, count
                                     in self.divergences.items()) + ")"
        if self.status is not AuditStatus.SKIPPED:
            head += f" in {self.elapsed_s:.1f} s"
        lines = [head]
        if self.reason:
            lines.append(f"  {self.reason}")
        lines += [f"  {example}" for example in self.examples]
        if self.report_html:
            lines.append(f"  report: {self.report_html} (.json: {self.report_json})")
        if self.stderr_tail:
            lines += ["  stderr (tail):", *(f"    {line}" for line in
                                            self.stderr_tail.splitlines())]
        return "\n".join(lines)


def skipped() -> AuditSection:
    return AuditSection(AuditStatus.SKIPPED, reason="--no-audit")


def audit_section(*, step: str, exit_code: int | None, report: Mapping[str, Any] | None,
                  out_dir: Path, elapsed_s: float, stderr: str = "",
                  timeout_s: float = audit_timeout_s) -> AuditSection:
    """The section for a step's outcome. `step`: "export n2" or "audit"; `exit_code`: None when
    the step overran the audit's `timeout_s` and was killed; `report`: the audit's report.json
    (None when there is none)."""
    tail = _tail(stderr)
    if exit_code is None:
        return AuditSection(AuditStatus.FAILED, elapsed_s, stderr_tail=tail,
                            reason=f"{step} still running after the audit's {timeout_s:g} s: "
                            "killed")
    if step != "audit" and exit_code != 0:
        return AuditSection(AuditStatus.FAILED, elapsed_s, stderr_tail=tail,
                            reason=f"{step} exited with status {exit_code}")
    if exit_code == EXIT_BAD_INPUT:
        return AuditSection(AuditStatus.BAD_INPUT, elapsed_s, stderr_tail=tail,
                            reason=_last_line(stderr) or "the audit refused the export")
    if exit_code not in (EXIT_CLEAN, EXIT_DIVERGENT):
        return AuditSection(AuditStatus.FAILED, elapsed_s, stderr_tail=tail,
                            reason=f"audit exited with status {exit_code}")
    problem = _report_problem(report, exit_code)
    if problem is not None or report is None:
        return AuditSection(AuditStatus.FAILED, elapsed_s, stderr_tail=tail,
                            reason=problem or "no report")
    return _from_report(report, out_dir=out_dir, elapsed_s=elapsed_s)


def _report_problem(report: Mapping[str, Any] | None, exit_code: int) -> str | None:
    """Why the report does not back the exit code (None: it does). An uncaught exception also
    exits 1, so "divergent" needs a report that lists divergences."""
    if report is None:
        return f"audit exited with status {exit_code} and wrote no report.json"
    if report.get("format") != REPORT_FORMAT:
        return f"report.json is not an audit report (format {report.get('format')!r})"
    divergences = report.get("divergences")
    if not isinstance(divergences, list):
        return "report.json has no divergences list"
    clean = bool(report.get("clean")) and not divergences
    if clean != (exit_code == EXIT_CLEAN):
        return (f"audit exited with status {exit_code} but its report says "
                f"{'clean' if clean else f'{len(divergences)} divergences'}")
    return None


def _from_report(report: Mapping[str, Any], *, out_dir: Path, elapsed_s: float
                 ) -> AuditSection:
    found: list[Mapping[str, Any]] = report["divergences"]
    counts = Counter(str(item.get("class")) for item in found)
    applied = {str(node.get("node")): int(node.get("applied_index") or 0)
               for node in report.get("inputs", {}).get("nodes", [])}
    return AuditSection(
        AuditStatus.DIVERGENT if found else AuditStatus.CLEAN, elapsed_s,
        divergences=dict(sorted(counts.items())),
        examples=tuple(_label(item) for item in found[:examples_max]),
        report_json=str(out_dir / "report.json"), report_html=str(out_dir / "report.html"),
        applied_index=applied)


def _label(item: Mapping[str, Any]) -> str:
    """E.g. "HOLE 2-6 on n2 of chaos", as audit/divergence.py labels one."""
    first, last = item.get("first_seq"), item.get("last_seq")
    span = "" if first is None else str(first) if first == last else f"{first}-{last}"
    what = " ".join(part for part in (str(item.get("class")), span) if part)
    if item.get("consumer") is not None:
        what += f" {item['consumer']} ({item.get('holder')})"
    return f"{what} on {item.get('node')} of {item.get('stream')}"


def _tail(text: str) -> str:
    return "\n".join(text.rstrip().splitlines()[-stderr_tail_lines_max:])


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


# -- I/O ------------------------------------------------------------------------------------


def run_audit(members: Sequence[tuple[str, Path]], out_dir: Path, *,
              timeout_s: float = audit_timeout_s,
              progress: Callable[[str], None] = print) -> AuditSection:
    """Exports each (node id, stopped data directory) of `members` offline into
    `out_dir`/export and audits it into `out_dir` (emptied first), all within `timeout_s`.
    A step that cannot start (OSError) fails the audit, not the run."""
    began = time.monotonic()
    try:
        return _exports_and_audit(members, out_dir, began=began, timeout_s=timeout_s,
                                  progress=progress)
    except OSError as error:
        return AuditSection(AuditStatus.FAILED, time.monotonic() - began,
                            reason=f"the audit could not run: {error}")


def _exports_and_audit(members: Sequence[tuple[str, Path]], out_dir: Path, *, began: float,
                       timeout_s: float, progress: Callable[[str], None]) -> AuditSection:
    deadline = began + timeout_s
    shutil.rmtree(out_dir, ignore_errors=True)
    export_dir = out_dir / "export"
    export_dir.mkdir(parents=True)
    audit = [sys.executable, "-m", "raftlog.audit"]
    for node, data_dir in members:
        step = f"export {node}"
        code, stderr = _run_step(
            [*audit, "export", "--data-dir", str(data_dir), "--node-id", node,
             "--out", str(export_dir)], out_dir=out_dir, name=f"export-{node}", deadline=deadline)
        if code != 0:
            return audit_section(step=step, exit_code=code, report=None, out_dir=out_dir,
                                 elapsed_s=time.monotonic() - began, stderr=stderr,
                                 timeout_s=timeout_s)
    progress(f"audit: {len(members)} nodes exported in {time.monotonic() - began:.1f} s; "
             f"auditing with Spark ({spark_master})")
    code, stderr = _run_step(
        [*audit, "run", "--input", str(export_dir), "--master", spark_master, "--quiet",
         "--out", str(out_dir)], out_dir=out_dir, name="audit", deadline=deadline,
        stdout_name="summary.txt")
    return audit_section(step="audit", exit_code=code, report=_read_report(out_dir),
                         out_dir=out_dir, elapsed_s=time.monotonic() - began, stderr=stderr,
                         timeout_s=timeout_s)


def _read_report(out_dir: Path) -> dict[str, Any] | None:
    try:
        document = json.loads((out_dir / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def _run_step(argv: list[str], *, out_dir: Path, name: str, deadline: float,
              stdout_name: str | None = None) -> tuple[int | None, str]:
    """Runs one child until it exits or `deadline` (time.monotonic()) passes; returns its exit
    status (None: overran, its process group killed) and its stderr (from out_dir/NAME.log)."""
    log_path = out_dir / f"{name}.log"
    stdout_path = out_dir / (stdout_name or f"{name}.out")
    with open(stdout_path, "wb") as stdout, open(log_path, "wb") as stderr:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                 start_new_session=True)
        try:
            code: int | None = child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(child)
            code = None
        except BaseException:
            _kill_group(child)
            raise
    return code, log_path.read_text(encoding="utf-8", errors="replace")


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the child's own process group (start_new_session: its id is the child's pid,
    which stays ours until the child is reaped below), then reaps the child."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=kill_wait_s)
