"""The layer contract (tests/unit/layers.py): every module under base/, raft/, node/, chaos/,
audit/ and scripts/*.py imports only what the package docstrings allow. Parsed with ast, nothing
imported.

The last tests run the same checker on a tiny tree with deliberate violations, to show that the
contract can fail and names what breaks it.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.layers import KNOWN_EXCEPTIONS, Violation, check, modules

ROOT = Path(__file__).resolve().parents[2]


def test_every_layer_imports_only_what_its_docstring_allows() -> None:
    violations = check(ROOT, exceptions=KNOWN_EXCEPTIONS)
    assert not violations, "layer violations:\n" + "\n".join(map(str, violations))


def test_every_known_exception_is_still_needed() -> None:
    used: set[tuple[str, str]] = set()
    check(ROOT, exceptions=KNOWN_EXCEPTIONS, used=used)
    assert set(KNOWN_EXCEPTIONS) - used == set(), "remove the exceptions that no longer apply"


def test_the_contract_covers_every_layer() -> None:
    names = {name for _, name in modules(ROOT)}
    for expected in ("raftlog.base.errors", "raftlog.raft.state", "raftlog.node.server",
                     "raftlog.node.engine.storage", "raftlog.node.cli.main",
                     "raftlog.chaos.cluster", "raftlog.audit.export", "scripts.bench"):
        assert expected in names


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_tree_with_violations_is_reported_exactly(tmp_path: Path) -> None:
    for package in ("base", "raft", "node", "node/engine", "node/cli", "node/cluster", "chaos"):
        write(tmp_path, f"{package}/__init__.py", '"""A package."""\n')
    write(tmp_path, "base/errors.py", "import enum\n")
    write(tmp_path, "raft/state.py",
          "from raftlog.base.errors import RaftlogError\n"
          "from raftlog.internal import raft_pb2\n")
    write(tmp_path, "raft/group.py",
          '"""Reaches into the node."""\n\n'
          "from raftlog.base import errors\n"
          "from raftlog.node.engine.stream import Stream\n")
    write(tmp_path, "node/engine/stream.py",
          "from raftlog.base import limits\n"
          "from raftlog.v1 import types_pb2\n"
          "from . import keys\n")
    write(tmp_path, "node/engine/keys.py", "import struct\n")
    write(tmp_path, "node/engine/streams.py",
          "import asyncio\n\n\n"
          "def serve() -> None:\n"
          "    import grpc\n")
    write(tmp_path, "node/cluster/ring.py", "from raftlog.node.engine import streams\n")
    write(tmp_path, "node/cli/main.py", "from raftlog.node.transport.rpc import from_rpc_error\n")
    write(tmp_path, "chaos/cluster.py", "from raftlog.node.cli import main\n")
    write(tmp_path, "scripts/bench.py", "from raftlog.chaos.cluster import LocalCluster\n")

    assert check(tmp_path) == [
        Violation("node/engine/streams.py", 5, "grpc", "node/engine never imports grpc"),
        Violation("raft/group.py", 4, "raftlog.node.engine.stream",
                  "raft/ imports only raftlog.raft, raftlog.base and the protos "
                  "(raftlog.v1, raftlog.internal), never raftlog.node"),
    ]


def test_each_rule_names_its_violation(tmp_path: Path) -> None:
    for package in ("base", "raft", "node", "node/engine", "node/cli", "node/transport",
                    "node/replication", "chaos"):
        write(tmp_path, f"{package}/__init__.py", "")
    write(tmp_path, "base/clock.py", "import grpc\nfrom raftlog.raft import state\n")
    write(tmp_path, "node/engine/log.py", "from raftlog.v1 import streams_pb2_grpc\n")
    write(tmp_path, "node/engine/stream.py", "from raftlog.node.replication import replica\n")
    write(tmp_path, "node/replication/replica.py", "")
    write(tmp_path, "node/cli/client.py",
          "from raftlog.node.engine import log\nfrom raftlog.node.transport import peer\n")
    write(tmp_path, "node/transport/peer.py", "")
    write(tmp_path, "chaos/run.py", "from tests.helpers import wait\n")
    write(tmp_path, "scripts/bench.py", "import tests.workload\n")

    assert [(v.file, v.imported, v.rule) for v in check(tmp_path)] == [
        ("base/clock.py", "grpc", "base/ never imports grpc"),
        ("base/clock.py", "raftlog.raft",
         "base/ imports nothing of raftlog except raftlog.base"),
        ("chaos/run.py", "tests.helpers",
         "nothing under base/, raft/, node/ or chaos/ imports tests"),
        ("node/cli/client.py", "raftlog.node.engine.log",
         "node/cli never imports engine, consumers, replication or cluster"),
        ("node/cli/client.py", "raftlog.node.transport.peer",
         "node/cli imports transport only for credentials and rpc"),
        ("node/engine/log.py", "raftlog.v1.streams_pb2_grpc", "node/engine never imports grpc"),
        ("node/engine/stream.py", "raftlog.node.replication.replica",
         "node/engine never imports node/replication, a layer above it (node/__init__.py)"),
        ("scripts/bench.py", "tests.workload", "scripts never import tests"),
    ]


def test_the_audit_uses_the_node_and_nothing_uses_the_audit(tmp_path: Path) -> None:
    for package in ("node", "node/ops", "chaos", "audit"):
        write(tmp_path, f"{package}/__init__.py", "")
    write(tmp_path, "audit/export.py",
          "from raftlog.node.engine import storage\nfrom raftlog.raft import replay\n"
          "from raftlog.chaos import cluster\n")
    write(tmp_path, "node/ops/audit_export.py", "from raftlog.audit import export_child\n")
    write(tmp_path, "chaos/run.py", "import raftlog.audit.cli_run\n")
    write(tmp_path, "scripts/bench_audit.py", "from raftlog.audit.export import export_node\n")

    nothing_imports_audit = ("nothing under base/, raft/, node/ or chaos/ imports raftlog.audit "
                             "(a node runs the exporter as a process)")
    assert [(v.file, v.imported, v.rule) for v in check(tmp_path)] == [
        ("audit/export.py", "raftlog.chaos",
         "audit/ imports only raftlog.base, raftlog.raft, raftlog.node and the protos"),
        ("chaos/run.py", "raftlog.audit.cli_run", nothing_imports_audit),
        ("node/ops/audit_export.py", "raftlog.audit", nothing_imports_audit),
    ]
