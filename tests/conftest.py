"""Shared fixtures (real node processes on loopback, cleaned up after each test) and the cost
markers: every test under tests/unit, tests/engine or tests/process gets the marker `unit`,
`engine` or `process` from its directory, so `scripts/test -m unit` selects by cost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftlog.chaos.nodeproc import NodeProcess
from raftlog.v1 import consumers_pb2_grpc, streams_pb2_grpc

pytest_plugins = ["tests.conftest_cluster"]

# tests/<directory>/ -> the marker its tests get (registered in pyproject.toml).
COST_MARKERS = ("unit", "engine", "process")
TESTS_DIR = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            relative = item.path.resolve().relative_to(TESTS_DIR)
        except ValueError:
            continue
        if len(relative.parts) > 1 and relative.parts[0] in COST_MARKERS:
            item.add_marker(relative.parts[0])


@pytest.fixture
def node_proc(tmp_path: Path) -> Iterator[NodeProcess]:
    node = NodeProcess(tmp_path / "node1").start()
    try:
        yield node
    finally:
        node.cleanup()


class Clients:
    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.streams = streams_pb2_grpc.StreamsStub(channel)
        self.consumers = consumers_pb2_grpc.ConsumersStub(channel)


@pytest.fixture
def clients(node_proc: NodeProcess) -> Iterator[Clients]:
    with node_proc.channel() as channel:
        yield Clients(channel)
