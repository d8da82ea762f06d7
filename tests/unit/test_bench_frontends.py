"""The pure helpers of scripts/bench_frontends.py: the p99 index and the front-end ratios."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests import bench_scripts


@pytest.fixture(scope="module")
def bf() -> ModuleType:
    return bench_scripts.load("bench_frontends")


def test_nearest_rank_picks_the_sample_at_the_quantile(bf: ModuleType) -> None:
    assert [bf.nearest_rank(n, 0.99) for n in (1, 2, 20, 100, 101)] == [0, 1, 19, 98, 99]
    assert bf.nearest_rank(4, 0.5) == 1


def test_summary_p99_is_never_below_p50(bf: ModuleType) -> None:
    row = bf.summary([0.001, 0.003], messages=200, elapsed_s=0.004)
    assert (row["msgs_per_s"], row["p50_ms"], row["p99_ms"]) == (50_000.0, 2.0, 3.0)


def test_ratios_divide_by_the_named_baseline_phase_by_phase(bf: ModuleType) -> None:
    rows = {"v1 topic": {"produce unary": {"msgs_per_s": 200.0},
                         "consume batch": {"msgs_per_s": 0.0}},
            "Kafka-Pixy": {"produce unary": {"msgs_per_s": 150.0},
                           "consume unary": {"msgs_per_s": 10.0}},
            "RocketMQ v2": {"consume batch": {"msgs_per_s": 30.0}},
            "RocketMQ v1": {"produce unary": {"msgs_per_s": 50.0},
                            "consume batch": {"msgs_per_s": 5.0}}}
    got = bf.ratios(rows)
    assert got["Kafka-Pixy"] == {"produce unary": 0.75}  # no baseline for consume unary
    assert got["RocketMQ v2"] == {}  # a zero baseline gives no ratio
    assert got["RocketMQ v1"] == {"produce unary": 0.25}  # divided by "v1 topic" too
    assert got["Waymaker"] == {} and got["Numaflow"] == {}


def test_every_front_end_row_has_a_baseline_the_run_measures(bf: ModuleType) -> None:
    assert bf.BASELINE["RocketMQ v1"] == bf.BASELINE["RocketMQ v2"] == "v1 topic"
    assert set(bf.BASELINE.values()) == {"v1 stream", "v1 topic"}
