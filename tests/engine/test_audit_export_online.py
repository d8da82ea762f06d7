"""The node side of the online audit export (node/ops/audit_export.py, Cluster.ExportAudit) on
a tmp RocksDB that a real `Storage` and `StreamEngine` serve while it runs (the data of
test_audit_export.py's node: two streams, a consumer store, a one-member Raft group's journal
and snapshot): the files streamed back, the time limit, a failing exporter, a caller that goes
away, one export at a time, and the work directories a crash leaves.

Most tests run the real exporter process; the others replace `AuditExport._start_exporter`
(signature kept) with a `python -c` child that sleeps, fails or writes dummy files. Every child
a test started and that still runs at its end is killed by that test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from raftlog.audit import schema
from raftlog.audit.export_meta import meta_view
from raftlog.audit.export_source import locate, open_read_only
from raftlog.base import limits
from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.engine.rocks_store import RocksMessageStore
from raftlog.node.engine.storage import GroupCommitter, Storage
from raftlog.node.engine.streams import NoConsumers, StreamEngine
from raftlog.node.ops.audit_export import (
    _EXPORTER_LOG,
    EXPORT_FILES,
    MANIFEST_FILE,
    WORK_PREFIX,
    AuditExport,
    _Noted,
    remove_leftovers,
)
from raftlog.v1 import cluster_pb2
from tests.engine.test_audit_export import NOW_MS, Node, make_node, table

T = TypeVar("T")
Process = asyncio.subprocess.Process

NODE_ID = "n1"
test_timeout_s = 180  # pytest-timeout, per test: a few exporter processes on a loaded machine
scenario_timeout_s = 150.0  # one test's event loop
call_timeout_s = 60.0  # one export call or one chunk of it, the real exporter included
cleanup_wait_s = 10.0  # for what a cancelled or closed call removes
overrun_s_max = 0.5  # limits.audit_export_s_max where an export is to overrun it
stall_s_max = 5.0  # limits.audit_export_s_max where a caller is to stall the reply past it
stall_caller_s = 4 * stall_s_max  # how long that caller stalls
chunk_bytes_max = 512  # limits.audit_export_chunk_bytes_max: several chunks per file
child_sleep_s = 60  # a slow exporter; far beyond every limit above

pytestmark = pytest.mark.timeout(test_timeout_s)

SLOW_EXPORTER = f"import time; time.sleep({child_sleep_s})"
FAILED_LINE = "export failed: OSError: the disk is on fire"
FAILING_EXPORTER = ("import sys; sys.stderr.write('HEAD' + 'x' * 10000 + '\\n' + "
                    f"{FAILED_LINE!r} + '\\n'); sys.exit(3)")
# Writes dummy export files (4 KiB each) where the real exporter writes its output, and exits.
FAST_EXPORTER = ("import pathlib, sys; out = pathlib.Path(sys.argv[1]) / 'out' / "
                 f"{NODE_ID!r}; out.mkdir(parents=True); "
                 f"[(out / name).write_bytes(b'x' * 4096) for name in {EXPORT_FILES!r}]; "
                 f"(out / {MANIFEST_FILE!r}).write_text('{{}}')")


@dataclass(frozen=True)
class Template:
    """A node's data directory (closed), copied for each test."""

    node: Node
    applied_index: int  # what the tests' `applied_index()` says: one before the journal's end


@dataclass(frozen=True)
class Started:
    """One exporter process an export started, and the work directories at that moment."""

    process: Process
    work: Path
    work_dirs: list[str]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    node = make_node(tmp_path_factory.mktemp("online-template") / NODE_ID)
    applied_index = node.meta_index - 1  # the last command (consumer c2) lies past it
    files = locate(node.data_dir)
    with open_read_only(files.db_dir) as db:  # the view can be replayed to exactly there
        view = meta_view(db, snapshot=files.snapshot, applied_index=applied_index)
    assert view.snapshot_index < view.index == applied_index, view
    return Template(node=node, applied_index=applied_index)


@pytest.fixture
def data_dir(template: Template, tmp_path: Path) -> Path:
    path = tmp_path / NODE_ID
    shutil.copytree(template.node.data_dir, path)
    return path


@dataclass
class Serving:
    audit: AuditExport
    engine: StreamEngine


@contextlib.asynccontextmanager
async def serving(data_dir: Path, *, applied_index: int) -> AsyncIterator[Serving]:
    """The node's storage and stream engine open (as in a running node), and its AuditExport."""
    storage = Storage(data_dir)
    committer = GroupCommitter(storage)
    committer.start(asyncio.get_running_loop())
    engine = StreamEngine(store=RocksMessageStore(storage, committer),
                          clock=FakeClock(wall_ms=NOW_MS), consumers=NoConsumers())
    try:
        engine.load()
        yield Serving(audit=AuditExport(node_id=NODE_ID, storage=storage, engine=engine,
                                        applied_index=lambda: applied_index,
                                        data_dir=data_dir),
                      engine=engine)
    finally:
        await engine.stop()
        committer.stop()
        storage.close()


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), timeout=scenario_timeout_s))


