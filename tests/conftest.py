"""Shared fixtures: real node processes on loopback, cleaned up after each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftlog.v1 import consumers_pb2_grpc, streams_pb2_grpc
from tests.nodeproc import NodeProcess

pytest_plugins = ["tests.conftest_cluster"]


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
