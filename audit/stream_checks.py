"""Divergences decided per stream copy or per metadata view (not per record): UNKNOWN_STREAM,
UNLISTED_REPLICA, NOT_EXPORTED, EPOCH_HISTORY and META_VIEW. Each function takes the tables and
`facts.stream_facts` and returns DIVERGENCES rows.

EPOCH_HISTORY rules for a listed copy's `epochs` list ((epoch, first seq held), ascending):
- each entry's epoch must be in the metadata's history (or older than the oldest entry it keeps,
  below that entry's start) and its seq inside the epoch's [start, next start);
- against the primary's copy: an epoch both hold must start at the same seq unless the later of
  the two starts is that copy's head (retention trimmed the epoch's first seqs); an epoch only one
  holds must lie outside the other copy's [first_seq, last_seq].
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from raftlog.audit import classes, facts
from raftlog.audit.spark_schema import divergence_columns, null


def _no_range() -> dict[str, Column]:
    return {"first_seq": null("first_seq"), "last_seq": null("last_seq"), "seqs": null("seqs")}


def _no_consumer() -> dict[str, Column]:
    return {"consumer": null("consumer"), "holder": null("holder"), "sources": null("sources")}


def unknown_streams(streams: DataFrame, stream_facts: DataFrame) -> DataFrame:
    unknown = streams.join(F.broadcast(stream_facts.select("stream")), "stream", "left_anti")
    return unknown.select(*divergence_columns(
        **{"class": F.lit(classes.UNKNOWN_STREAM)}, **_no_consumer(), seqs=F.col("messages"),
        evidence=F.to_json(F.struct("stream_id", "first_seq", "last_seq", "messages",
                                    "last_epoch", "epochs"))))


def unlisted_replicas(streams: DataFrame, stream_facts: DataFrame) -> DataFrame:
    copies = streams.join(F.broadcast(stream_facts.select("stream", "replicas", "primary")),
                          "stream")
    unlisted = copies.where(~F.array_contains("replicas", F.col("node")))
    return unlisted.select(*divergence_columns(
        **{"class": F.lit(classes.UNLISTED_REPLICA)}, **_no_consumer(), seqs=F.col("messages"),
        evidence=F.to_json(F.struct("replicas", "primary", "messages", "last_epoch"))))


def not_exported(stream_facts: DataFrame, nodes: Sequence[str]) -> DataFrame:
    listed = stream_facts.select("stream", "replicas", "primary",
                                 F.explode("replicas").alias("node"))
    missing = listed.where(~F.col("node").isin(*nodes)) if nodes else listed
    return missing.select(*divergence_columns(
        **{"class": F.lit(classes.NOT_EXPORTED)}, **_no_range(), **_no_consumer(),
        evidence=F.to_json(F.struct("replicas", "primary"))))


def epoch_histories(streams: DataFrame, stream_facts: DataFrame) -> DataFrame:
    """EPOCH_HISTORY rows: per stream, every listed copy's epochs list against the history and
    against the primary's copy (all copies of a stream in one row, compared with array
    functions: one shuffle, whatever the number of checks)."""
    copies = streams.join(F.broadcast(stream_facts.select(
        "stream", "replicas", "primary", "history", "ranges", "hist_first_epoch",
        "hist_first_start")), "stream").where(F.array_contains("replicas", F.col("node")))
    entry = F.struct("node", "first_seq", "last_seq",
                     F.coalesce("epochs", F.array()).alias("epochs"))
    per_stream = copies.groupBy("stream").agg(
        F.collect_list(entry).alias("copies"), F.first("primary").alias("primary"),
        F.first("history").alias("history"), F.first("ranges").alias("ranges"),
        F.first("hist_first_epoch").alias("hist_first_epoch"),
        F.first("hist_first_start").alias("hist_first_start"))
    primary_copy = F.try_element_at(F.filter(
        "copies", lambda c: c["node"] == F.col("primary")), F.lit(1))
    each = per_stream.select("*", primary_copy.alias("p"), F.explode("copies").alias("c"))
    problems = F.concat(_against_history(), F.when(
        (F.col("c.node") != F.col("primary")) & F.col("p").isNotNull(), _against_primary())
        .otherwise(F.array().cast("array<string>")))
    found = each.select("stream", F.col("c.node").alias("node"), problems.alias("problems"),
                        F.col("c.epochs").alias("epochs"), "history", "primary",
                        F.col("p.epochs").alias("primary_epochs")).where(F.size("problems") > 0)
    return found.select(*divergence_columns(
        **{"class": F.lit(classes.EPOCH_HISTORY)}, **_no_range(), **_no_consumer(),
        evidence=F.to_json(F.struct("problems", "epochs", "history", "primary",
                                    "primary_epochs"))))


def _against_history() -> Column:
    def bad(entry: Column) -> Column:
        epoch, start = entry["epoch"], entry["start_seq"]
        span = F.try_element_at(F.col("ranges"), epoch)
        older = (start < F.col("hist_first_start")) & (epoch < F.col("hist_first_epoch"))
        unknown = span.isNull() & F.col("hist_first_start").isNotNull() & ~older
        return unknown | (span.isNotNull() & ((start < span["start"]) | (start >= span["end"])))

    return F.transform(F.filter("c.epochs", bad), lambda e: F.format_string(
        "epoch %d (from seq %d) is outside the metadata's epoch history", e["epoch"],
        e["start_seq"]))


def _against_primary() -> Column:
    mine, first, last = F.col("c.epochs"), F.col("c.first_seq"), F.col("c.last_seq")
    theirs, p_first, p_last = F.col("p.epochs"), F.col("p.first_seq"), F.col("p.last_seq")
    with_end = F.transform(theirs, lambda q, i: F.struct(
        q["epoch"].alias("epoch"), q["start_seq"].alias("start_seq"),
        F.coalesce(F.try_element_at(theirs, i + 2)["start_seq"],
                   F.lit(facts.seq_max)).alias("end")))

    def start_differs(e: Column) -> Column:
        return F.exists(theirs, lambda q: (q["epoch"] == e["epoch"])
                        & (q["start_seq"] != e["start_seq"])
                        & ~((e["start_seq"] > q["start_seq"]) & (e["start_seq"] == first))
                        & ~((q["start_seq"] > e["start_seq"]) & (q["start_seq"] == p_first)))

    def extra(e: Column) -> Column:
        return ~F.exists(theirs, lambda q: q["epoch"] == e["epoch"]) & (
            e["start_seq"] >= p_first) & (e["start_seq"] <= p_last)

    def missing(q: Column) -> Column:
        return ~F.exists(mine, lambda e: e["epoch"] == q["epoch"]) & (
            q["start_seq"] <= last) & (q["end"] > first)

    return F.concat(
        F.transform(F.filter(mine, start_differs), lambda e: F.format_string(
            "epoch %d starts at seq %d here, elsewhere on the primary's copy", e["epoch"],
            e["start_seq"])),
        F.transform(F.filter(mine, extra), lambda e: F.format_string(
            "epoch %d (from seq %d) is missing from the primary's copy", e["epoch"],
            e["start_seq"])),
        F.transform(F.filter(with_end, missing), lambda q: F.format_string(
            "epoch %d (from seq %d on the primary's copy) is missing here", q["epoch"],
            q["start_seq"])))


def meta_views(meta: DataFrame, stream_facts: DataFrame, view_nodes: Sequence[str]
               ) -> DataFrame:
    """META_VIEW rows: the view of each node of `view_nodes` (the nodes that hold metadata)
    against the newest view (the facts' `view_node`), stream by stream: a stream one of them
    lacks, or a field that differs. All views of a stream are compared in one row. A view at
    a lower applied index than the newest is not judged: its differences are VIEW_BEHIND
    notes."""
    newest = stream_facts.select("view_node", F.col("applied_index").alias(
        "newest_applied_index")).limit(1)
    fields = F.struct("node", "applied_index", *_VIEW_FIELDS)
    per_stream = meta.groupBy("stream").agg(F.collect_list(fields).alias("views")).crossJoin(
        F.broadcast(newest))
    others = F.array(*[F.lit(node) for node in view_nodes]) if view_nodes else F.array().cast(
        "array<string>")
    rows = per_stream.select(
        "stream", "view_node", "newest_applied_index",
        F.try_element_at(F.filter("views", lambda v: v["node"] == F.col("view_node")),
                         F.lit(1)).alias("new"),
        F.explode(others).alias("node"), "views")
    rows = rows.where(F.col("node") != F.col("view_node")).withColumn(
        "old", F.try_element_at(F.filter("views", lambda v: v["node"] == F.col("node")),
                                F.lit(1))).join(F.broadcast(applied_indexes(meta)), "node",
                                                "left")
    differs = F.array_compact(F.array(*[
        F.when(~_same_field(name), F.lit(name)) for name in _VIEW_FIELDS]))
    rows = rows.withColumn("differs", F.when(
        F.col("new").isNull(), F.array(F.lit("stream unknown to the newest view")))
        .when(F.col("old").isNull(), F.array(F.lit("stream missing from this view")))
        .otherwise(differs)).where(F.size("differs") > 0)
    behind = F.col("node_applied_index") < F.col("newest_applied_index")
    return rows.select(*divergence_columns(
        **{"class": F.when(behind, F.lit(classes.VIEW_BEHIND)).otherwise(
            F.lit(classes.META_VIEW))}, **_no_range(), **_no_consumer(),
        evidence=F.to_json(F.struct(
            "differs", F.col("node_applied_index").alias("applied_index"), "view_node",
            "newest_applied_index",
            F.struct(*[F.col(f"old.{name}").alias(name) for name in _VIEW_FIELDS]).alias("view"),
            F.struct(*[F.col(f"new.{name}").alias(name) for name in _VIEW_FIELDS]
                     ).alias("newest")))))


def applied_indexes(meta: DataFrame) -> DataFrame:
    """(node, node_applied_index): how far each node's metadata view had applied the Raft
    log when exported."""
    return meta.groupBy("node").agg(F.max("applied_index").alias("node_applied_index"))


_VIEW_FIELDS = ("stream_id", "primary", "replicas", "fence_epoch", "epoch_start_seq",
                "epoch_history")


def _same_field(name: str) -> Column:
    old, new = F.col(f"old.{name}"), F.col(f"new.{name}")
    if name == "replicas":
        old, new = F.sort_array(old), F.sort_array(new)
    return old.eqNullSafe(new)
