"""Pytest plugin with the multi-process cluster fixtures (raftlog.chaos.cluster).

Registered from tests/conftest.py: `pytest_plugins = ["tests.conftest_cluster"]`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlog.chaos.cluster import LocalCluster


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[LocalCluster]:
    """Three nodes in one Raft group with a leader that sees all three; stopped (by pid)
    after the test, whatever it did to them."""
    cluster = LocalCluster(tmp_path / "cluster", nodes=3)
    try:
        yield cluster.start_all()
    finally:
        cluster.stop_all()
