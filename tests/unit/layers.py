"""The layer contract, checked by parsing (never importing) the source: who may import whom.

The rules are the ones written in the package docstrings: base/__init__.py, raft/__init__.py,
node/__init__.py, each node/<package>/__init__.py and audit/__init__.py. `check(root)` reads every
module under base/, raft/, node/, chaos/ and audit/ (recursively) and scripts/*.py of the tree at
`root` and returns
one `Violation` per offending import (file, line, imported module, the first rule it
breaks), sorted.

Every import counts: at module level, inside functions, under `if TYPE_CHECKING:`. An import of a
generated `*_pb2_grpc` module counts as an import of grpc (it imports grpc itself).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# folder in the repo -> the package it is installed as (pyproject.toml's package-dir)
PACKAGES = {"base": "raftlog.base", "raft": "raftlog.raft", "node": "raftlog.node",
            "chaos": "raftlog.chaos", "audit": "raftlog.audit"}
PROTOS = ("raftlog.v1", "raftlog.internal", "raftlog.compat")
GRPC_TOP_LEVEL = ("grpc", "grpc_health", "grpc_reflection", "grpc_status")

# node/__init__.py: "A package may import the ones listed after it ... never one listed before
# it": cli > server (with config, log_limit) > api > ops > cluster > replication > consumers >
# engine. `transport` sits beside that order (see NODE_TRANSPORT_USERS).
NODE_LEVEL = {"cli": 0, "server": 1, "config": 1, "log_limit": 1, "api": 2, "ops": 3,
              "cluster": 4, "replication": 5, "consumers": 6, "engine": 7}
# Each package's own docstring narrows what node/__init__.py allows; where it names what the
# package imports, that list is the whole of it (None: the docstring names no list, the order
# above applies).
NODE_IMPORTS: dict[str, frozenset[str] | None] = {
    # "never imports the engine, consumers, replication or cluster packages"
    "cli": frozenset({"server", "config", "log_limit", "api", "ops", "transport"}),
    # "builds every layer"
    "server": None, "config": None, "log_limit": None,
    # "Imports only `ops` and `transport`"
    "api": frozenset({"ops", "transport"}),
    # "Imports `cluster`, `consumers`, `engine`, `transport`, raftlog.raft, raftlog.base, protos"
    "ops": frozenset({"cluster", "consumers", "engine", "transport"}),
    # "Imports `replication`, `consumers`, `engine`, `transport` (peer calls), raftlog.raft, ..."
    "cluster": frozenset({"replication", "consumers", "engine", "transport"}),
    # "Imports `engine`, `transport` (peer calls), `raftlog.base`, the protos."
    "replication": frozenset({"engine", "transport"}),
    # "Imports `raftlog.node.engine` (through the `StreamLog` protocol), `raftlog.raft` ..."
    "consumers": frozenset({"engine"}),
    # "imports only `raftlog.base` and the protos"
    "engine": frozenset(),
    # "Imports only `raftlog.base` and the protos."
    "transport": frozenset(),
}
# Who may use transport: the brief's reading of the docstrings (api, ops, cluster, replication
# name it; server builds every layer; the CLI for credentials and rpc only).
NODE_TRANSPORT_USERS = frozenset({"server", "config", "log_limit", "api", "ops", "cluster",
                                  "replication", "cli"})
CLI_TRANSPORT_MODULES = frozenset({"raftlog.node.transport.credentials",
                                   "raftlog.node.transport.rpc"})
# Which packages of node/ may import raftlog.raft (None: every module of the package; a set: only
# those modules). Docstrings: ops and cluster name it; consumers "for `raft_store`"; engine,
# replication and transport do not; cli, server and api follow node/__init__.py.
NODE_RAFT_USERS: dict[str, frozenset[str] | None] = {
    "cli": None, "server": None, "config": None, "log_limit": None, "api": None, "ops": None,
    "cluster": None, "consumers": frozenset({"raftlog.node.consumers.raft_store"}),
}


# Violations in the code today, named and allowed until they are fixed (out of scope of the
# change that wrote this contract): (importing module or package, imported module) -> why.
# tests/unit/test_layers.py fails when one is no longer needed.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True, order=True)
class Violation:
    file: str  # relative to the tree's root
    line: int
    imported: str
    rule: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: imports {self.imported}: {self.rule}"


@dataclass(frozen=True)
class Import:
    file: str
    module: str  # the importing module, e.g. raftlog.node.engine.stream or scripts.bench
    line: int
    imported: str  # the imported module, absolute


def under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def is_grpc(name: str) -> bool:
    return name.split(".")[0] in GRPC_TOP_LEVEL or name.rsplit(".", 1)[-1].endswith("_pb2_grpc")


def modules(root: Path) -> Iterator[tuple[Path, str]]:
    """(path, module name) of every module the contract covers."""
    for folder, package in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield path, ".".join([package, *parts])
    for path in sorted((root / "scripts").glob("*.py")):
        yield path, f"scripts.{path.stem}"


def imports(root: Path) -> Iterator[Import]:
    known = {name for _, name in modules(root)}
    for path, module in modules(root):
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        file = path.relative_to(root).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(file, module, node.lineno, alias.name)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = module.split(".")
                    anchor = parts if is_package else parts[:-1]
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    submodule = full in known or alias.name.endswith(("_pb2", "_pb2_grpc"))
                    yield Import(file, module, node.lineno, full if submodule else base)


def node_package(name: str) -> str | None:
    """raftlog.node.engine.stream -> engine; raftlog.node.server -> server; raftlog.node -> ''."""
    if not under(name, "raftlog.node"):
        return None
    parts = name.split(".")
    return parts[2] if len(parts) > 2 else ""


Rule = Callable[[Import], str | None]


def audit_rule(i: Import) -> str | None:
    """audit/__init__.py: the audit may use every layer of the node; nothing under base/,
    raft/, node/ or chaos/ imports it (a node runs the exporter as a process). Scripts may."""
    if under(i.module, "raftlog.audit"):
        if under(i.imported, "raftlog") and not under(
                i.imported, "raftlog.audit", "raftlog.base", "raftlog.raft", "raftlog.node",
                *PROTOS):
            return "audit/ imports only raftlog.base, raftlog.raft, raftlog.node and the protos"
        return None
    if under(i.imported, "raftlog.audit") and not i.module.startswith("scripts."):
        return ("nothing under base/, raft/, node/ or chaos/ imports raftlog.audit (a node runs "
                "the exporter as a process)")
    return None


def base_rule(i: Import) -> str | None:
    if not under(i.module, "raftlog.base"):
        return None
    if under(i.imported, "raftlog") and not under(i.imported, "raftlog.base"):
        return "base/ imports nothing of raftlog except raftlog.base"
    if is_grpc(i.imported):
        return "base/ never imports grpc"
    if under(i.imported, "rocksdict", "pysyncobj"):
        return "base/ never imports RocksDB or pysyncobj (base/__init__.py)"
    return None


def raft_rule(i: Import) -> str | None:
    if not under(i.module, "raftlog.raft"):
        return None
    if under(i.imported, "raftlog") and not under(i.imported, "raftlog.raft", "raftlog.base",
                                                    *PROTOS):
        return ("raft/ imports only raftlog.raft, raftlog.base and the protos (raftlog.v1, "
                "raftlog.internal), never raftlog.node")
    return None


def node_rule(i: Import) -> str | None:
    package = node_package(i.module)
    if package is None or not under(i.imported, "raftlog"):
        return None
    target = node_package(i.imported)
    if target is None:
        if under(i.imported, "raftlog.base", *PROTOS):
            return None
        if under(i.imported, "raftlog.raft"):
            users = NODE_RAFT_USERS.get(package, frozenset())
            if users is None or i.module in users:
                return None
            return f"node/{package} never imports raftlog.raft (node/{package}/__init__.py)"
        return "node/ imports only raftlog.node, raftlog.raft, raftlog.base and the protos"
    if target in ("", package) or package == "":
        return None
    if target == "transport":
        if package not in NODE_TRANSPORT_USERS:
            return f"node/{package} never imports transport (only api, ops, cluster, replication)"
        if package == "cli" and not under(i.imported, *CLI_TRANSPORT_MODULES):
            return "node/cli imports transport only for credentials and rpc"
        return None
    allowed = NODE_IMPORTS.get(package)
    if package == "transport":
        return "node/transport imports only raftlog.base and the protos"
    if target not in NODE_LEVEL or package not in NODE_LEVEL:
        return f"node/{package} -> node/{target}: a package node/__init__.py does not order"
    if NODE_LEVEL[target] < NODE_LEVEL[package]:
        return f"node/{package} never imports node/{target}, a layer above it (node/__init__.py)"
    if allowed is not None and target not in allowed:
        return (f"node/{package} imports only {', '.join(sorted(allowed)) or 'no node package'}"
                f" of node/ (node/{package}/__init__.py)")
    return None


def engine_grpc_rule(i: Import) -> str | None:
    if node_package(i.module) == "engine" and is_grpc(i.imported):
        return "node/engine never imports grpc"
    return None


def cli_rule(i: Import) -> str | None:
    if node_package(i.module) == "cli" and node_package(i.imported) in (
            "engine", "consumers", "replication", "cluster"):
        return "node/cli never imports engine, consumers, replication or cluster"
    return None


def tests_rule(i: Import) -> str | None:
    if under(i.imported, "tests"):
        if i.module.startswith("scripts."):
            return "scripts never import tests"
        return "nothing under base/, raft/, node/ or chaos/ imports tests"
    return None


# The most specific first: an import is reported once, under the first rule it breaks.
RULES: tuple[Rule, ...] = (audit_rule, base_rule, raft_rule, cli_rule, engine_grpc_rule,
                           node_rule, tests_rule)


def known_exception(i: Import,
                    exceptions: dict[tuple[str, str], str]) -> tuple[str, str] | None:
    for key in exceptions:
        importer, imported = key
        if under(i.module, importer) and under(i.imported, imported):
            return key
    return None


def check(root: Path, *, exceptions: dict[tuple[str, str], str] | None = None,
          used: set[tuple[str, str]] | None = None) -> list[Violation]:
    """Every violation under `root`, except those `exceptions` names (each one found is added to
    `used`)."""
    found: set[Violation] = set()
    for i in imports(root):
        excepted = known_exception(i, exceptions or {})
        for rule in RULES:
            text = rule(i)
            if text is None:
                continue
            if excepted is None:
                found.add(Violation(i.file, i.line, i.imported, text))
            elif used is not None:
                used.add(excepted)
            break
    return sorted(found)
