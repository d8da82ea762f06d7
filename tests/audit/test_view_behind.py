"""Metadata views at different points of the Raft log (an online export, or nodes stopped one
after another): a view that had applied fewer entries than the newest is not judged against it
(VIEW_BEHIND notes, the audit stays clean), unless its state is wrong whatever the index (a
consumer past the committed end); views at the same index that differ are divergences."""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import SparkSession

from raftlog.audit import classes
from raftlog.audit.classify import classify
from raftlog.audit.divergence import Divergence
from tests.audit.frames import NODES, Export, clean_stream, consumer_row
from tests.audit.test_cli import _run


def _export(*, n3_index: int, n3_floor: int = 3) -> Export:
    """n3's view of stream s names another primary and an older consumer state; its applied
    index is `n3_index` (the others' is 100)."""
    export = clean_stream()
    n3 = export.views["n3"][0]
    n3.primary, n3.applied_index = "n2", n3_index
    export.consumers = [consumer_row(node, delivered_seq=8, ack_floor=6, acked=())
                        for node in ("n1", "n2")]
    export.consumers.append(consumer_row("n3", delivered_seq=max(5, n3_floor),
                                         ack_floor=n3_floor, acked=()))
    return export


def _found(spark: SparkSession, export: Export) -> list[tuple[str, str, str | None]]:
    rows = classify(export.tables(spark), nodes=NODES, view_nodes=NODES, slots=3).collect()
    return sorted(((d.cls, d.node, d.holder) for d in (
        Divergence.from_row(row.asDict(recursive=True)) for row in rows)),
                  key=lambda t: (t[0], t[1], t[2] or ""))


def test_a_view_behind_the_newest_is_a_note_not_a_divergence(spark: SparkSession) -> None:
    assert _found(spark, _export(n3_index=90)) == [
        (classes.VIEW_BEHIND, "n3", None), (classes.VIEW_BEHIND, "n3", "raft")]


def test_the_same_differences_at_the_same_index_are_divergences(spark: SparkSession) -> None:
    assert _found(spark, _export(n3_index=100)) == [
        (classes.CONSUMER, "n3", "raft"), (classes.META_VIEW, "n3", None)]


def test_a_consumer_past_the_log_is_a_divergence_even_on_a_view_behind(
        spark: SparkSession) -> None:
    assert _found(spark, _export(n3_index=90, n3_floor=12)) == [
        (classes.CONSUMER, "n3", "raft"), (classes.VIEW_BEHIND, "n3", None)]


def test_the_audit_of_views_behind_is_clean_and_says_what_it_did_not_judge(
        spark: SparkSession, tmp_path: Path) -> None:
    root = _export(n3_index=90).write(tmp_path / "export")
    status, stdout, _ = _run(spark, root, tmp_path / "out")
    assert status == 0, stdout
    assert ("note: n3's metadata view had applied 90 Raft entries, the newest 100 (n1): 1 "
            "stream entries and 1 consumer states that differ were not judged") in stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["clean"] is True and report["divergences"] == []
    assert [n["class"] for n in report["notes"]] == [classes.VIEW_BEHIND] * 2
    plan = json.loads((tmp_path / "out" / "repair.json").read_text())
    assert plan["actions"] == [] and plan["unplanned"] == []
