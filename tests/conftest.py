"""Shared fixtures (real node processes on loopback, cleaned up after each test) and the cost
markers: every test under tests/unit, tests/engine, tests/process or tests/audit gets the marker
`unit`, `engine`, `process` or `spark` from its directory, so `scripts/test -m unit` selects by
cost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftlog.chaos.nodeproc import NodeProcess
from raftlog.v1 import consumers_pb2_grpc, streams_pb2_grpc

pytest_plugins = ["tests.conftest_cluster"]

# tests/<directory>/ -> the marker its tests get (registered in pyproject.toml).
COST_MARKERS = {"unit": "unit", "engine": "engine", "process": "process", "audit": "spark"}
TESTS_DIR = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            relative = item.path.resolve().relative_to(TESTS_DIR)
        except ValueError:
            continue
        if len(relative.parts) > 1 and relative.parts[0] in COST_MARKERS:
            item.add_marker(COST_MARKERS[relative.parts[0]])


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


# Per node of a failed test's cluster: whether its process still runs, and its log's end.
failure_log_tail_chars = 4_000


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that used a LocalCluster gets a "raftlog nodes" report section: each
    node's pid, whether it is alive (or its exit code) and the end of its log, so a CI
    failure says whether a node died under the test and why."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when != "call" or not report.failed:
        return
    from raftlog.chaos.cluster import LocalCluster

    funcargs = getattr(item, "funcargs", {})
    lines: list[str] = []
    for name, value in funcargs.items():
        if not isinstance(value, LocalCluster):
            continue
        for i, node in sorted(value.nodes.items()):
            process = node.process
            code = process.poll() if process is not None else None
            state = "running" if code is None else f"exited with {code}"
            lines.append(f"--- {name} n{i} (pid {node.pid}, {state}, "
                         f"{'in' if i in value.running else 'not in'} running) ---")
            lines.append(node.log_tail()[-failure_log_tail_chars:])
    if lines:
        report.sections.append(("raftlog nodes", "\n".join(lines)))
