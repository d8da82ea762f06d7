"""Per-stream facts the record classification needs, from the small tables (META, STREAMS):
the authoritative metadata view, each stream's replica set and majority, its epoch history as
seq ranges, its committed end and its authoritative head; `with_slots` adds one column group
per replica slot (the k-th node of the stream's replica list: its id, whether it is exported,
holds a copy, the copy's first and last seq). The record line-up pivots on these slots, so its
width is the widest replica set (at most 5), not the cluster's size.

Rules (each a function below):
- The authoritative view is the META of the node with the highest `applied_index` (ties: the
  lowest node id). A stream it does not know is unknown, whatever other views say.
- An epoch's seqs are [its start, the next epoch's start); a seq below the first start the
  history keeps (it holds at most 64 epochs) accepts any older epoch.
- The committed end is the highest of: the commit seqs the listed copies report (online
  exports), and the last seq that a majority of the listed replicas reach (Raft's rule: the
  majority-th highest last seq; a replica without an export counts as reaching nothing).
- The authoritative head is the primary's first seq when the primary's copy is exported, else
  the lowest head that a majority of the exported listed copies is at or above.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

seq_max = 2**63 - 1  # the open end of the newest epoch


def slot_node(k: int) -> str:
    """The node at slot k (0-based) of the stream's replica list; null past its end."""
    return f"slot_node_{k}"


def active(k: int) -> str:
    """Slot k is listed and its node exported: its copy is classified."""
    return f"active_{k}"


def has_copy(k: int) -> str:
    return f"copy_{k}"


def first(k: int) -> str:
    return f"first_{k}"


def last(k: int) -> str:
    return f"last_{k}"


def newest_view(meta: DataFrame) -> DataFrame:
    """The META rows of the authoritative view (see the module docstring)."""
    views = meta.groupBy("node").agg(F.max("applied_index").alias("view_index"))
    best = views.orderBy(F.col("view_index").desc(), F.col("node").asc()).limit(1)
    return meta.join(F.broadcast(best.select("node")), "node")


def epoch_ranges(history: Column) -> Column:
    """map epoch -> struct(start, end) from an epoch history (newest last); an entry whose epoch
    does not increase is dropped (the metadata never writes one; a map cannot hold it twice)."""
    increasing = F.filter(history, lambda entry, i: (i == 0) | (
        entry["epoch"] > F.try_element_at(history, F.greatest(i, F.lit(1)))["epoch"]))
    return F.map_from_entries(F.transform(increasing, lambda entry, i: F.struct(
        entry["epoch"].alias("key"),
        F.struct(entry["start_seq"].alias("start"),
                 F.coalesce(F.try_element_at(increasing, i + 2)["start_seq"],
                            F.lit(seq_max)).alias("end")).alias("value"))))


def stream_facts(meta: DataFrame, streams: DataFrame, nodes: Sequence[str]) -> DataFrame:
    """One row per stream the authoritative view knows (see the module docstring); `nodes` are
    the exported node ids. `with_slots` adds the slot columns."""
    view = newest_view(meta).select(
        "stream", "stream_id", "primary", F.coalesce("replicas", F.array()).alias("replicas"),
        F.col("node").alias("view_node"), "applied_index", "fence_epoch",
        F.coalesce("epoch_history", F.array()).alias("history"))
    exported = F.array(*[F.lit(node) for node in nodes]) if nodes else F.array().cast(
        "array<string>")
    view = view.withColumns({
        "majority": (F.floor(F.size("replicas") / 2) + 1).cast("int"),
        "ranges": epoch_ranges(F.col("history")),
        "hist_first_epoch": F.try_element_at("history", F.lit(1))["epoch"],
        "hist_first_start": F.try_element_at("history", F.lit(1))["start_seq"],
        "incomplete": F.size(F.array_except("replicas", exported)) > 0,
    })
    copies = streams.join(view.select("stream", "replicas", "primary"), "stream")
    return view.join(_committed_and_head(copies), "stream", "left").withColumns({
        "committed_end": F.coalesce("committed_end", F.lit(0)),
        "heads": F.coalesce("heads", F.create_map().cast("map<string,bigint>")),
        "lasts": F.coalesce("lasts", F.create_map().cast("map<string,bigint>")),
    })


def with_slots(stream_facts: DataFrame, nodes: Sequence[str], slots: int) -> DataFrame:
    """The facts with the columns of `slots` replica slots (`slots`: the widest replica list;
    a projection only, cheap on facts the driver already holds)."""
    exported = F.array(*[F.lit(node) for node in nodes]) if nodes else F.array().cast(
        "array<string>")
    columns: dict[str, Column] = {}
    for k in range(slots):
        node = F.try_element_at("replicas", F.lit(k + 1))
        columns |= {
            slot_node(k): node,
            active(k): F.coalesce(F.array_contains(exported, node), F.lit(False)),
            has_copy(k): F.coalesce(F.map_contains_key("heads", node), F.lit(False)),
            first(k): F.try_element_at("heads", node),
            last(k): F.try_element_at("lasts", node),
        }
    return stream_facts.withColumns(columns)


def _committed_and_head(copies: DataFrame) -> DataFrame:
    listed_copies = copies.where(F.array_contains("replicas", F.col("node")))
    majority = (F.floor(F.size(F.first("replicas")) / 2) + 1).cast("int")
    lasts = F.sort_array(F.collect_list("last_seq"), asc=False)
    heads = F.sort_array(F.collect_list("first_seq"))
    return listed_copies.groupBy("stream").agg(
        F.greatest(F.coalesce(F.max("commit_seq"), F.lit(0)),
                   F.coalesce(F.try_element_at(lasts, majority), F.lit(0))
                   ).alias("committed_end"),
        F.coalesce(
            F.max(F.when(F.col("node") == F.col("primary"), F.col("first_seq"))),
            F.try_element_at(heads, F.least(majority, F.size(heads)))).alias("head"),
        F.map_from_entries(F.collect_list(F.struct("node", "first_seq"))).alias("heads"),
        F.map_from_entries(F.collect_list(F.struct("node", "last_seq"))).alias("lasts"),
    )
