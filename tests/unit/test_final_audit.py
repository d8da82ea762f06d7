"""The audit at the end of a chaos run (chaos/final_audit.py): how an outcome of the audit's
processes (exit status or a timeout, its report.json, stderr) becomes the run report's `audit`
section, and that a run whose audit is not clean is not ok.

Pure: reports are dicts in the shape of audit/report.py's `report_json`, nothing runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raftlog.chaos.checks.availability import measure_availability
from raftlog.chaos.checks.verdict import Verdict
from raftlog.chaos.final_audit import AuditSection, AuditStatus, audit_section, skipped
from raftlog.chaos.hosts_run import inside_argv
from raftlog.chaos.run import RunConfig, RunResult

OUT = Path("/runs/r1/audit")
CLEAN_VERDICT = Verdict(anomalies=(), acknowledged=10, availability=measure_availability([]))


def report(*divergences: dict[str, Any]) -> dict[str, Any]:
    nodes = [{"node": node, "applied_index": 345} for node in ("n1", "n2", "n3")]
    return {"format": "raftlog-audit-report", "version": 1, "clean": not divergences,
            "inputs": {"nodes": nodes}, "divergences": list(divergences)}


def divergence(cls: str, node: str, first: int | None = None, last: int | None = None,
               **more: Any) -> dict[str, Any]:
    return {"stream": "chaos", "node": node, "class": cls, "first_seq": first,
            "last_seq": last, **more}


def section(exit_code: int | None, document: dict[str, Any] | None, *, step: str = "audit",
            stderr: str = "") -> AuditSection:
    return audit_section(step=step, exit_code=exit_code, report=document, out_dir=OUT,
                         elapsed_s=31.5, stderr=stderr, timeout_s=300.0)


def result(audit: AuditSection) -> RunResult:
    return RunResult(config=RunConfig(workdir=Path("/runs/r1")), verdict=CLEAN_VERDICT,
                     audit=audit)


def test_a_clean_audit_names_its_report_and_leaves_the_run_ok() -> None:
    clean = section(0, report())
    assert clean.status is AuditStatus.CLEAN and clean.ok and clean.divergences == {}
    assert clean.report_html == str(OUT / "report.html")
    assert clean.report_json == str(OUT / "report.json")
    assert clean.applied_index == {"n1": 345, "n2": 345, "n3": 345}
    run = result(clean)
    assert run.ok
    assert run.to_dict()["audit"]["status"] == "clean" and run.to_dict()["ok"]


def test_divergences_make_the_run_not_ok_and_are_counted_per_class() -> None:
    found = section(1, report(divergence("HOLE", "n2", 10, 14),
                              divergence("HOLE", "n3", 7, 7),
                              divergence("CONSUMER", "n3", consumer="auditor", holder="raft"),
                              divergence("META_VIEW", "n1")))
    assert found.status is AuditStatus.DIVERGENT and not found.ok
    assert found.divergences == {"CONSUMER": 1, "HOLE": 2, "META_VIEW": 1}
    assert found.examples == ("HOLE 10-14 on n2 of chaos", "HOLE 7 on n3 of chaos",
                              "CONSUMER auditor (raft) on n3 of chaos", "META_VIEW on n1 of chaos")
    run = result(found)
    assert run.verdict.ok and not run.ok
    written = run.to_dict()
    assert not written["ok"]
    assert written["audit"]["status"] == "divergent"
    assert written["audit"]["divergences"] == {"CONSUMER": 1, "HOLE": 2, "META_VIEW": 1}
    assert "divergent (CONSUMER 1, HOLE 2, META_VIEW 1)" in found.summary()


def test_bad_input_quotes_the_audits_reason() -> None:
    bad = section(2, None, stderr="WARNING: jdk\nraftlog audit: bad input: /x: empty export\n")
    assert bad.status is AuditStatus.BAD_INPUT and not bad.ok and not result(bad).ok
    assert bad.reason == "raftlog audit: bad input: /x: empty export"
    assert "empty export" in bad.stderr_tail


@pytest.mark.parametrize(("step", "exit_code", "document", "reason"), [
    ("audit", None, None, "audit still running after the audit's 300 s: killed"),
    ("export n2", None, None, "export n2 still running after the audit's 300 s: killed"),
    ("export n2", 1, None, "export n2 exited with status 1"),
    ("audit", 1, None, "audit exited with status 1 and wrote no report.json"),  # a traceback
    ("audit", -9, None, "audit exited with status -9"),
    ("audit", 0, report(divergence("HOLE", "n2", 1, 1)),
     "audit exited with status 0 but its report says 1 divergences"),
    ("audit", 1, report(), "audit exited with status 1 but its report says clean"),
    ("audit", 0, {"format": "something else"},
     "report.json is not an audit report (format 'something else')"),
])
def test_a_failed_step_fails_the_audit_with_its_reason_and_stderr(
        step: str, exit_code: int | None, document: dict[str, Any] | None, reason: str) -> None:
    stderr = "".join(f"line {k}\n" for k in range(100))
    failed = section(exit_code, document, step=step, stderr=stderr)
    assert failed.status is AuditStatus.FAILED and not failed.ok and not result(failed).ok
    assert failed.reason == reason
    assert failed.stderr_tail.splitlines() == [f"line {k}" for k in range(80, 100)]
    assert failed.to_dict()["stderr_tail"] == failed.stderr_tail


def test_a_skipped_audit_is_said_so_and_leaves_the_run_ok() -> None:
    run = result(skipped())
    assert run.ok
    assert run.to_dict()["audit"]["status"] == "skipped"
    assert skipped().summary() == "audit: skipped\n  --no-audit"


def test_the_hosts_mode_inside_run_repeats_no_audit() -> None:
    config = RunConfig(workdir=Path("/runs/r1"), nemeses=("kill-primary",), seed=3, hosts=True,
                       audit=False)
    assert inside_argv(config, json_out=False)[-1] == "--no-audit"
    assert "--no-audit" not in inside_argv(RunConfig(workdir=Path("/r"), hosts=True),
                                           json_out=False)
