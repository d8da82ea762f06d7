"""The whole classification as pure functions: the export's four tables in, every divergence
(DIVERGENCES rows) out, in two halves a caller may run side by side: `classify_records` (the
big job over the messages) and `classify_copies` (the small tables). No I/O: the caller reads
the tables and collects the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import DataFrame

from raftlog.audit import blocks, consumer_checks, facts, lineup, runs, spark_schema, stream_checks


@dataclass(frozen=True)
class Tables:
    """The export's tables, every node's rows in one DataFrame each (explicit schemas)."""

    messages: DataFrame
    streams: DataFrame
    consumers: DataFrame
    meta: DataFrame


def classify(tables: Tables, *, nodes: Sequence[str], view_nodes: Sequence[str], slots: int,
             stream_facts: DataFrame | None = None) -> DataFrame:
    """Every divergence. `nodes`: the exported node ids; `view_nodes`: those that hold
    metadata; `slots`: the widest replica set; `stream_facts`: `facts.stream_facts` of these
    tables with `facts.with_slots`, when the caller has it already (the job collects the facts
    once, for the report too)."""
    if stream_facts is None:
        stream_facts = facts.with_slots(facts.stream_facts(tables.meta, tables.streams, nodes),
                                        nodes, slots)
    return classify_records(tables, stream_facts, slots).unionByName(
        classify_copies(tables, stream_facts, nodes=nodes, view_nodes=view_nodes))


def classify_records(tables: Tables, stream_facts: DataFrame, slots: int,
                     suspects: Sequence[tuple[str, int]] | None = None) -> DataFrame:
    """The record classes (HOLE, EXTRA_TAIL, CONTENT, EPOCH, HEAD) as runs: the big job.
    Only the rows of blocks that are not clean are lined up; `suspects`: those blocks
    (stream, block) (`blocks.suspect_blocks`), when the caller has collected them."""
    if slots == 0:  # the metadata knows no stream: no record has a replica to compare
        return tables.messages.sparkSession.createDataFrame([], spark_schema.DIVERGENCES)
    if suspects is None:
        messages = blocks.in_blocks(tables.messages, blocks.suspect_blocks(
            blocks.block_groups(tables.messages), stream_facts, slots))
    else:
        spark = tables.messages.sparkSession
        messages = blocks.in_blocks(tables.messages, spark.createDataFrame(
            list(suspects), "stream string, block long"), suspects)
    wide = lineup.line_up(messages, stream_facts, slots)
    return runs.collapse_runs(lineup.classify_records(wide, stream_facts, slots))


def classify_copies(tables: Tables, stream_facts: DataFrame, *, nodes: Sequence[str],
                    view_nodes: Sequence[str]) -> DataFrame:
    """The classes decided per copy, view or consumer, from the small tables."""
    parts = [
        stream_checks.unknown_streams(tables.streams, stream_facts),
        stream_checks.unlisted_replicas(tables.streams, stream_facts),
        stream_checks.not_exported(stream_facts, nodes),
        stream_checks.epoch_histories(tables.streams, stream_facts),
        stream_checks.meta_views(tables.meta, stream_facts, view_nodes),
        consumer_checks.consumer_divergences(tables.consumers, stream_facts, tables.meta),
    ]
    return reduce(DataFrame.unionByName, parts)
