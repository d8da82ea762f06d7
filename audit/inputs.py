"""Checks an export directory before any Spark work and describes what it holds.

Everything here reads manifests and Parquet footers only (no rows), so a bad input costs
milliseconds, not a JVM start. A problem that makes the audit's answer wrong raises `BadInput`
(the CLI exits 2 with its reason): a node directory without a manifest, a missing or malformed
table file, row counts that differ from the manifest's, mixed schema versions, a node exported
twice, exports of different clusters, an empty directory, a cluster with no streams. What can be
reported honestly instead is labelled in `ExportSet` (members without an export).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from raftlog.audit import schema
from raftlog.audit.schema import Manifest


class BadInput(Exception):
    """The export cannot be audited as it is; `str(error)` says why."""


@dataclass(frozen=True)
class NodeExport:
    node: str
    directory: Path
    manifest: Manifest
    rows: dict[str, int]  # per table file, from the Parquet footers


@dataclass(frozen=True)
class ExportSet:
    root: Path
    nodes: tuple[NodeExport, ...]  # sorted by node id
    cluster: str  # the clusters' common fingerprint ("" when no node holds metadata)
    members: tuple[str, ...]  # every member any manifest names
    warnings: tuple[str, ...] = field(default=())

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(export.node for export in self.nodes)

    @property
    def not_exported(self) -> tuple[str, ...]:
        """Members some manifest names that have no export here."""
        exported = set(self.node_ids)
        return tuple(member for member in self.members if member not in exported)

    def rows(self, table_file: str) -> int:
        return sum(export.rows[table_file] for export in self.nodes)

    def paths(self, table_file: str) -> list[str]:
        return [str(export.directory / table_file) for export in self.nodes]


def check_exports(root: Path) -> ExportSet:
    """The export under `root`, checked; raises BadInput with the reason when it is unusable."""
    if not root.is_dir():
        raise BadInput(f"{root}: no such export directory")
    directories = sorted(path for path in root.iterdir()
                         if path.is_dir() and not path.name.startswith("."))
    if not directories:
        raise BadInput(f"{root}: empty export (no node directories)")
    nodes = [_check_node(directory) for directory in directories]
    _check_versions(nodes)
    _check_unique(nodes)
    cluster = _check_cluster(nodes)
    if all(node.rows[schema.STREAMS_FILE] == 0 and node.rows[schema.META_FILE] == 0
           for node in nodes):
        raise BadInput(f"{root}: nothing to audit: no node holds a stream and no metadata "
                       "view knows one (an empty cluster)")
    members = sorted({member for node in nodes for member in node.manifest.members}
                     | {node.node for node in nodes})
    warnings = [f"{node.directory.name}: directory name differs from the manifest's node "
                f"{node.node!r}" for node in nodes if node.directory.name != node.node]
    if cluster:
        warnings += [f"{node.node}: holds no metadata (no cluster fingerprint): cannot confirm "
                     "it belongs to this cluster" for node in nodes if not node.manifest.cluster]
    return ExportSet(root=root, nodes=tuple(sorted(nodes, key=lambda n: n.node)),
                     cluster=cluster, members=tuple(members), warnings=tuple(warnings))


def _check_node(directory: Path) -> NodeExport:
    if not (directory / schema.MANIFEST).is_file():
        raise BadInput(f"partial export: {directory} has no {schema.MANIFEST} (an export that "
                       "did not finish, or not an export)")
    try:
        manifest = Manifest.read(directory)
    except (ValueError, TypeError, OSError) as error:
        raise BadInput(f"{directory / schema.MANIFEST}: unreadable manifest: {error}") from error
    if not manifest.node:
        raise BadInput(f"{directory / schema.MANIFEST}: the manifest names no node")
    if manifest.schema_version != schema.SCHEMA_VERSION:
        return NodeExport(manifest.node, directory, manifest, {})  # reported by _check_versions
    rows = {name: _check_table(directory, name, manifest) for name in schema.TABLE_FILES}
    return NodeExport(manifest.node, directory, manifest, rows)


def _check_table(directory: Path, name: str, manifest: Manifest) -> int:
    path = directory / name
    if not path.is_file():
        raise BadInput(f"partial export: {directory} lacks {name}")
    try:
        metadata = pq.read_metadata(path)
        found = metadata.schema.to_arrow_schema()
    except (pa.ArrowException, OSError) as error:
        raise BadInput(f"{path}: not a readable Parquet file: {error}") from error
    _check_columns(path, found, schema.SCHEMAS[name])
    expected_rows = manifest.rows.get(name)
    if expected_rows is not None and expected_rows != metadata.num_rows:
        raise BadInput(f"partial export: {path} holds {metadata.num_rows} rows, the manifest "
                       f"says {expected_rows}")
    _check_node_column(path, metadata, manifest.node)
    return int(metadata.num_rows)


def _check_columns(path: Path, found: pa.Schema, expected: pa.Schema) -> None:
    if found.names != expected.names:
        raise BadInput(f"{path}: columns {found.names}, schema version "
                       f"{schema.SCHEMA_VERSION} has {expected.names}")
    for have, want in zip(found, expected, strict=True):
        if not have.type.equals(want.type):
            raise BadInput(f"{path}: column {want.name} is {have.type}, schema version "
                           f"{schema.SCHEMA_VERSION} says {want.type}")


def _check_node_column(path: Path, metadata: pq.FileMetaData, node: str) -> None:
    """Row-group statistics of `node` (when the writer kept them) must name the manifest's."""
    column = metadata.schema.names.index("node")
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(column).statistics
        if stats is None or not stats.has_min_max:
            continue
        if (stats.min, stats.max) != (node, node):
            raise BadInput(f"{path}: holds rows of node {stats.min!r}..{stats.max!r}, the "
                           f"manifest names {node!r}")


def _check_versions(nodes: list[NodeExport]) -> None:
    versions = {node.manifest.schema_version for node in nodes}
    if versions != {schema.SCHEMA_VERSION}:
        found = ", ".join(f"{node.directory.name}: {node.manifest.schema_version}"
                          for node in nodes)
        raise BadInput(f"mixed or unknown schema versions ({found}); this audit reads "
                       f"version {schema.SCHEMA_VERSION}: export every node again")


def _check_unique(nodes: list[NodeExport]) -> None:
    seen: dict[str, Path] = {}
    for node in nodes:
        if node.node in seen:
            raise BadInput(f"node {node.node} exported twice: {seen[node.node]} and "
                           f"{node.directory}; keep one")
        seen[node.node] = node.directory


def _check_cluster(nodes: list[NodeExport]) -> str:
    fingerprints = {node.manifest.cluster for node in nodes if node.manifest.cluster}
    if len(fingerprints) > 1:
        found = ", ".join(f"{node.node}: {node.manifest.cluster[:12] or '-'}" for node in nodes)
        raise BadInput(f"exports from different clusters ({found}): audit one cluster at a time")
    return fingerprints.pop() if fingerprints else ""
