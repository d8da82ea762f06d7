"""The block pass (raftlog.audit.blocks): which blocks it lets through to the line-up, and that
the classification through it finds divergences wherever they are in a long stream."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from raftlog.audit import blocks, classes, facts
from raftlog.audit.classify import classify
from raftlog.audit.divergence import Divergence
from tests.audit.frames import NODES, Export, View, clean_stream, digest

SEQS = 40  # with blocks of 4 seqs: blocks 0 (seqs 1-3) to 10 (seq 40)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blocks, "block_seqs", 4)


def _suspects(spark: SparkSession, export: Export) -> list[tuple[str, int]]:
    tables = export.tables(spark)
    nodes = list(export.nodes)
    stream_facts = facts.with_slots(facts.stream_facts(tables.meta, tables.streams, nodes),
                                    nodes, 3)
    found = blocks.suspect_blocks(blocks.block_groups(tables.messages), stream_facts, 3)
    return sorted((row["stream"], row["block"]) for row in found.collect())


def _found(spark: SparkSession, export: Export) -> list[tuple[str, str, int | None, int | None]]:
    tables = export.tables(spark)
    rows = classify(tables, nodes=list(export.nodes), view_nodes=list(export.nodes), slots=3)
    found = (Divergence.from_row(row.asDict(recursive=True)) for row in rows.collect())
    return sorted((d.cls, d.node, d.first_seq, d.last_seq) for d in found
                  if d.cls in classes.RECORD_CLASSES)


def test_identical_replicas_have_no_suspect_block(spark: SparkSession) -> None:
    assert _suspects(spark, clean_stream(last_seq=SEQS)) == []


def test_each_kind_of_difference_makes_its_block_a_suspect_and_only_it(
        spark: SparkSession) -> None:
    export = clean_stream(last_seq=SEQS)
    export.copy_of("n2").records[9] = (1, digest("s", 9, "other"))  # block 2: content
    del export.copy_of("n3").records[13]  # block 3: a hole
    export.copy_of("n1").records[22] = (2, digest("s", 22))  # block 5: epoch
    for seq in (41, 42):  # block 10: a tail only n1 holds
        export.copy_of("n1").records[seq] = (1, digest("s", seq))
    assert _suspects(spark, export) == [("s", 2), ("s", 3), ("s", 5), ("s", 10)]
    assert _found(spark, export) == sorted([
        (classes.EPOCH, "n1", 22, 22), (classes.EXTRA_TAIL, "n1", 41, 42),
        (classes.CONTENT, "n2", 9, 9), (classes.HOLE, "n3", 13, 13)])


def test_a_copy_missing_a_whole_block_makes_it_a_suspect(spark: SparkSession) -> None:
    export = clean_stream(last_seq=SEQS)
    for seq in (16, 17, 18, 19):  # all of block 4
        del export.copy_of("n2").records[seq]
    assert _suspects(spark, export) == [("s", 4)]
    assert _found(spark, export) == [(classes.HOLE, "n2", 16, 19)]


def test_records_all_replicas_agree_on_under_an_epoch_the_history_denies_are_suspects(
        spark: SparkSession) -> None:
    """Every copy the same, but seqs 30-33 claim epoch 1 where the history says epoch 2
    starts at 29: no comparison of copies can see that, the span check does."""
    export = clean_stream(last_seq=SEQS, view=View("s", history=((1, 1), (2, 29))))
    for copy in export.copies:
        for seq in range(29, SEQS + 1):
            copy.records[seq] = (2 if seq < 30 or seq > 33 else 1, digest("s", seq))
    assert _suspects(spark, export) == [("s", 7), ("s", 8)]
    assert _found(spark, export) == [(classes.EPOCH, node, 30, 33) for node in NODES]


def test_a_stream_without_an_exported_copy_on_a_listed_node_is_all_suspect(
        spark: SparkSession) -> None:
    export = clean_stream(last_seq=8)
    export.copies = [c for c in export.copies if c.node != "n3"]
    assert _suspects(spark, export) == [("s", 0), ("s", 1), ("s", 2)]


def test_block_ranges_merge_consecutive_blocks_per_stream() -> None:
    assert blocks.block_ranges([("a", 3), ("a", 1), ("a", 2), ("b", 2), ("a", 7)]) == [
        ("a", 4, 15), ("a", 28, 31), ("b", 8, 11)]
