"""The audit export on a real 3-node local cluster (issue 13, item 1): `raftlog audit export
--cluster` online (each member checkpoints itself and runs the exporter as a process), the admin
credential, one export at a time per node and nothing left behind, a member that cannot be
reached, the offline export of a stopped member, and the test-only divergence tool
(tests/audit_divergence.py): each injection changes exactly the rows it should.

One cluster for the module; the last test stops n3.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow.parquet as pq
import pytest

from raftlog.audit import cli_export, schema
from raftlog.audit.export import SOURCE_OFFLINE, export_node
from raftlog.audit.export_client import EXPORT_METHOD
from raftlog.base.clock import SystemClock
from raftlog.base.errors import Reason
from raftlog.chaos.cluster import LocalCluster
from raftlog.chaos.nodeproc import wait_until
from raftlog.node.ops.audit_export import EXPORTER_MODULE, WORK_PREFIX
from raftlog.node.transport.credentials import ADMIN_TOKEN_HEADER
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import cluster_pb2, cluster_pb2_grpc, streams_pb2, types_pb2
from tests import audit_divergence as inject

STREAM = "orders"
MESSAGES = 30
call_timeout_s = 10.0
commit_wait_s = 10.0
cleanup_wait_s = 15.0
hold_attempts_max = 5


def run_cli(*argv: str) -> tuple[int, str, str]:
    """`raftlog audit export ARGV` in this process: (exit status, stdout, stderr)."""
    parser = argparse.ArgumentParser()
    cli_export.register(parser.add_subparsers())
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        args = parser.parse_args(["export", *argv])
        status = int(args.run(args))
    return status, out.getvalue(), err.getvalue()


def rows(path: Path, table: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = pq.read_table(path / table).to_pylist()
    return found


def by_seq(path: Path, stream: str = STREAM) -> dict[int, dict[str, Any]]:
    return {row["seq"]: row for row in rows(path, schema.MESSAGES_FILE) if row["stream"] == stream}


def work_dirs(cluster: LocalCluster) -> list[Path]:
    return [path for i in (1, 2, 3) for path in cluster.spec(i).data_dir.glob(f"{WORK_PREFIX}*")]


def exporters(cluster: LocalCluster) -> list[int]:
    """Pids of exporter processes working on this cluster's directories."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = cmdline.read_bytes().split(b"\0")
            if EXPORTER_MODULE.encode() in argv and str(cluster.root).encode() in b" ".join(argv):
                found.append(int(cmdline.parent.name))
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    made = LocalCluster(tmp_path_factory.mktemp("audit") / "cluster", nodes=3)
    try:
        made.start_all()
        made.streams(1).CreateStream(streams_pb2.CreateStreamRequest(
            config=types_pb2.StreamConfig(name=STREAM, replicas=3, subjects=["orders.>"])),
            timeout=call_timeout_s)
        reply = made.streams(2).PublishBatch(streams_pb2.PublishBatchRequest(
            stream=STREAM, entries=[streams_pb2.PublishEntry(
                subject=f"orders.k{k % 3}", payload=b"%d" % k) for k in range(MESSAGES)]),
            timeout=call_timeout_s)
        assert reply.acked == MESSAGES
        yield made
    finally:
        made.stop_all()


