"""scripts/bench_report.py: repeated runs become medians, and each figure's spread is reported
against issue 17's target (under 20 % between runs)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests import bench_scripts


@pytest.fixture(scope="module")
def br() -> ModuleType:
    return bench_scripts.load("bench_report")


def _phase(msgs_per_s: float, p50_ms: float = 1.0, p99_ms: float = 2.0) -> dict[str, Any]:
    return {"msgs_per_s": msgs_per_s, "p50_ms": p50_ms, "p99_ms": p99_ms, "error": None}


def _run(scale: float) -> dict[str, Any]:
    return {
        "unary_publish": {"callers_1": _phase(500 * scale, 1.5 * scale, 3.0 * scale),
                          "callers_8": _phase(1500 * scale)},
        "batch_publish": {"batch_100": {**_phase(20_000 * scale),
                                        "client_cpu_us_per_msg": 30 * scale,
                                        "server_cpu_us_per_msg": 90 * scale},
                          "batch_1000": _phase(40_000 * scale)},
        "stream_publish": _phase(8000 * scale),
        "frames_publish": _phase(15_000 * scale),
        "fetch_ack": {"batch_100": {**_phase(7000 * scale), "ack_calls_in_flight": 32},
                      "batch_1000": {**_phase(30_000 * scale), "ack_calls_in_flight": 32}},
        "fetch_carried": {"batch_100": _phase(9000 * scale),
                          "batch_1000": _phase(32_000 * scale)},
    }


def test_repeated_runs_become_medians_with_their_spread(br: ModuleType) -> None:
    runs = [_run(1.0), _run(1.3), _run(0.9)]
    merged, spread = br.merge_runs(runs)
    assert merged["batch_publish"]["batch_100"]["msgs_per_s"] == 20_000
    assert merged["unary_publish"]["callers_1"]["p50_ms"] == 1.5
    assert merged["unary_publish"]["callers_1"]["p99_ms"] == 3.0
    item = spread["fetch_ack_100_msgs_per_s"]
    assert item["values"] == [7000, 9100, 6300] and item["median"] == 7000
    assert item["spread"] == pytest.approx(0.4) and item["met"] is False
    assert set(spread) == {name for name, _ in br.SPREAD_FIGURES}
    batch = spread["batch_100_msgs_per_s"]  # beside it, the machine's speed: the client's CPU
    assert batch["client_cpu_us_per_msg"] == [30, 39, 27]
    assert batch["client_cpu_spread"] == pytest.approx(0.4)
    assert spread["batch_1000_msgs_per_s"]["client_cpu_spread"] is None  # not measured
    assert runs[0]["unary_publish"]["callers_1"]["p50_ms"] == 1.5  # runs are not changed


def test_close_runs_meet_the_spread_target(br: ModuleType) -> None:
    _, spread = br.merge_runs([_run(1.0), _run(1.05)])
    assert all(item["met"] for item in spread.values())


def test_one_run_has_no_spread_and_the_table_leaves_it_out(br: ModuleType) -> None:
    merged, spread = br.merge_runs([_run(1.0)])
    assert merged == _run(1.0)
    assert all(item["spread"] is None and item["met"] is None for item in spread.values())
    document = {"raftlog": merged, "spread": spread, "jetstream": None, "targets": {},
                "meta": {"replicas": 3, "payload_bytes": 128, "repeat": 1}}
    text = br.table(document)
    assert "spread over" not in text
    assert "fetch(100) + ack, 32 Ack calls in flight" in text  # the loop's depth is shown
    assert "fetch(1000) + ack, 32 Ack calls in flight" in text
    merged, spread = br.merge_runs([_run(1.0), _run(1.5)])
    document.update(raftlog=merged, spread=spread, meta={**document["meta"], "repeat": 2})
    text = br.table(document)
    assert "spread over 2 runs" in text and "NO" in text
    assert "client CPU/msg spread" in text
