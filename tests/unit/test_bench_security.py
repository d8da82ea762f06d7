"""The pure helpers of scripts/bench_security.py: the ratios to plaintext and the turns."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests import bench_scripts


@pytest.fixture(scope="module")
def bs() -> ModuleType:
    return bench_scripts.load("bench_security")


def test_ratios_divide_each_configuration_by_plaintext_phase_by_phase(bs: ModuleType) -> None:
    rows = {"plaintext": {"publish unary": {"msgs_per_s": 200.0},
                          "fetch+ack batch": {"msgs_per_s": 0.0}},
            "tls": {"publish unary": {"msgs_per_s": 150.0},
                    "fetch+ack batch": {"msgs_per_s": 10.0},
                    "publish batch": {"msgs_per_s": 10.0}}}
    assert bs.ratios(rows) == {"tls": {"publish unary": 0.75}}


def test_each_round_starts_with_another_configuration(bs: ModuleType) -> None:
    configs = ["plaintext", "tls", "metrics"]
    assert [bs.rotated(configs, r)[0] for r in range(4)] == [
        "plaintext", "tls", "metrics", "plaintext"]
    assert sorted(bs.rotated(configs, 2)) == sorted(configs)


def test_the_table_gives_each_configuration_a_ratio_to_plaintext(bs: ModuleType) -> None:
    row = {"msgs_per_s": 100.0, "p50_ms": 1.0, "p99_ms": 2.0}
    results = {name: {"publish unary": row} for name in bs.CONFIGS}
    document = {"results": results, "ratios": bs.ratios(results)}
    text = bs.table(document)
    assert all(f"{name} ratio" in text for name in bs.CONFIGS if name != bs.BASELINE)
    assert "auth" in bs.CONFIGS and "n/m" not in text
