"""Issue 17, item 4: `scripts/bench-scale` on real 3-node clusters, with tiny settings.

The test runs the benchmark's own `run` (the code `scripts/bench-scale` measures with) for 1 and
4 streams and holds its document to the shape the docs describe: every phase acknowledged
messages without a failure, the primaries of 4 streams landed on every node, and every node did
work in every phase (a follower that replicates nothing, or a phase that moved nothing, fails).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from raftlog.node.cluster.ring import Ring
from tests import bench_scripts

counts = [1, 4]
phase_s = 1.5
idle_s = 0.5
test_timeout_s = 60  # two clusters started one after the other; about 25 s on a quiet machine


def _bench() -> ModuleType:
    return bench_scripts.load("bench_scale")


def _check_phase(name: str, phase: dict[str, Any], node_ids: set[str]) -> None:
    assert not phase["failed"] and phase["failed_msgs"] == 0, f"{name}: {phase['error']}"
    assert phase["msgs"] > 0 and phase["calls"] > 0 and phase["msgs_per_s"] > 0, (name, phase)
    assert 0 < phase["p50_ms"] <= phase["p99_ms"], (name, phase)
    assert set(phase["cpu_cores"]) == node_ids, (name, phase)
    idle_nodes = [n for n, cores in phase["cpu_cores"].items() if cores <= 0]
    assert not idle_nodes, f"{name}: nodes {idle_nodes} did no work: {phase['cpu_cores']}"
    assert phase["cores_busy"] > 0 and all(mib > 0 for mib in phase["rss_mib"].values())


def _check_run(run: dict[str, Any]) -> None:
    node_ids = set(run["primaries"])
    assert len(node_ids) == 3 and sum(run["primaries"].values()) == run["streams"], run
    if run["streams"] >= 3:
        assert min(run["primaries"].values()) >= 1, f"a node leads nothing: {run['primaries']}"
    assert set(run["idle"]["cpu_cores"]) == node_ids
    memory = run["memory"]
    for key in ("rss_mib_before", "rss_mib_streams", "rss_mib_consumers"):
        assert set(memory[key]) == node_ids and all(mib > 0 for mib in memory[key].values())
    assert isinstance(memory["kib_per_stream_copy"], float)
    assert isinstance(memory["kib_per_consumer"], float)
    _check_phase(f"{run['streams']} streams, publish", run["publish"], node_ids)
    _check_phase(f"{run['streams']} streams, fetch+ack", run["fetch_ack"], node_ids)
    assert run["fetch_ack"]["msgs"] <= run["publish"]["msgs"], run


@pytest.mark.timeout(test_timeout_s)
def test_every_phase_moves_messages_on_every_node() -> None:
    bench = _bench()
    document = bench.run(counts, bench.Settings(seconds=phase_s, idle_s=idle_s))
    assert document["schema"] == "raftlog-bench-scale/1"
    assert document["meta"]["streams"] == counts and document["meta"]["fresh_cluster_per_count"]
    assert [run["streams"] for run in document["runs"]] == counts
    assert document["failed"] == []
    for run in document["runs"]:
        _check_run(run)
    assert "FAILED" not in bench.table(document)


def test_names_are_picked_so_the_primaries_spread_over_the_nodes() -> None:
    node_ids = ["n1", "n2", "n3"]
    ring = Ring(node_ids)
    for count, spread in ((1, [1, 0, 0]), (10, [4, 3, 3]), (100, [34, 33, 33])):
        names = _bench().pick_names(node_ids, count)
        assert len(set(names)) == count
        assert [sum(ring.owner(name) == n for name in names) for n in node_ids] == spread
