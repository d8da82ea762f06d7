"""Issue 17: scripts/bench_skeleton.py, the R3 skeleton `scripts/bench --replicas 3` measures
beside raftlog to say which targets any design on this stack can reach.

The process test runs its quick measurement (three processes, the load loops raftlog's
benchmark uses) and holds every phase to having moved all its messages without an error, with
the primary and both replicas working; the unit tests hold `compare` to its arithmetic.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests import bench_scripts

test_timeout_s = 120  # about 6 s on a quiet machine


@pytest.fixture(scope="module")
def skeleton() -> ModuleType:
    return bench_scripts.load("bench_skeleton")


@pytest.mark.timeout(test_timeout_s)
def test_the_quick_skeleton_moves_every_message_of_every_phase(skeleton: ModuleType) -> None:
    figures = skeleton.measure(quick=True)
    assert "error" not in figures, figures
    assert list(figures) == [name for name, *_ in skeleton.PHASES]
    for name, loop, _, _, quick_msgs in skeleton.PHASES:
        phase = figures[name]
        assert phase["error"] is None and phase["stopped_by"] == "count", (name, phase)
        assert phase["msgs"] == quick_msgs and phase["msgs_per_s"] > 0, (name, phase)
        primary, *replicas = phase["cores"]
        assert primary > 0, (name, phase)
        if loop in ("unary", "publish"):  # the replicas store every batch
            assert all(cores > 0 for cores in replicas), (name, phase)
    assert skeleton.table(figures).count("\n") == len(figures) + 1


def _figures(**msgs_per_s: float) -> dict[str, Any]:
    return {name: {"msgs_per_s": value, "server_cpu_us_per_msg": 10.0,
                   "client_cpu_us_per_msg": 2.0} for name, value in msgs_per_s.items()}


def test_compare_says_which_targets_the_skeleton_itself_reaches(skeleton: ModuleType) -> None:
    figures = _figures(batch_100=50_000, batch_1000=100_000, fetch_ack_100=40_000)
    raftlog = {"batch_publish": {"batch_100": {"msgs_per_s": 25_000}},
               "fetch_ack": {"batch_100": {"msgs_per_s": 30_000}}}
    js = {"publish_async_msgs_per_s": 20_000.0, "pull_consume_msgs_per_s": 10_000.0}
    out = skeleton.compare(figures, raftlog, js)
    assert set(out) == {"batch_100", "batch_1000", "fetch_ack_100"}
    assert out["batch_100"] == {"skeleton": 50_000, "jetstream": 20_000.0, "ratio": 2.5,
                                "target": 3.0, "reachable": False, "raftlog": 25_000.0,
                                "raftlog_share": 0.5}
    assert out["batch_1000"]["ratio"] == 5.0 and out["batch_1000"]["reachable"] is True
    assert out["batch_1000"]["raftlog"] is None and out["batch_1000"]["raftlog_share"] is None
    assert out["fetch_ack_100"]["reachable"] is True
    assert out["fetch_ack_100"]["raftlog_share"] == 0.75
    text = skeleton.table(figures, out)
    assert "2.50x" in text and "NO" in text and "50%" in text


def test_compare_holds_the_unary_p50_to_raftlogs_absolute_target(skeleton: ModuleType) -> None:
    raftlog = {"unary_publish": {"callers_1": {"p50_ms": 2.7}}}
    for p50, reachable in ((2.1, False), (1.3, True), (0.9, True)):
        figures = {"unary_1": {"msgs_per_s": 400.0, "p50_ms": p50}}
        out = skeleton.compare(figures, raftlog, None)
        assert out["unary_1"] == {"skeleton_p50_ms": p50, "target": "<= 1.3 ms",
                                  "reachable": reachable, "raftlog_p50_ms": 2.7}
        text = skeleton.table(figures, out)
        assert f"p50 {p50:.3f} ms" in text and "raftlog's p50 2.700 ms" in text
        assert ("reachable NO" in text) is not reachable


def test_compare_without_the_peer_or_with_a_failed_skeleton(skeleton: ModuleType) -> None:
    out = skeleton.compare(_figures(batch_100=50_000), None, None)
    assert out["batch_100"]["ratio"] is None and out["batch_100"]["reachable"] is None
    assert skeleton.compare({"error": "did not start"}, None, None) == {}
    assert skeleton.table({"error": "did not start"}) == "R3 skeleton: did not start"