async def bounded(awaitable: Awaitable[T]) -> T:
    return await asyncio.wait_for(awaitable, timeout=call_timeout_s)


def export_call(audit: AuditExport, *, skip_messages: bool = False
                ) -> AsyncGenerator[cluster_pb2.ExportAuditChunk, None]:
    stream = audit.export(cluster_pb2.ExportAuditRequest(skip_messages=skip_messages))
    assert isinstance(stream, AsyncGenerator)
    return stream


async def collect(stream: AsyncIterator[cluster_pb2.ExportAuditChunk]
                  ) -> list[cluster_pb2.ExportAuditChunk]:
    return [chunk async for chunk in stream]


def record_exporter(monkeypatch: pytest.MonkeyPatch, *, code: str | None = None
                    ) -> list[Started]:
    """Replaces AuditExport._start_exporter: with `code`, `python -c CODE WORK` runs instead of
    the exporter (its stdio as the real one's); without, the real one. Returns the list every
    started process goes into."""
    started: list[Started] = []
    real = AuditExport._start_exporter

    async def start(self: AuditExport, work: Path, noted: _Noted, *, skip_messages: bool
                    ) -> Process:
        work_dirs = sorted(path.name for path in work.parent.glob(f"{WORK_PREFIX}*"))
        if code is None:
            process = await real(self, work, noted, skip_messages=skip_messages)
        else:
            with open(work / _EXPORTER_LOG, "wb") as errors:
                process = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", code, str(work), stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL, stderr=errors)
        started.append(Started(process=process, work=work, work_dirs=work_dirs))
        return process

    monkeypatch.setattr(AuditExport, "_start_exporter", start)
    return started


async def kill_remaining(started: list[Started]) -> None:
    """Kills (and reaps) what the test started and still runs: only those processes."""
    for one in started:
        if one.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                one.process.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(one.process.wait(), timeout=cleanup_wait_s)


def assert_gone(process: Process) -> None:
    """The process ended and was reaped: its pid names no process (nor a zombie) any more."""
    assert process.returncode is not None, f"pid {process.pid} still runs"
    with pytest.raises(ProcessLookupError):
        os.kill(process.pid, 0)


def work_dirs(data_dir: Path) -> list[str]:
    return sorted(path.name for path in data_dir.glob(f"{WORK_PREFIX}*"))


