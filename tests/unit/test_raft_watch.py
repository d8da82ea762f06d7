"""A node without a metadata leader says so in its log, with what it sees (node/cluster/
raft_watch.py)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import pytest

from raftlog.node.cluster.raft_watch import leaderless_report, warn_while_leaderless
from raftlog.raft.api import GroupStatus, PeerStatus

LEADERLESS = GroupStatus(
    self_address="127.0.0.1:2", term=7, is_leader=False, leader=None, commit_index=0,
    applied_index=3, log_entries=3, has_quorum=False, ready=False,
    peers=(PeerStatus("127.0.0.1:1", connected=True), PeerStatus("127.0.0.1:3", connected=False)),
    journal={"refused_frames": 4, "events_dropped": 0})


def test_the_report_names_the_term_each_peer_and_the_refused_frames() -> None:
    line = leaderless_report(LEADERLESS, 12.3)
    assert "no leader for 12 s" in line and "term 7" in line
    assert "127.0.0.1:1 connected" in line and "127.0.0.1:3 not connected" in line
    assert "refused_frames 4" in line and "events_dropped" not in line
    assert "stopped" not in leaderless_report(LEADERLESS, 1)
    assert "stopped: disk" in leaderless_report(replace(LEADERLESS, failure="disk"), 1)


def test_a_warning_each_period_without_a_leader_and_a_line_when_one_is_back(
        caplog: pytest.LogCaptureFixture) -> None:
    answers = [LEADERLESS, LEADERLESS, replace(LEADERLESS, leader="127.0.0.1:1"),
               replace(LEADERLESS, leader="127.0.0.1:1")]

    def status() -> GroupStatus:
        return answers.pop(0) if len(answers) > 1 else answers[0]

    async def main() -> None:
        task = asyncio.create_task(warn_while_leaderless(status, period_s=0.01))
        while len(answers) > 1:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        task.cancel()

    with caplog.at_level(logging.INFO, logger="raftlog.node.cluster.raft_watch"):
        asyncio.run(main())
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "term 7" in warnings[0].getMessage()
    back = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(back) == 1 and "127.0.0.1:1 is back" in back[0]
