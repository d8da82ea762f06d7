"""Cluster.ExportAudit on this node: the audit export of a running node (raftlog audit export
--cluster).

1. the commit seq of every stream copy here and the metadata group's applied index are noted
   (before the checkpoint, so that every seq and journal entry up to them is in it; the
   journal's stored commit index lags up to a second);
2. a RocksDB checkpoint is taken into DATA/audit-export.<token>/db (hard links; the node keeps
   serving) and the metadata snapshot file is copied beside it, in the data directory's layout:
   the snapshot is taken after the checkpoint, so it is at least as new as the journal prefix
   the checkpoint lacks;
3. the exporter runs as a process of its own (`python -m raftlog.audit.export_child`, at a
   lower CPU priority): its work never holds this node's GIL, and nothing in the node imports
   the audit package;
4. its files are streamed back, `limits.audit_export_chunk_bytes_max` at a time, then the
   manifest.

Bounds: one export at a time (a second one: EXPORT_RUNNING); `limits.audit_export_s_max` for the
whole call (TIMEOUT before the reply starts; the call is cancelled if the caller stalls the
reply past it). The work directory and the exporter go away in every case: the call ends, fails,
times out, or its caller goes away; what a crash leaves is removed at the next start and before
the next export (`remove_leftovers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.storage import Storage
from raftlog.node.engine.streams import StreamEngine
from raftlog.v1 import cluster_pb2

log = logging.getLogger(__name__)

EXPORTER_MODULE = "raftlog.audit.export_child"
WORK_PREFIX = "audit-export."  # DATA/audit-export.<token>: one export's work directory
# The exporter's files, in the order they are sent (raftlog.audit.schema's layout; the manifest
# goes last, in the final chunk).
EXPORT_FILES = ("messages.parquet", "streams.parquet", "consumers.parquet", "meta.parquet")
MANIFEST_FILE = "manifest.json"
_SNAPSHOT = Path("raft") / "snapshot.pb"  # under a data directory (node/server.py)
_COMMIT_SEQS = "commit_seqs.json"
_EXPORTER_LOG = "exporter.log"


def remove_leftovers(data_dir: Path) -> int:
    """Removes the work directories of exports that did not end (a crash); returns how many."""
    removed = 0
    for path in data_dir.glob(f"{WORK_PREFIX}*"):
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


@dataclass(frozen=True)
class _Noted:
    """What the node notes before the checkpoint: everything up to it is in the checkpoint."""

    applied_index: int  # the metadata group's
    commit_seqs: dict[str, int]  # per stream copy here


class AuditExport:
    def __init__(self, *, node_id: str, storage: Storage, engine: StreamEngine,
                 applied_index: Callable[[], int], data_dir: Path) -> None:
        """`applied_index()`: the metadata group's applied Raft index."""
        self._node_id = node_id
        self._storage = storage
        self._engine = engine
        self._applied_index = applied_index
        self._data_dir = data_dir
        self._running = False

    async def export(self, request: cluster_pb2.ExportAuditRequest
                     ) -> AsyncIterator[cluster_pb2.ExportAuditChunk]:
        if self._running:
            raise RaftlogError(Reason.EXPORT_RUNNING,
                               f"{self._node_id} is running an export already; retry when it "
                               "ended", node=self._node_id)
        self._running = True
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        deadline = loop.time() + limits.audit_export_s_max
        watchdog: asyncio.TimerHandle | None = None
        remove_leftovers(self._data_dir)
        work = self._data_dir / f"{WORK_PREFIX}{secrets.token_hex(6)}"
        process: asyncio.subprocess.Process | None = None
        try:
            noted = _Noted(applied_index=self._applied_index(), commit_seqs={
                name: stream.commit_seq for name, stream in self._engine.streams.items()})
            await asyncio.to_thread(self._checkpoint, work, noted)
            process = await self._start_exporter(work, noted,
                                                 skip_messages=request.skip_messages)
            await self._wait_exporter(process, work, timeout_s=deadline - loop.time())
            # The reply gets the rest of the limit; a caller that stalls it past the deadline
            # has the call cancelled. Armed only now: a cancel due at the same moment as the
            # exporter's wait would win over it and turn that TIMEOUT into a cancelled call.
            if task is not None:
                watchdog = loop.call_at(deadline, task.cancel)
            async for chunk in self._chunks(work / "out" / self._node_id):
                yield chunk
        finally:
            if watchdog is not None:
                watchdog.cancel()
            try:
                await _stop(process)
            finally:
                shutil.rmtree(work, ignore_errors=True)
                self._running = False

    def _checkpoint(self, work: Path, noted: _Noted) -> None:
        """Worker thread: the checkpoint, then the snapshot file, then the commit seqs."""
        work.mkdir()
        self._storage.checkpoint(work / "db")
        snapshot = self._data_dir / _SNAPSHOT
        if snapshot.is_file():
            (work / _SNAPSHOT).parent.mkdir(parents=True)
            shutil.copyfile(snapshot, work / _SNAPSHOT)
        (work / _COMMIT_SEQS).write_text(json.dumps(noted.commit_seqs))

    async def _start_exporter(self, work: Path, noted: _Noted, *, skip_messages: bool
                              ) -> asyncio.subprocess.Process:
        args = [sys.executable, "-m", EXPORTER_MODULE, "--from", str(work), "--out",
                str(work / "out"), "--node-id", self._node_id, "--source", "online",
                "--commit-seqs", str(work / _COMMIT_SEQS),
                "--applied-index", str(noted.applied_index)]
        if skip_messages:
            args.append("--skip-messages")
        with open(work / _EXPORTER_LOG, "wb") as errors:
            return await asyncio.create_subprocess_exec(
                *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=errors)

    async def _wait_exporter(self, process: asyncio.subprocess.Process, work: Path, *,
                             timeout_s: float) -> None:
        try:
            code = await asyncio.wait_for(process.wait(), timeout=max(timeout_s, 0.0))
        except TimeoutError:
            raise RaftlogError(Reason.TIMEOUT, f"the export of {self._node_id} took longer "
                               f"than {limits.audit_export_s_max:g} s",
                               limit=limits.audit_export_s_max) from None
        if code != 0:
            raise RaftlogError(Reason.INTERNAL, f"the exporter of {self._node_id} failed "
                               f"(exit {code}): {_tail(work / _EXPORTER_LOG)}")

    async def _chunks(self, export: Path) -> AsyncIterator[cluster_pb2.ExportAuditChunk]:
        size_max = limits.audit_export_chunk_bytes_max
        for name in EXPORT_FILES:
            with open(export / name, "rb") as file:
                offset = 0
                while True:
                    data = await asyncio.to_thread(file.read, size_max)
                    last = len(data) < size_max
                    if last or data:
                        yield cluster_pb2.ExportAuditChunk(
                            node_id=self._node_id, file=name, offset=offset, data=data,
                            last=last)
                    if last:
                        break
                    offset += len(data)
        manifest = (export / MANIFEST_FILE).read_text(encoding="utf-8")
        yield cluster_pb2.ExportAuditChunk(node_id=self._node_id, manifest_json=manifest)


async def _stop(process: asyncio.subprocess.Process | None) -> None:
    """Kills the exporter if it still runs (it is this node's child) and reaps it."""
    if process is None or process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        process.kill()
    try:
        await asyncio.wait_for(process.wait(), timeout=limits.audit_export_stop_s)
    except TimeoutError:
        log.warning("the audit exporter (pid %d) did not stop in %.0f s", process.pid,
                    limits.audit_export_stop_s)


def _tail(path: Path) -> str:
    """The end of the exporter's error output, at most limits.audit_export_stderr_bytes_max."""
    try:
        with open(path, "rb") as file:
            file.seek(0, 2)
            size = file.tell()
            file.seek(max(0, size - limits.audit_export_stderr_bytes_max))
            text = file.read().decode("utf-8", "replace").strip()
    except OSError as err:
        return f"(its error output is unreadable: {err})"
    return text or "(no error output)"
