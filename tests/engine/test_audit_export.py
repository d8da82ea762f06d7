"""The audit export of one node (raftlog.audit.export), offline, on a tmp RocksDB written by the
engine's own store, the consumer store and a real one-member Raft group (journal and snapshot
in that database and data directory): every table read back with pyarrow, column by column.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from raftlog.audit import schema
from raftlog.audit.export import SOURCE_OFFLINE, ExportExists, export_node
from raftlog.audit.export_meta import cluster_fingerprint, meta_view
from raftlog.audit.export_rows import message_digest
from raftlog.audit.export_source import SourceError, check_not_in_use, locate, open_read_only
from raftlog.base.clock import FakeClock
from raftlog.base.errors import RaftlogError, Reason
from raftlog.internal import storage_pb2
from raftlog.node.consumers.rocks_store import RocksConsumerStore
from raftlog.node.engine.rocks_store import RocksMessageStore
from raftlog.node.engine.storage import CF_RAFT_LOG, CF_RAFT_META, GroupCommitter, Storage
from raftlog.node.engine.streams import NoConsumers, StreamEngine
from raftlog.raft import commands as c
from raftlog.raft.api import ensure_ok
from raftlog.raft.group import RaftGroup, RaftTimings
from raftlog.raft.replay import regular_command
from raftlog.raft.state_model import MetaState
from raftlog.v1 import consumers_pb2, streams_pb2, types_pb2

NOW_MS = 1_700_000_000_000
leader_timeout_s = 10.0
snapshot_timeout_s = 10.0
propose_timeout_s = 5.0
# The group snapshots once its journal holds more entries than this: the first commands end up
# in the snapshot file, the last ones only in the journal.
compaction_entries_min = 6


@dataclass
class Node:
    data_dir: Path
    stored: dict[tuple[str, int], storage_pb2.StoredMessage] = field(default_factory=dict)
    stream_ids: dict[str, int] = field(default_factory=dict)
    meta: MetaState | None = None
    meta_index: int = 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def entry(subject: str, payload: bytes, **fields: Any) -> streams_pb2.PublishEntry:
    return streams_pb2.PublishEntry(subject=subject, payload=payload, **fields)


async def _fill_streams(engine: StreamEngine, node: Node) -> None:
    await engine.create(types_pb2.StreamConfig(name="orders", subjects=["orders.>"]))
    await engine.create(types_pb2.StreamConfig(name="logs", subjects=["logs.>"]))
    await engine.publish("orders", [
        entry("orders.new", b"same"), entry("orders.new", b"same"),  # equal content
        entry("orders.paid", b"same", msg_id="m-3"),
        entry("orders.new", b"with headers", headers=[types_pb2.Header(key="k", value="v")]),
    ])
    await engine.publish("logs", [entry("logs.x", b"%d" % i) for i in range(3)])
    for name in ("orders", "logs"):
        stream = engine.get(name)
        node.stream_ids[name] = stream.stream_id
        for seq in range(1, stream.last_seq + 1):
            raw = stream.stored_values(from_seq=seq, to_seq=seq, bytes_max=1 << 20)[0]
            node.stored[(name, seq)] = storage_pb2.StoredMessage.FromString(raw)


async def _fill_metadata(storage: Storage, node: Node) -> None:
    """A one-member group over the node's journal column families; some commands end up in the
    snapshot file, the last ones in the journal only."""
    group = RaftGroup(self_address=f"127.0.0.1:{free_port()}", peers=[],
                      journal_db=storage.db, journal_cfs=(CF_RAFT_LOG, CF_RAFT_META),
                      snapshot_path=node.data_dir / "raft" / "snapshot.pb",
                      clock=FakeClock(wall_ms=NOW_MS),
                      timings=RaftTimings(log_compaction_entries_min=compaction_entries_min))
    try:
        await _until(group.is_leader, leader_timeout_s)
        config = types_pb2.StreamConfig(name="orders", subjects=["orders.>"])
        for command in (
            c.member_join(node_id="n1", raft_address="127.0.0.1:1", grpc_address="127.0.0.1:2"),
            c.member_join(node_id="n2", raft_address="127.0.0.1:3", grpc_address="127.0.0.1:4"),
            c.stream_create(config=config, replicas=["n1", "n2"], primary="n1"),
            c.consumer_create(stream="orders", config=consumers_pb2.ConsumerConfig(name="c1")),
            c.consumer_state_update(updates=[c.consumer_progress(
                stream="orders", consumer="c1", ack_floor=1, acked=[3], delivered_seq=3)]),
            c.barrier(), c.barrier(), c.barrier(),
        ):
            ensure_ok(await group.propose(command, timeout_s=propose_timeout_s))
        await _until((node.data_dir / "raft" / "snapshot.pb").exists, snapshot_timeout_s)
        for command in (  # after the snapshot: in the journal only
            c.stream_promote(stream="orders", new_primary="n2", new_fence_epoch=2,
                             epoch_start_seq=5),
            c.consumer_create(stream="orders", config=consumers_pb2.ConsumerConfig(name="c2")),
        ):
            result = ensure_ok(await group.propose(command, timeout_s=propose_timeout_s))
        with group.read_state() as state:
            node.meta = MetaState(members=dict(state.members), streams=dict(state.streams),
                                  consumers={k: dict(v) for k, v in state.consumers.items()})
        node.meta_index = result.index
    finally:
        group.close()


async def _until(predicate: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {predicate}"
        await asyncio.sleep(0.02)


def make_node(data_dir: Path, *, raft: bool = True) -> Node:
    node = Node(data_dir)

    async def main() -> None:
        storage = Storage(data_dir)
        committer = GroupCommitter(storage)
        committer.start(asyncio.get_running_loop())
        engine = StreamEngine(store=RocksMessageStore(storage, committer),
                              clock=FakeClock(wall_ms=NOW_MS), consumers=NoConsumers())
        try:
            engine.load()
            await _fill_streams(engine, node)
            await RocksConsumerStore(
                storage=storage, committer=committer,
                stream_id=lambda name: engine.get(name).stream_id,
            ).save("orders", storage_pb2.ConsumerRecord(
                config=consumers_pb2.ConsumerConfig(name="c1"), delivered_seq=4, ack_floor=2,
                acked=[4, 3], num_dead_lettered=1))
            if raft:
                await _fill_metadata(storage, node)
        finally:
            await engine.stop()
            committer.stop()
            storage.close()

    asyncio.run(main())
    return node


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Node, Path]:
    root = tmp_path_factory.mktemp("audit-export")
    node = make_node(root / "n1")
    export_node(node.data_dir, root / "export", node_id="n1", source=SOURCE_OFFLINE,
                clock=FakeClock(wall_ms=NOW_MS + 5))
    return node, root / "export" / "n1"


def table(path: Path, name: str) -> list[dict[str, Any]]:
    read = pq.read_table(path / name)
    assert read.schema.equals(schema.SCHEMAS[name]), read.schema
    rows: list[dict[str, Any]] = read.to_pylist()
    return rows


def test_every_message_is_a_row_with_every_column(exported: tuple[Node, Path]) -> None:
    node, path = exported
    rows = table(path, schema.MESSAGES_FILE)
    assert [(row["stream"], row["seq"]) for row in rows] == sorted(
        node.stored, key=lambda key: (node.stream_ids[key[0]], key[1]))
    for row in rows:
        stored = node.stored[(row["stream"], row["seq"])]
        assert row == {
            "node": "n1", "stream": row["stream"], "stream_id": node.stream_ids[row["stream"]],
            "seq": row["seq"], "epoch": 1, "subject": stored.subject, "ts_ms": NOW_MS,
            "size": len(stored.payload), "msg_id": stored.msg_id,
            "digest": message_digest(stored),
            "digest_key": schema.digest_key(message_digest(stored))}
    orders = {row["seq"]: row for row in rows if row["stream"] == "orders"}
    assert orders[3]["msg_id"] == "m-3" and orders[4]["size"] == len(b"with headers")


def test_digests_are_equal_for_equal_content_and_leave_the_epoch_out(
        exported: tuple[Node, Path]) -> None:
    _, path = exported
    digest = {(row["stream"], row["seq"]): row["digest"]
              for row in table(path, schema.MESSAGES_FILE)}
    assert digest[("orders", 1)] == digest[("orders", 2)]  # same subject, payload, time
    assert len({digest[("orders", seq)] for seq in (2, 3, 4)}) == 3  # subject / payload differ
    assert len({digest[("logs", seq)] for seq in (1, 2, 3)}) == 3
    message = storage_pb2.StoredMessage(subject="a", payload=b"p", ts_ms=7, epoch=1)
    later = storage_pb2.StoredMessage(subject="a", payload=b"p", ts_ms=7, epoch=9)
    other = storage_pb2.StoredMessage(subject="a", payload=b"q", ts_ms=7, epoch=1)
    assert message_digest(message) == message_digest(later) != message_digest(other)
    assert all(len(value) == 64 and value == value.lower() for value in digest.values())


def test_a_streams_row_holds_the_record_and_the_epochs_of_its_messages(
        exported: tuple[Node, Path]) -> None:
    node, path = exported
    rows = {row["stream"]: row for row in table(path, schema.STREAMS_FILE)}
    assert rows["orders"] == {
        "node": "n1", "stream": "orders", "stream_id": node.stream_ids["orders"],
        "first_seq": 1, "last_seq": 4, "commit_seq": None, "epoch": 1, "fenced_epoch": 0,
        "last_epoch": 1, "messages": 4,
        "bytes": sum(len(m.subject) + len(m.payload) + sum(len(h.key) + len(h.value)
                                                          for h in m.headers)
                     for (name, _), m in node.stored.items() if name == "orders"),
        "created_ms": NOW_MS, "epochs": [{"epoch": 1, "start_seq": 1}]}
    assert rows["logs"]["last_seq"] == 3 and rows["logs"]["messages"] == 3


def test_consumers_come_from_the_store_and_from_the_metadata(
        exported: tuple[Node, Path]) -> None:
    _, path = exported
    rows = sorted(table(path, schema.CONSUMERS_FILE),
                  key=lambda row: (row["holder"], row["consumer"]))
    assert rows == [
        {"node": "n1", "stream": "orders", "consumer": "c1", "holder": "raft",
         "delivered_seq": 3, "ack_floor": 1, "acked": [3], "dead_lettered": None},
        {"node": "n1", "stream": "orders", "consumer": "c2", "holder": "raft",
         "delivered_seq": 0, "ack_floor": 0, "acked": [], "dead_lettered": None},
        {"node": "n1", "stream": "orders", "consumer": "c1", "holder": "store",
         "delivered_seq": 4, "ack_floor": 2, "acked": [3, 4], "dead_lettered": 1},
    ]


def test_the_meta_view_is_the_snapshot_and_the_journal_replayed(
        exported: tuple[Node, Path]) -> None:
    node, path = exported
    assert node.meta is not None
    [row] = table(path, schema.META_FILE)
    assert row == {
        "node": "n1", "stream": "orders", "stream_id": node.meta.streams["orders"].stream_id,
        "primary": "n2", "replicas": ["n1", "n2"], "fence_epoch": 2, "epoch_start_seq": 5,
        "epoch_history": [{"epoch": 1, "start_seq": 1}, {"epoch": 2, "start_seq": 5}],
        "applied_index": row["applied_index"]}
    # The stored commit index may lag the last command by the journal's lazy save; it is
    # saved on close, so here it reaches it.
    assert row["applied_index"] >= node.meta_index
    files = locate(node.data_dir)
    with open_read_only(files.db_dir) as db:
        view = meta_view(db, snapshot=files.snapshot)
    assert 0 < view.snapshot_index < node.meta_index <= view.index == row["applied_index"]
    manifest = schema.Manifest.read(path)
    assert manifest.applied_index == row["applied_index"]
    assert manifest.members == ["n1", "n2"]
    assert manifest.cluster == cluster_fingerprint(node.meta) != ""
    assert manifest == schema.Manifest(
        node="n1", source="offline", exported_ms=NOW_MS + 5, cluster=manifest.cluster,
        applied_index=manifest.applied_index, members=["n1", "n2"],
        rows={schema.MESSAGES_FILE: 7, schema.STREAMS_FILE: 2, schema.CONSUMERS_FILE: 3,
              schema.META_FILE: 1})


def test_a_node_without_metadata_exports_empty_meta(tmp_path: Path) -> None:
    node = make_node(tmp_path / "n1", raft=False)
    manifest = export_node(node.data_dir, tmp_path / "out", node_id="n1",
                           source=SOURCE_OFFLINE, clock=FakeClock(), skip_messages=True)
    assert (manifest.cluster, manifest.members, manifest.applied_index) == ("", [], 0)
    assert manifest.rows[schema.META_FILE] == 0 and manifest.skipped == [schema.MESSAGES_FILE]
    assert table(tmp_path / "out" / "n1", schema.MESSAGES_FILE) == []
    [store] = table(tmp_path / "out" / "n1", schema.CONSUMERS_FILE)
    assert store["holder"] == "store"


def test_an_export_never_overwrites_unless_asked_and_leaves_no_partial_files(
        exported: tuple[Node, Path], tmp_path: Path) -> None:
    node, _ = exported
    out = tmp_path / "out"
    export_node(node.data_dir, out, node_id="n1", source=SOURCE_OFFLINE, clock=FakeClock())
    with pytest.raises(ExportExists):
        export_node(node.data_dir, out, node_id="n1", source=SOURCE_OFFLINE,
                    clock=FakeClock())
    export_node(node.data_dir, out, node_id="n1", source=SOURCE_OFFLINE, clock=FakeClock(),
                replace=True)
    assert sorted(p.name for p in out.iterdir()) == ["n1"]
    assert sorted(p.name for p in (out / "n1").iterdir()) == sorted(
        [schema.MANIFEST, *schema.TABLE_FILES])
    with pytest.raises(SourceError):
        export_node(tmp_path / "nothing", out, node_id="n2", source=SOURCE_OFFLINE,
                    clock=FakeClock())
    assert sorted(p.name for p in out.iterdir()) == ["n1"]


def test_the_export_writes_nothing_into_the_node_and_refuses_an_open_database(
        exported: tuple[Node, Path], tmp_path: Path) -> None:
    node, _ = exported
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size)
              for p in node.data_dir.rglob("*") if p.is_file()}
    export_node(node.data_dir, tmp_path / "out", node_id="n1", source=SOURCE_OFFLINE,
                clock=FakeClock())
    after = {p: (p.stat().st_mtime_ns, p.stat().st_size)
             for p in node.data_dir.rglob("*") if p.is_file()}
    assert after == before
    check_not_in_use(node.data_dir / "db")  # nobody holds it


def test_a_journal_entry_is_read_as_pysyncobj_wrote_it_and_never_runs_code() -> None:
    command = c.barrier(now_ms=5).SerializeToString()
    assert regular_command(b"\x00" + pickle.dumps((0, (command,)), protocol=5),
                           index=3) == command
    assert regular_command(b"\x01", index=1) is None  # a new leader's NO_OP
    assert regular_command(b"\x02" + pickle.dumps(["add", "a:1", None]), index=2) is None
    evil = b"\x00" + pickle.dumps((0, (os.system,)), protocol=5)
    with pytest.raises(RaftlogError) as raised:
        regular_command(evil, index=4)
    assert raised.value.reason is Reason.CORRUPT_RECORD
