"""`raftlog chaos run` end to end: a 3-node cluster with a Toxiproxy proxy on every link, the
workload through random nodes, faults from a seeded schedule, then heal and every check.

The default suite runs one short run with kills and partitions of the primary, one with power
loss, and one short run with kills that ends with the audit of the healed cluster (offline
exports and a Spark job: the others skip it, `audit=False`, to spare a Spark start each);
`-m chaos` runs each nemesis on its own for 60 s (the issue's trials), each with its audit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raftlog.chaos.final_audit import AuditStatus, run_audit
from raftlog.chaos.nemesis import NEMESES
from raftlog.chaos.powerfs import ensure_fuse
from raftlog.chaos.run import RunConfig, run_chaos

# The short run's seed draws partition-primary, kill-primary, then join-leave, the last one
# due ~18 s into the schedule (its draws; the restarts between faults come on top, 5-7 s each
# on a loaded 2-core machine): 35 s leaves room for both. A new seed or window needs its
# schedule checked again (the faults in report.json).
short_seed, short_duration_s = 2611, 35.0
power_duration_s = 35.0
audited_duration_s = 10.0
trial_duration_s = 60.0


def test_a_short_run_with_kills_and_partitions_loses_nothing(tmp_path: Path) -> None:
    result = run_chaos(RunConfig(workdir=tmp_path, nodes=3, duration_s=short_duration_s,
                                 nemeses=("kill-primary", "partition-primary", "bridge",
                                          "join-leave"),
                                 rate_per_s=100, seed=short_seed, fault_s=(3.0, 5.0),
                                 quiet_s=(2.0, 4.0), audit=False), progress=lambda line: None)
    report = json.loads((tmp_path / "report.json").read_text())
    assert result.ok, result.verdict.summary()
    assert report["audit"]["status"] == "skipped" and not (tmp_path / "audit").exists()
    assert report["ok"] and report["verdict"]["lost"] == 0 and report["verdict"]["duplicate"] == 0
    assert result.acknowledged > 1_000
    assert len(result.faults) >= 3  # the schedule really broke things
    assert "join-leave" in {fault["name"] for fault in result.faults}
    # every acknowledgement names its primary and epoch: the primary changed, never twice in
    # one epoch
    assert report["verdict"]["failovers"] >= 2 and report["verdict"]["split-brain"] == 0
    # every node's copy, as served and as read from its disk once stopped, compared
    assert report["copies_compared"] == ["n1", "n1 (disk)", "n2", "n2 (disk)", "n3",
                                         "n3 (disk)"]
    history = (tmp_path / "history.jsonl").read_text().splitlines()
    assert any('"process":"nemesis"' in line for line in history)
    assert f"--seed {short_seed}" in result.replay_command()
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "kill-primary" in (tmp_path / "timeline.html").read_text()


def test_a_short_run_with_power_loss_and_a_full_disk_loses_nothing(tmp_path: Path) -> None:
    """Each node's data directory on the power-loss file system (chaos/powerfs): nodes killed
    and their unsynced writes dropped, a disk that fills up."""
    unusable = ensure_fuse()
    if unusable is not None:
        pytest.skip(f"FUSE is not usable here: {unusable}")
    result = run_chaos(RunConfig(workdir=tmp_path, nodes=3, duration_s=power_duration_s,
                                 nemeses=("power-loss-primary", "power-loss-node", "disk-full"),
                                 rate_per_s=100, seed=5, fault_s=(3.0, 5.0),
                                 quiet_s=(2.0, 3.0), audit=False), progress=lambda line: None)
    assert result.ok, result.verdict.summary()
    assert result.acknowledged > 500
    assert len(result.faults) >= 3


def test_a_short_run_with_kills_ends_with_a_clean_audit_of_the_healed_cluster(
        tmp_path: Path) -> None:
    """The nodes stop at one applied Raft index; every member's data directory is exported and
    audited with Spark; the audit's outcome is in the report and its pages in workdir/audit."""
    result = run_chaos(RunConfig(workdir=tmp_path, nodes=3, duration_s=audited_duration_s,
                                 nemeses=("kill-primary",), rate_per_s=100, seed=3,
                                 fault_s=(2.0, 4.0), quiet_s=(1.5, 3.0)),
                       progress=lambda line: None)
    report = json.loads((tmp_path / "report.json").read_text())
    audit = report["audit"]
    assert audit["status"] == "clean", result.audit.summary()
    assert result.ok and report["ok"], result.verdict.summary()
    assert result.faults, "the schedule killed nothing"
    settled = report["raft_before_stop"]
    assert settled["settled"] and settled["members"] == ["n1", "n2", "n3"]
    # the exports' metadata views are at the index every node had applied before the stop
    assert audit["applied_index"] == settled["applied_index"]
    assert len(set(audit["applied_index"].values())) == 1
    out = tmp_path / "audit"
    assert audit["report_html"] == str(out / "report.html")
    assert audit["report_json"] == str(out / "report.json")
    for name in ("report.json", "report.html", "plan.json"):
        assert (out / name).stat().st_size > 0, name
    audited = json.loads((out / "report.json").read_text())
    assert audited["clean"] and audited["divergences"] == []
    assert {node["node"]: node["source"] for node in audited["inputs"]["nodes"]} == {
        "n1": "offline", "n2": "offline", "n3": "offline"}
    # every copy of every acknowledged message was lined up
    assert audited["figures"]["message_rows"] >= 3 * result.acknowledged > 0
    assert 0 < audit["elapsed_s"] < result.elapsed_s
    assert "audit/report.html" in (tmp_path / "timeline.html").read_text()


def test_an_audit_step_that_overruns_its_bound_is_killed_and_fails_the_audit(
        tmp_path: Path) -> None:
    """The bound of final_audit.run_audit: the first export cannot even start in 50 ms; it is
    killed with its process group and the section says which step and why."""
    out = tmp_path / "audit"
    section = run_audit([("n1", tmp_path / "n1")], out, timeout_s=0.05,
                        progress=lambda line: None)
    assert section.status is AuditStatus.FAILED and not section.ok
    assert section.reason == "export n1 still running after the audit's 0.05 s: killed"
    assert section.elapsed_s < 15.0  # final_audit.kill_wait_s at most, beyond the bound
    left = [pid for pid in os.listdir("/proc") if pid.isdigit()
            and str(out).encode() in _cmdline(pid)]
    assert left == [], "a killed step left processes behind"


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_the_command_refuses_an_unknown_nemesis() -> None:
    done = subprocess.run([sys.executable, "-m", "raftlog.node.cli", "chaos", "run",
                           "--nemesis", "meteor"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "meteor" in done.stderr


@pytest.mark.chaos
@pytest.mark.parametrize("nemesis", sorted(NEMESES))
def test_each_nemesis_alone_loses_nothing(tmp_path: Path, nemesis: str) -> None:
    result = run_chaos(RunConfig(workdir=tmp_path, nodes=3, duration_s=trial_duration_s,
                                 nemeses=(nemesis,), rate_per_s=200, seed=hash(nemesis) % 1000),
                       progress=lambda line: None)
    assert result.ok, result.verdict.summary() + "\n" + result.replay_command()