async def until(predicate: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {predicate}"
        await asyncio.sleep(0.02)


def reassemble(chunks: list[cluster_pb2.ExportAuditChunk], out: Path) -> dict[str, int]:
    """Writes the files of a complete reply into `out`, checking the chunk order on the way;
    returns how many chunks each file came in."""
    *body, final = chunks
    files: dict[str, bytearray] = {}
    counts: dict[str, int] = {}
    ended: list[str] = []
    for chunk in body:
        assert (chunk.node_id, chunk.manifest_json) == (NODE_ID, "")
        assert chunk.file not in ended, f"{chunk.file}: a chunk after its last one"
        data = files.setdefault(chunk.file, bytearray())
        assert chunk.offset == len(data), (chunk.file, chunk.offset, len(data))
        assert len(chunk.data) <= limits.audit_export_chunk_bytes_max
        data += chunk.data
        counts[chunk.file] = counts.get(chunk.file, 0) + 1
        if chunk.last:
            ended.append(chunk.file)
    assert ended == list(EXPORT_FILES) == list(files)  # every file, in order, each ended
    assert (final.node_id, final.file, final.data, final.last) == (NODE_ID, "", b"", False)
    out.mkdir(parents=True)
    for name, data in files.items():
        (out / name).write_bytes(bytes(data))
    (out / MANIFEST_FILE).write_text(final.manifest_json, encoding="utf-8")
    return counts


def test_an_export_streams_the_nodes_files_and_leaves_nothing_behind(
        template: Template, data_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "audit_export_chunk_bytes_max", chunk_bytes_max)
    started = record_exporter(monkeypatch)
    commit_seqs: dict[str, int] = {}  # noted by the export: the engine's, at its start
    chunks: list[cluster_pb2.ExportAuditChunk] = []

    async def scenario() -> None:
        async with serving(data_dir, applied_index=template.applied_index) as node:
            commit_seqs.update({name: stream.commit_seq
                                for name, stream in node.engine.streams.items()})
            try:
                chunks.extend(await bounded(collect(export_call(node.audit))))
                [one] = started
                assert work_dirs(data_dir) == []
                assert one.process.returncode == 0
                assert_gone(one.process)
            finally:
                await kill_remaining(started)

    run(scenario)
    out = tmp_path / "received"
    counts = reassemble(chunks, out)
    assert counts[schema.MESSAGES_FILE] > 1  # it came in pieces
    manifest = schema.Manifest.read(out)
    assert (manifest.node, manifest.source) == (NODE_ID, "online")
    assert manifest.applied_index == template.applied_index  # the node's, not the journal's
    stored = template.node.stored
    assert manifest.rows[schema.MESSAGES_FILE] == len(stored) == 7
    messages = table(out, schema.MESSAGES_FILE)
    assert {(row["stream"], row["seq"]): (row["subject"], row["size"]) for row in messages} == {
        key: (message.subject, len(message.payload)) for key, message in stored.items()}
    assert {row["stream"]: row["commit_seq"]
            for row in table(out, schema.STREAMS_FILE)} == commit_seqs == {"orders": 4, "logs": 3}
    # The metadata view ends at the applied index: consumer c2 was created after it.
    assert sorted((row["holder"], row["consumer"])
                  for row in table(out, schema.CONSUMERS_FILE)) == [("raft", "c1"),
                                                                    ("store", "c1")]


def test_an_exporter_past_the_time_limit_fails_with_timeout_and_is_killed(
        template: Template, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "audit_export_s_max", overrun_s_max)
    started = record_exporter(monkeypatch, code=SLOW_EXPORTER)

    async def scenario() -> None:
        async with serving(data_dir, applied_index=template.applied_index) as node:
            try:
                begun = time.monotonic()
                with pytest.raises(RaftlogError) as raised:
                    await bounded(collect(export_call(node.audit)))
                took_s = time.monotonic() - begun
                assert raised.value.reason is Reason.TIMEOUT, raised.value
                assert raised.value.metadata.get("limit") == str(overrun_s_max)
                assert took_s < overrun_s_max + limits.audit_export_stop_s
                [one] = started
                assert one.process.returncode == -signal.SIGKILL
                assert_gone(one.process)
                assert not one.work.exists() and work_dirs(data_dir) == []
            finally:
                await kill_remaining(started)

    run(scenario)


def test_a_failing_exporter_fails_with_the_tail_of_its_errors(
        template: Template, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = record_exporter(monkeypatch, code=FAILING_EXPORTER)

    async def scenario() -> None:
        async with serving(data_dir, applied_index=template.applied_index) as node:
            try:
                with pytest.raises(RaftlogError) as raised:
                    await bounded(collect(export_call(node.audit)))
                error = raised.value
                assert error.reason is Reason.INTERNAL, error
                assert "exit 3" in error.message and NODE_ID in error.message
                assert error.message.endswith(FAILED_LINE)  # the end of its stderr ...
                assert "HEAD" not in error.message  # ... only the end
                assert len(error.message) < limits.audit_export_stderr_bytes_max + 200
                [one] = started
                assert_gone(one.process)
                assert work_dirs(data_dir) == []
            finally:
                await kill_remaining(started)

    run(scenario)


def test_a_caller_that_closes_the_reply_midway_leaves_nothing_behind(
        template: Template, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "audit_export_chunk_bytes_max", chunk_bytes_max)
    started = record_exporter(monkeypatch)

    async def scenario() -> None:
        async with serving(data_dir, applied_index=template.applied_index) as node:
            try:
                stream = export_call(node.audit)
                first = await bounded(anext(stream))
                assert (first.file, first.offset, first.last) == (EXPORT_FILES[0], 0, False)
                assert work_dirs(data_dir) != []  # the reply is read from it
                await bounded(stream.aclose())
                assert work_dirs(data_dir) == []
                [one] = started
                assert_gone(one.process)
                # `running` was cleared: the next export is served.
                chunks = await bounded(collect(export_call(node.audit, skip_messages=True)))
                assert chunks[-1].manifest_json != ""
                assert work_dirs(data_dir) == []
            finally:
                await kill_remaining(started)

    run(scenario)


def test_a_caller_cancelled_while_the_exporter_runs_leaves_nothing_behind(
        template: Template, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = record_exporter(monkeypatch, code=SLOW_EXPORTER)

    async def scenario() -> None:
        async with serving(data_dir, applied_index=template.applied_index) as node:
            try:
                call = asyncio.create_task(collect(export_call(node.audit)))
                await until(lambda: bool(started), call_timeout_s)
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await bounded(call)
                [one] = started
                assert_gone(one.process)
                assert work_dirs(data_dir) == []
                # `running` was cleared: the next export runs (and overruns a short limit).
                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(limits, "audit_export_s_max", overrun_s_max)
                    with pytest.raises(RaftlogError) as raised:
                        await bounded(collect(export_call(node.audit)))
                assert raised.value.reason is Reason.TIMEOUT, raised.value
                assert len(started) == 2
                assert_gone(started[1].process)
            finally:
                await kill_remaining(started)

    run(scenario)


def test_a_caller_that_stalls_the_reply_past_the_limit_is_cancelled(
        template: Template, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "audit_export_s_max", stall_s_max)
    monkeypatch.setattr(limits, "audit_export_chunk_bytes_max", chunk_bytes_max)
    started = record_exporter(monkeypatch, code=FAST_EXPORTER)
    received: list[cluster_pb2.ExportAuditChunk] = []

    async def stalling_caller(audit: AuditExport) -> None:
        async with contextlib.aclosing(export_call(audit)) as stream:
            received.append(await anext(stream))
            await asyncio.sleep(stall_caller_s)  # asks for no next chunk meanwhile

    async def scenario() -> None:
        async with serving(data_dir, applied_index=template.applied_index) as node:
            try:
                begun = time.monotonic()
                with pytest.raises(asyncio.CancelledError):
                    await bounded(stalling_caller(node.audit))
                assert time.monotonic() - begun < stall_s_max + cleanup_wait_s
                assert [chunk.file for chunk in received] == [EXPORT_FILES[0]]
                assert work_dirs(data_dir) == []
                [one] = started
                assert_gone(one.process)
                chunks = await bounded(collect(export_call(node.audit)))
                assert chunks[-1].manifest_json == "{}"
            finally:
                await kill_remaining(started)

    run(scenario)


def test_a_second_export_while_one_runs_is_refused(
        template: Template, data_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "audit_export_chunk_bytes_max", chunk_bytes_max)
    started = record_exporter(monkeypatch)

    async def scenario() -> None:
        async with serving(data_dir, applied_index=template.applied_index) as node:
            try:
                first = export_call(node.audit)
                chunks = [await bounded(anext(first))]
                for _ in range(2):  # a refusal does not end the export that runs
                    with pytest.raises(RaftlogError) as raised:
                        await bounded(collect(export_call(node.audit)))
                    assert raised.value.reason is Reason.EXPORT_RUNNING, raised.value
                    assert raised.value.metadata == {"node": NODE_ID}
                assert len(started) == 1 and len(work_dirs(data_dir)) == 1
                chunks += await bounded(collect(first))
                reassemble(chunks, tmp_path / "first")
                again = await bounded(collect(export_call(node.audit)))
                reassemble(again, tmp_path / "again")
                assert len(started) == 2 and work_dirs(data_dir) == []
            finally:
                await kill_remaining(started)

    run(scenario)
    for name in ("first", "again"):
        manifest = schema.Manifest.read(tmp_path / name)
        assert manifest.rows[schema.MESSAGES_FILE] == len(template.node.stored)


def test_remove_leftovers_removes_the_work_directories_and_nothing_else(
        tmp_path: Path) -> None:
    for name in ("db", "raft"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "kept").write_text("x")
    for token in ("0123456789ab", "ba9876543210", "x"):
        leftover = tmp_path / f"{WORK_PREFIX}{token}"
        (leftover / "db").mkdir(parents=True)
        (leftover / "db" / "000001.sst").write_bytes(b"x" * 100)
        (leftover / _EXPORTER_LOG).write_text("interrupted")
    (tmp_path / "audit-export-notes.txt").write_text("kept")
    (tmp_path / "audit-export").mkdir()  # no dot: not a work directory
    assert remove_leftovers(tmp_path) == 3
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "audit-export", "audit-export-notes.txt", "db", "raft"]
    assert (tmp_path / "db" / "kept").read_text() == "x"
    assert (tmp_path / "raft" / "kept").read_text() == "x"
    assert remove_leftovers(tmp_path) == 0


def test_an_export_removes_what_a_crash_left_before_it_starts(
        template: Template, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    leftover = data_dir / f"{WORK_PREFIX}0123456789ab"
    (leftover / "out" / NODE_ID).mkdir(parents=True)
    (leftover / "out" / NODE_ID / schema.MESSAGES_FILE).write_bytes(b"partial")
    started = record_exporter(monkeypatch)

    async def scenario() -> None:
        async with serving(data_dir, applied_index=template.applied_index) as node:
            try:
                chunks = await bounded(collect(export_call(node.audit, skip_messages=True)))
                [one] = started
                # When the exporter started, only this export's own directory was there.
                assert one.work_dirs == [one.work.name] != [leftover.name]
                assert not leftover.exists() and work_dirs(data_dir) == []
                manifest = json.loads(chunks[-1].manifest_json)
                assert manifest["skipped"] == [schema.MESSAGES_FILE]  # the request was passed on
            finally:
                await kill_remaining(started)

    run(scenario)
