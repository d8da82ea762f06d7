"""Tiny inline exports for the audit's tests: rows as dicts built per table, turned into
DataFrames with the explicit Spark schemas (or written as an export directory).

`Copy` describes one node's copy of a stream by its records; `clean_stream` gives the usual
three identical replicas, which a test then changes in one place.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from raftlog.audit import schema, spark_schema, synthetic
from raftlog.audit.classify import Tables
from raftlog.audit.schema import Manifest

NODES = ("n1", "n2", "n3")
CLUSTER = "c" * 64


def digest(stream: str, seq: int, variant: str = "") -> str:
    return hashlib.sha256(f"{stream}/{seq}{variant}".encode()).hexdigest()


@dataclass
class Copy:
    """One node's copy of one stream: seq -> (epoch, digest)."""

    node: str
    stream: str
    records: dict[int, tuple[int, str]]
    first_seq: int | None = None  # default: the lowest seq held (or 1)
    last_seq: int | None = None  # default: the highest seq held (or 0)
    commit_seq: int | None = None

    def head(self) -> int:
        return self.first_seq if self.first_seq is not None else min(self.records, default=1)

    def tail(self) -> int:
        return self.last_seq if self.last_seq is not None else max(self.records, default=0)

    def message_rows(self) -> list[dict[str, Any]]:
        return [{"node": self.node, "stream": self.stream, "stream_id": 1, "seq": seq,
                 "epoch": epoch, "subject": f"{self.stream}.x", "ts_ms": 1_000 + seq,
                 "size": 10, "msg_id": "", "digest": value,
                 "digest_key": schema.digest_key(value)}
                for seq, (epoch, value) in sorted(self.records.items())]

    def stream_row(self) -> dict[str, Any]:
        epochs: list[dict[str, int]] = []
        for seq, (epoch, _) in sorted(self.records.items()):
            if not epochs or epochs[-1]["epoch"] != epoch:
                epochs.append({"epoch": epoch, "start_seq": seq})
        last_epoch = self.records[max(self.records)][0] if self.records else 0
        return {"node": self.node, "stream": self.stream, "stream_id": 1,
                "first_seq": self.head(), "last_seq": self.tail(), "commit_seq": self.commit_seq,
                "epoch": last_epoch, "fenced_epoch": last_epoch, "last_epoch": last_epoch,
                "messages": len(self.records), "bytes": 10 * len(self.records),
                "created_ms": 1, "epochs": epochs}


def records(stream: str, seqs: Iterable[int], epoch: int = 1) -> dict[int, tuple[int, str]]:
    return {seq: (epoch, digest(stream, seq)) for seq in seqs}


@dataclass
class View:
    """The metadata's view of one stream, as every node holds it unless a test changes one."""

    stream: str
    replicas: tuple[str, ...] = NODES
    primary: str = "n1"
    history: tuple[tuple[int, int], ...] = ((1, 1),)
    applied_index: int = 100
    stream_id: int = 1

    def row(self, node: str) -> dict[str, Any]:
        epoch, start = self.history[-1]
        return {"node": node, "stream": self.stream, "stream_id": self.stream_id,
                "primary": self.primary, "replicas": list(self.replicas), "fence_epoch": epoch,
                "epoch_start_seq": start, "applied_index": self.applied_index,
                "epoch_history": [{"epoch": e, "start_seq": s} for e, s in self.history]}


@dataclass
class Export:
    """A whole (tiny) cluster export."""

    copies: list[Copy]
    views: dict[str, list[View]]  # node -> its metadata view
    consumers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.views) | {copy.node for copy in self.copies}))

    def copy_of(self, node: str, stream: str = "s") -> Copy:
        return next(c for c in self.copies if c.node == node and c.stream == stream)

    def tables(self, spark: SparkSession) -> Tables:
        return Tables(
            messages=frame(spark, schema.MESSAGES_FILE,
                           [row for c in self.copies for row in c.message_rows()]),
            streams=frame(spark, schema.STREAMS_FILE, [c.stream_row() for c in self.copies]),
            consumers=frame(spark, schema.CONSUMERS_FILE, self.consumers),
            meta=frame(spark, schema.META_FILE,
                       [v.row(node) for node, views in self.views.items() for v in views]))

    def write(self, root: Path, *, nodes: Sequence[str] | None = None,
              cluster: str = CLUSTER) -> Path:
        for node in nodes or self.nodes:
            copies = [c for c in self.copies if c.node == node]
            synthetic.write_node(
                root / node,
                manifest=Manifest(node=node, source="offline", exported_ms=1, cluster=cluster,
                                  applied_index=100, members=list(self.nodes)),
                messages=[row for c in copies for row in c.message_rows()],
                streams=[c.stream_row() for c in copies],
                consumers=[row for row in self.consumers if row["node"] == node],
                meta=[v.row(node) for v in self.views.get(node, [])])
        return root


def frame(spark: SparkSession, table_file: str, rows: Sequence[dict[str, Any]]) -> DataFrame:
    columns = [f.name for f in spark_schema.SCHEMAS[table_file]]
    return spark.createDataFrame([tuple(row.get(name) for name in columns) for row in rows],
                                 spark_schema.SCHEMAS[table_file])


def clean_stream(stream: str = "s", last_seq: int = 10, *, view: View | None = None) -> Export:
    """Three identical replicas of seqs 1..last_seq under epoch 1, every node the same view."""
    view = view or View(stream)
    copies = [Copy(node, stream, records(stream, range(1, last_seq + 1))) for node in NODES]
    return Export(copies=copies, views={node: [replace(view)] for node in NODES})


def consumer_row(node: str, *, holder: str = "raft", stream: str = "s", consumer: str = "c",
                 delivered_seq: int = 5, ack_floor: int = 3, acked: Sequence[int] = (5,),
                 dead_lettered: int = 0) -> dict[str, Any]:
    return {"node": node, "stream": stream, "consumer": consumer, "holder": holder,
            "delivered_seq": delivered_seq, "ack_floor": ack_floor, "acked": list(acked),
            "dead_lettered": dead_lettered}
