"""The online export, the client's side: the members of a cluster (GetClusterStatus), and one
member's export fetched with Cluster.ExportAudit into EXPORT/<node_id>/.

The chunks are written into EXPORT/.<node_id>.partial.<pid> and checked — every file whole, in
offset order, its Parquet row count the manifest's — before that directory is renamed into
place, so an export that broke off never looks complete.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import grpc
import pyarrow.parquet as pq

from raftlog.audit import schema
from raftlog.audit.export import check_free, move_into_place, partial_dir
from raftlog.base import limits
from raftlog.node.transport.credentials import ADMIN_TOKEN_HEADER, Credential
from raftlog.v1 import cluster_pb2, cluster_pb2_grpc

EXPORT_METHOD = "/" + cluster_pb2.DESCRIPTOR.services_by_name["Cluster"].full_name + "/ExportAudit"
status_timeout_s = 5.0
progress_period_s = 2.0  # progress lines while a file arrives, at most this often
# The node ends an export after limits.audit_export_s_max; the call waits a little longer to
# hear why.
export_call_margin_s = 30.0
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length",
                     limits.audit_export_chunk_bytes_max + 64 * 1024)]

Progress = Callable[[str], None]


class FetchError(Exception):
    """A member's export did not arrive whole."""


@dataclass(frozen=True)
class Member:
    node_id: str
    address: str  # its client (gRPC) address
    peer_address: str = ""  # its peer listener (node-to-node services); "" if it has none


def cluster_members(addresses: Sequence[str], *, timeout_s: float = status_timeout_s
                    ) -> list[Member]:
    """The members, as the first of `addresses` that answers GetClusterStatus sees them.
    Raises grpc.RpcError (the last failure) when none answers."""
    failure: grpc.RpcError | None = None
    for address in addresses:
        with grpc.insecure_channel(address) as channel:
            try:
                status = cluster_pb2_grpc.ClusterStub(channel).GetClusterStatus(  # type: ignore[no-untyped-call]
                    cluster_pb2.GetClusterStatusRequest(), timeout=timeout_s)
            except grpc.RpcError as err:
                failure = err
                continue
        return [Member(node_id=node.node_id, address=node.grpc_address,
                       peer_address=node.peer_address)
                for node in sorted(status.nodes, key=lambda node: node.node_id)]
    if failure is None:
        raise ValueError("no cluster address given")
    raise failure


def fetch_node(member: Member, out_dir: Path, *, credential: Credential | None,
               skip_messages: bool = False, replace: bool = False,
               progress: Progress | None = None,
               timeout_s: float = limits.audit_export_s_max + export_call_margin_s
               ) -> schema.Manifest:
    """Fetches `member`'s export into out_dir/<node_id>. Raises ExportExists, grpc.RpcError
    (the node refused or failed), FetchError (the reply was not a whole export)."""
    final = out_dir / member.node_id
    check_free(final, replace=replace)
    work = partial_dir(out_dir, member.node_id)
    try:
        with grpc.insecure_channel(member.address, options=_CHANNEL_OPTIONS) as channel:
            stub: Any = cluster_pb2_grpc.ClusterStub(channel)  # type: ignore[no-untyped-call]
            metadata = () if credential is None else (
                (ADMIN_TOKEN_HEADER, credential.token(principal="admin", method=EXPORT_METHOD)),)
            chunks = stub.ExportAudit(
                cluster_pb2.ExportAuditRequest(skip_messages=skip_messages),
                timeout=timeout_s, metadata=metadata)
            manifest = _receive(chunks, work, node_id=member.node_id,
                                progress=progress or (lambda text: None))
        move_into_place(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return manifest


def _receive(chunks: Iterable[cluster_pb2.ExportAuditChunk], work: Path, *, node_id: str,
             progress: Progress) -> schema.Manifest:
    files = _Files(work)
    try:
        for chunk in chunks:
            if chunk.node_id != node_id:
                raise FetchError(f"{node_id}: a chunk of {chunk.node_id!r}'s export arrived")
            if chunk.manifest_json:
                return _finish(work, files.done, chunk.manifest_json, node_id=node_id)
            files.write(chunk, progress=progress)
    finally:
        files.close()
    raise FetchError(f"{node_id}: the export ended without its manifest")


class _Files:
    """The files being received: each written in offset order, up to its last chunk."""

    def __init__(self, work: Path) -> None:
        self._work = work
        self._open: dict[str, IO[bytes]] = {}
        self.done: dict[str, int] = {}  # file -> size
        self._reported_s = 0.0

    def write(self, chunk: cluster_pb2.ExportAuditChunk, *, progress: Progress) -> None:
        name = chunk.file
        if name not in schema.TABLE_FILES or name in self.done:
            raise FetchError(f"unexpected file {name!r} in the export")
        file = self._open.get(name)
        if file is None:
            file = self._open[name] = open(self._work / name, "wb")  # noqa: SIM115
        if chunk.offset != file.tell():
            raise FetchError(f"{name}: a chunk at offset {chunk.offset}, expected {file.tell()}")
        file.write(chunk.data)
        now = time.monotonic()
        if chunk.last:
            self.done[name] = file.tell()
            file.close()
            del self._open[name]
            progress(f"{name} {self.done[name] / 2**20:.1f} MiB")
        elif now - self._reported_s >= progress_period_s:
            self._reported_s = now
            progress(f"{name} {file.tell() / 2**20:.1f} MiB so far")

    def close(self) -> None:
        for file in self._open.values():
            file.close()
        self._open.clear()


def _finish(work: Path, done: dict[str, int], manifest_json: str, *,
            node_id: str) -> schema.Manifest:
    missing = [name for name in schema.TABLE_FILES if name not in done]
    if missing:
        raise FetchError(f"{node_id}: the export ended without {', '.join(missing)}")
    (work / schema.MANIFEST).write_text(manifest_json, encoding="utf-8")
    try:
        manifest = schema.Manifest.read(work)
    except (ValueError, TypeError, json.JSONDecodeError) as err:
        raise FetchError(f"{node_id}: the manifest does not read: {err}") from None
    if manifest.node != node_id:
        raise FetchError(f"{node_id}: the manifest is {manifest.node!r}'s")
    for name in schema.TABLE_FILES:
        rows = pq.read_metadata(work / name).num_rows
        if rows != manifest.rows.get(name):
            raise FetchError(f"{node_id}: {name} holds {rows} rows, the manifest says "
                             f"{manifest.rows.get(name)}")
    return manifest
