"""The audit job: read the export, classify with Spark, collect the result. The I/O edge of
the Spark side: everything it calls is a pure DataFrame transform.

`audit` runs on a session the caller owns (the CLI builds one, tests share one); `AuditResult`
is everything the report and the repair plan are made from.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from raftlog.audit import blocks, classes, facts, read, samples, schema
from raftlog.audit.classify import Tables, classify_copies, classify_records
from raftlog.audit.divergence import Divergence
from raftlog.audit.inputs import ExportSet
from raftlog.audit.progress import Progress

# Record divergence rows (runs) brought to the driver: the driver's memory stays bounded
# whatever the export holds; past it the result says it is truncated. (The other classes are
# bounded by streams x nodes and consumers.)
divergences_max = 200_000


@dataclass
class AuditResult:
    exports: ExportSet
    divergences: list[Divergence]
    notes: list[Divergence]  # NOTE_CLASSES rows: reported, not divergences
    streams: list[dict[str, Any]]  # per stream the metadata knows: replicas, ends, copies
    records: dict[tuple[str, int], list[dict[str, Any]]]  # (stream, seq) -> every node's record
    figures: dict[str, Any]
    timing_s: dict[str, float]
    spark: dict[str, Any] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not self.divergences

    def note_lines(self) -> list[str]:
        """A line per node with notes: what was not judged, and why."""
        per_node: dict[str, list[Divergence]] = {}
        for item in self.notes:
            per_node.setdefault(item.node, []).append(item)
        lines = []
        for node, items in sorted(per_node.items()):
            first = items[0].evidence
            streams = len({d.stream for d in items if not d.consumer})
            consumers = len({(d.stream, d.consumer) for d in items if d.consumer})
            lines.append(
                f"note: {node}'s metadata view had applied {first.get('applied_index')} Raft "
                f"entries, the newest {first.get('newest_applied_index')} "
                f"({first.get('view_node')}): {streams} stream entries and {consumers} "
                "consumer states that differ were not judged (VIEW_BEHIND); export an idle "
                "cluster to judge them")
        return lines


def audit(spark: SparkSession, exports: ExportSet, progress: Progress) -> AuditResult:
    tables = _read(spark, exports)
    nodes = exports.node_ids
    view_nodes = [n.node for n in exports.nodes if n.manifest.cluster or n.rows[schema.META_FILE]]
    with progress.phase("facts", "stream facts (metadata view, replica sets, committed ends)"):
        base = facts.stream_facts(tables.meta, tables.streams, nodes)
        collected = base.collect()
        slots = max((len(row["replicas"]) for row in collected), default=0)
        # Held on the driver from here: the classification's many uses of the facts read a
        # local relation instead of recomputing them from the files.
        stream_facts = facts.with_slots(spark.createDataFrame(collected, base.schema), nodes,
                                        slots)
        fact_rows = [row.asDict(recursive=True) for row in collected]
    progress.say(f"{len(fact_rows)} streams known to the metadata, replica sets up to {slots}")
    message_rows = exports.rows(schema.MESSAGES_FILE)
    with progress.phase("classify", f"comparing {message_rows:,} message rows of "
                        f"{len(nodes)} nodes block by block, classifying"):
        # The small tables' checks beside the messages' passes: their planning and their
        # many small stages overlap.
        with ThreadPoolExecutor(max_workers=1) as pool:
            copies = pool.submit(DataFrame.collect, classify_copies(
                tables, stream_facts, nodes=nodes, view_nodes=view_nodes))
            suspects, rows_read = _suspect_blocks(spark, tables.messages, stream_facts, slots)
            progress.say(f"read {rows_read:,} message rows; {len(suspects):,} blocks of "
                         f"{blocks.block_seqs:,} seqs differ somewhere"
                         + (", lining them up" if suspects else ""))
            collected_rows = classify_records(tables, stream_facts, slots, suspects).limit(
                divergences_max + 1).collect() if suspects else []
            collected_rows += copies.result()
        everything = sorted((Divergence.from_row(row.asDict(recursive=True))
                             for row in collected_rows), key=Divergence.sort_key)
        found = [d for d in everything if d.cls not in classes.NOTE_CLASSES]
        notes = [d for d in everything if d.cls in classes.NOTE_CLASSES]
    truncated = sum(1 for d in found if d.cls in classes.RECORD_CLASSES) > divergences_max
    if truncated:
        progress.say(f"warning: more than {divergences_max:,} record divergences; the report "
                     "and the plan hold some of them only: repair those, then audit again")
    progress.say(f"{len(found)} divergences" + (f", {len(notes)} notes" if notes else ""))
    with progress.phase("samples", "reading the records behind the evidence"):
        records = _records(spark, tables.messages, found)
    seconds = progress.timing_s["classify"]
    figures = {"message_rows": message_rows, "message_rows_read": rows_read,
               "streams": len(fact_rows), "nodes": len(nodes), "divergences": len(found),
               "notes": len(notes),
               "suspect_blocks": len(suspects), "block_seqs": blocks.block_seqs,
               "classify_s": seconds, "truncated": truncated,
               "rows_per_s": round(rows_read / seconds) if seconds > 0 else None,
               "per_class": {name: sum(1 for d in found if d.cls == name)
                             for name in classes.ORDER}}
    return AuditResult(exports=exports, divergences=_with_digests(found, records), notes=notes,
                       streams=_stream_rows(fact_rows), records=records, figures=figures,
                       timing_s=dict(progress.timing_s), spark=describe(spark))


def describe(spark: SparkSession) -> dict[str, Any]:
    context = spark.sparkContext
    return {"master": context.master, "version": spark.version,
            "app_id": context.applicationId,
            "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions")}


def _suspect_blocks(spark: SparkSession, messages: DataFrame, stream_facts: DataFrame,
                    slots: int) -> tuple[list[tuple[str, int]], int]:
    """The blocks that are not clean, and the message rows read: one pass over the rows."""
    if slots == 0:
        return [], 0
    read = Observation("blocks")
    groups = blocks.block_groups(messages).observe(read, F.sum("rows").alias("rows"))
    suspects = [(row["stream"], row["block"]) for row in
                blocks.suspect_blocks(groups, stream_facts, slots).collect()]
    return suspects, int(read.get.get("rows") or 0)


def _read(spark: SparkSession, exports: ExportSet) -> Tables:
    return Tables(*(read.read_table(spark, exports, name) for name in (
        schema.MESSAGES_FILE, schema.STREAMS_FILE, schema.CONSUMERS_FILE, schema.META_FILE)))


def _records(spark: SparkSession, messages: DataFrame, found: list[Divergence]
             ) -> dict[tuple[str, int], list[dict[str, Any]]]:
    keys = samples.sample_keys(found)
    if not keys:
        return {}
    key_frame = spark.createDataFrame(keys, "stream string, seq long")
    rows = samples.records_at(messages, key_frame, [seq for _, seq in keys]).collect()
    records: dict[tuple[str, int], list[dict[str, Any]]] = {key: [] for key in keys}
    for row in sorted(rows, key=lambda r: (r["stream"], r["seq"], r["node"])):
        records[(row["stream"], row["seq"])].append(row.asDict())
    return records


def _with_digests(found: list[Divergence], records: dict[tuple[str, int], list[dict[str, Any]]]
                  ) -> list[Divergence]:
    """Adds the real digests (the node's, the authority's) at each record divergence's first
    seq to its evidence, where that seq was read back."""
    for item in found:
        at = records.get((item.stream, item.first_seq or 0))
        if not at or item.cls not in classes.RECORD_CLASSES:
            continue
        by_hash = {row["digest_hash"]: row["digest"] for row in at}
        mine = next((row for row in at if row["node"] == item.node), None)
        if mine is not None:
            item.evidence["digest"] = mine["digest"]
        authority = item.evidence.get("authority_digest_hash")
        if authority in by_hash:
            item.evidence["authority_digest"] = by_hash[authority]
    return found


def _stream_rows(fact_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keep = ("stream", "stream_id", "primary", "replicas", "majority", "committed_end", "head",
            "heads", "lasts", "view_node", "applied_index", "fence_epoch", "history",
            "incomplete")
    return sorted(({name: row.get(name) for name in keep} for row in fact_rows),
                  key=lambda row: str(row["stream"]))