@pytest.fixture(scope="module")
def online(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An online export of every member, once the replicas know every seq is committed."""
    out = tmp_path_factory.mktemp("online") / "export"

    def committed_everywhere() -> bool:
        status, _, _ = run_cli("--out", str(out), "--cluster", cluster.address(1),
                               "--secret-file", str(cluster.secret_path), "--force")
        return status == 0 and all(
            row["commit_seq"] == MESSAGES
            for i in (1, 2, 3) for row in rows(out / f"n{i}", schema.STREAMS_FILE))

    wait_until(committed_everywhere, commit_wait_s, interval_s=0.5,
               what="an export with every replica's commit seq at the last seq")
    return out


def test_every_member_exports_itself_online_with_equal_digests(
        cluster: LocalCluster, online: Path) -> None:
    exports = {f"n{i}": online / f"n{i}" for i in (1, 2, 3)}
    assert sorted(p.name for p in online.iterdir()) == sorted(exports)
    manifests = {node: schema.Manifest.read(path) for node, path in exports.items()}
    assert {m.source for m in manifests.values()} == {"online"}
    assert len({m.cluster for m in manifests.values()}) == 1 != ""
    assert all(m.members == ["n1", "n2", "n3"] for m in manifests.values())
    assert all(m.rows[schema.MESSAGES_FILE] == MESSAGES for m in manifests.values())
    copies = {node: by_seq(path) for node, path in exports.items()}
    first = copies["n1"]
    assert sorted(first) == list(range(1, MESSAGES + 1))
    for node, copy in copies.items():
        assert {seq: (row["digest"], row["epoch"]) for seq, row in copy.items()} == {
            seq: (row["digest"], row["epoch"]) for seq, row in first.items()}, node
        assert {row["node"] for row in copy.values()} == {node}
    metas = {node: rows(path, schema.META_FILE) for node, path in exports.items()}
    assert all(len(meta) == 1 and meta[0]["stream"] == STREAM for meta in metas.values())
    # A node removes its work directory once its answer stream has ended, a moment after the
    # client has the last chunk.
    wait_until(lambda: work_dirs(cluster) == [], cleanup_wait_s,
               what="every export's work directory removed")


def test_the_export_needs_the_admin_credential(cluster: LocalCluster, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAFTLOG_SECRET_FILE", raising=False)
    status, _, err = run_cli("--out", str(tmp_path / "x"), "--cluster", cluster.address(2))
    assert status == 1, err
    for node in ("n1", "n2", "n3"):
        assert f"{node}: not exported: UNAUTHENTICATED" in err, err
    assert not (tmp_path / "x").exists() or list((tmp_path / "x").iterdir()) == []
    with grpc.insecure_channel(cluster.address(1)) as channel:
        stub: Any = cluster_pb2_grpc.ClusterStub(channel)  # type: ignore[no-untyped-call]
        for metadata in ((), ((ADMIN_TOKEN_HEADER, "v1.admin.0.0.forged"),)):
            with pytest.raises(grpc.RpcError) as raised:
                list(stub.ExportAudit(cluster_pb2.ExportAuditRequest(), metadata=metadata,
                                      timeout=call_timeout_s))
            assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
            refused = from_rpc_error(raised.value)
            assert refused is not None and refused.reason is Reason.UNAUTHENTICATED


def test_one_export_at_a_time_and_nothing_left_when_the_caller_goes_away(
        cluster: LocalCluster) -> None:
    """The first export's exporter is held (SIGSTOP) so that it is surely under way; then the
    second is refused, the first's caller goes away, and the node stops the exporter and
    removes the checkpoint."""
    token = cluster.credential().token(principal="admin", method=EXPORT_METHOD)
    with grpc.insecure_channel(cluster.address(1)) as channel:
        stub: Any = cluster_pb2_grpc.ClusterStub(channel)  # type: ignore[no-untyped-call]

        def export() -> Any:
            return stub.ExportAudit(cluster_pb2.ExportAuditRequest(), timeout=60,
                                    metadata=((ADMIN_TOKEN_HEADER, token),))

        first, held = None, None
        for _ in range(hold_attempts_max):  # the exporter may end before it is seen
            first = export()
            reader = threading.Thread(target=lambda call=first: _drain(call))
            reader.start()
            wait_until(lambda thread=reader: bool(exporters(cluster)) or not thread.is_alive(),
                       cleanup_wait_s, interval_s=0.01, what="the first export under way")
            with contextlib.suppress(ProcessLookupError, ValueError):
                held = exporters(cluster)[0]
                os.kill(held, signal.SIGSTOP)
                break
            reader.join(timeout=call_timeout_s)
        assert first is not None and held is not None, "never saw the exporter run"
        try:
            with pytest.raises(grpc.RpcError) as raised:
                list(export())
            assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            refused = from_rpc_error(raised.value)
            assert refused is not None and refused.reason is Reason.EXPORT_RUNNING
            assert work_dirs(cluster)
        finally:
            first.cancel()
            reader.join(timeout=call_timeout_s)
    wait_until(lambda: not work_dirs(cluster) and not exporters(cluster), cleanup_wait_s,
               what="the exporter stopped, the checkpoint and its files removed")
    # The slot is free again: a whole export goes through.
    status, _, err = run_cli("--out", str(cluster.root.parent / "again"), "--cluster",
                             cluster.address(1), "--secret-file", str(cluster.secret_path))
    assert status == 0, err


def _drain(call: Any) -> None:
    """Reads the call to its end; a cancelled call ends it too."""
    try:
        for _ in call:
            pass
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.CANCELLED, err


def test_a_stopped_member_exports_offline_and_each_injection_changes_its_rows(
        cluster: LocalCluster, online: Path, tmp_path: Path) -> None:
    data = cluster.spec(3).data_dir
    status, _, err = run_cli("--out", str(tmp_path / "busy"), "--data-dir", str(data),
                             "--node-id", "n3")
    assert status == 1 and "in use by a running node" in err, err
    cluster.stop(3)
    status, _, err = run_cli("--out", str(tmp_path / "two"), "--cluster", cluster.address(1),
                             "--secret-file", str(cluster.secret_path))
    assert status == 1 and "n3: not exported: cannot reach" in err, err
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["n1", "n2"]
    status, _, err = run_cli("--out", str(tmp_path / "off"), "--data-dir", str(data),
                             "--node-id", "n3")
    assert status == 0, err
    offline = tmp_path / "off" / "n3"
    assert schema.Manifest.read(offline).source == "offline"
    assert {seq: row["digest"] for seq, row in by_seq(offline).items()} == {
        seq: row["digest"] for seq, row in by_seq(online / "n3").items()}
    assert {row["commit_seq"] for row in rows(offline, schema.STREAMS_FILE)} == {None}
    [meta] = rows(offline, schema.META_FILE)
    assert meta["stream"] == STREAM
    assert meta["applied_index"] >= rows(online / "n3", schema.META_FILE)[0]["applied_index"]
    Injections(data, tmp_path).check_each()


class Injections:
    """Exports the stopped node before and after each injection and compares the rows."""

    def __init__(self, data: Path, tmp_path: Path) -> None:
        self.data = data
        self.tmp = tmp_path
        self.round = 0
        self.before = self.export()

    def export(self) -> Path:
        self.round += 1
        out = self.tmp / f"round{self.round}"
        export_node(self.data, out, node_id="n3", source=SOURCE_OFFLINE, clock=SystemClock())
        return out / "n3"

    def changed(self) -> tuple[dict[int, tuple[Any, Any]], dict[str, tuple[Any, Any]],
                               dict[tuple[str, str, str], tuple[Any, Any]]]:
        """What the last injection changed: messages by seq (of STREAM), stream rows by name,
        consumer rows by (stream, consumer, holder); each (before, after), None = absent."""
        after = self.export()
        messages = _diff(by_seq(self.before), by_seq(after))
        streams = _diff({r["stream"]: r for r in rows(self.before, schema.STREAMS_FILE)},
                        {r["stream"]: r for r in rows(after, schema.STREAMS_FILE)})
        consumers = _diff(
            {(r["stream"], r["consumer"], r["holder"]): r
             for r in rows(self.before, schema.CONSUMERS_FILE)},
            {(r["stream"], r["consumer"], r["holder"]): r
             for r in rows(after, schema.CONSUMERS_FILE)})
        assert rows(self.before, schema.META_FILE) == rows(after, schema.META_FILE)
        self.before = after
        return messages, streams, consumers

    def check_each(self) -> None:
        self.hole()
        self.tail()
        self.content()
        self.epoch()
        self.epoch_history()
        self.head()
        self.consumer()
        self.unknown_stream()

    def hole(self) -> None:
        inject.make_hole(self.data, STREAM, seq=5)
        messages, streams, consumers = self.changed()
        assert list(messages) == [5] and messages[5][1] is None
        assert _fields(streams[STREAM]) == {"messages", "bytes"} and not consumers
        assert streams[STREAM][1]["messages"] == MESSAGES - 1

    def tail(self) -> None:
        seqs = inject.append_tail(self.data, STREAM, count=2)
        messages, streams, _ = self.changed()
        assert seqs == [MESSAGES + 1, MESSAGES + 2] and sorted(messages) == seqs
        assert all(before is None and after["epoch"] == 1 for before, after in messages.values())
        assert _fields(streams[STREAM]) == {"last_seq", "messages", "bytes"}
        assert streams[STREAM][1]["last_seq"] == MESSAGES + 2

    def content(self) -> None:
        inject.change_content(self.data, STREAM, seq=7, payload=b"something else")
        messages, streams, _ = self.changed()
        assert list(messages) == [7] and _fields(messages[7]) == {"digest", "digest_key", "size"}
        assert _fields(streams[STREAM]) == {"bytes"}

    def epoch(self) -> None:
        inject.change_epoch(self.data, STREAM, seq=9, epoch=7)
        messages, streams, _ = self.changed()
        assert list(messages) == [9] and _fields(messages[9]) == {"epoch"}  # digest kept
        assert _fields(streams[STREAM]) == {"epochs"}
        assert streams[STREAM][1]["epochs"] == [{"epoch": 1, "start_seq": 1},
                                                {"epoch": 7, "start_seq": 9}]

    def epoch_history(self) -> None:
        inject.rewrite_epochs(self.data, STREAM, lower=20, upper=MESSAGES + 2, epoch=9)
        messages, streams, _ = self.changed()
        assert sorted(messages) == list(range(20, MESSAGES + 3))
        assert all(_fields(change) == {"epoch"} for change in messages.values())
        assert _fields(streams[STREAM]) == {"epochs", "last_epoch"}
        assert streams[STREAM][1]["last_epoch"] == 9

    def head(self) -> None:
        removed = inject.move_head(self.data, STREAM, first_seq=4)
        messages, streams, _ = self.changed()
        assert removed == [1, 2, 3] and sorted(messages) == removed
        assert all(after is None for _, after in messages.values())
        assert _fields(streams[STREAM]) == {"first_seq", "messages", "bytes", "epochs"}
        assert streams[STREAM][1]["epochs"][0] == {"epoch": 1, "start_seq": 4}

    def consumer(self) -> None:
        inject.set_store_consumer(self.data, STREAM, "c9", delivered_seq=40, ack_floor=35,
                                  acked=[37])
        messages, streams, consumers = self.changed()
        assert not messages and not streams
        assert consumers == {(STREAM, "c9", "store"): (None, {
            "node": "n3", "stream": STREAM, "consumer": "c9", "holder": "store",
            "delivered_seq": 40, "ack_floor": 35, "acked": [37], "dead_lettered": 0})}

    def unknown_stream(self) -> None:
        stream_id = inject.add_unknown_stream(self.data, "ghost", messages=3)
        messages, streams, _ = self.changed()
        assert not messages and list(streams) == ["ghost"]
        assert streams["ghost"][1]["stream_id"] == stream_id
        assert sorted(by_seq(self.before, "ghost")) == [1, 2, 3]
        assert "ghost" not in {row["stream"] for row in rows(self.before, schema.META_FILE)}


def _diff(before: dict[Any, dict[str, Any]], after: dict[Any, dict[str, Any]]
          ) -> dict[Any, tuple[Any, Any]]:
    return {key: (before.get(key), after.get(key)) for key in sorted({*before, *after})
            if before.get(key) != after.get(key)}


def _fields(change: tuple[Any, Any]) -> set[str]:
    before, after = change
    return {name for name in before if before[name] != after[name]}
