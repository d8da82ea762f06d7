"""`raftlog chaos run` end to end: a 3-node cluster with a Toxiproxy proxy on every link, the
workload through random nodes, faults from a seeded schedule, then heal and every check.

The default suite runs one short run with kills and partitions of the primary; `-m chaos` runs
each nemesis on its own for 60 s (the issue's trials)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from raftlog.chaos.nemesis import NEMESES
from raftlog.chaos.powerfs import ensure_fuse
from raftlog.chaos.run import RunConfig, run_chaos

short_duration_s = 45.0
power_duration_s = 35.0
trial_duration_s = 60.0


def test_a_short_run_with_kills_and_partitions_loses_nothing(tmp_path: Path) -> None:
    result = run_chaos(RunConfig(workdir=tmp_path, nodes=3, duration_s=short_duration_s,
                                 nemeses=("kill-primary", "partition-primary", "bridge",
                                          "join-leave"),
                                 rate_per_s=100, seed=11, fault_s=(3.0, 5.0),
                                 quiet_s=(2.0, 4.0)), progress=lambda line: None)
    report = json.loads((tmp_path / "report.json").read_text())
    assert result.ok, result.verdict.summary()
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
    assert "--seed 11" in result.replay_command()
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
                                 quiet_s=(2.0, 3.0)), progress=lambda line: None)
    assert result.ok, result.verdict.summary()
    assert result.acknowledged > 500
    assert len(result.faults) >= 3


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
