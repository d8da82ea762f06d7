"""CONSUMER divergences: consumer state compared across nodes and holders.

The reference is the metadata's copy (holder "raft") in the authoritative view (the node with
the highest applied index, `facts.newest_view`): consumer progress is replicated through Raft, a
node's store follows it. Every other copy (a node's store, another node's metadata view) whose
delivered seq, ack floor or acked set differs from it is a CONSUMER row; so is any copy,
the reference included, whose ack floor or delivered seq lies past the stream's committed end.
`set` in the evidence is what the copy should hold: the reference, clamped to the committed end.
Consumers of streams the metadata does not know are left to UNKNOWN_STREAM.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from raftlog.audit import classes
from raftlog.audit.spark_schema import divergence_columns, null
from raftlog.audit.stream_checks import applied_indexes

acked_shown_max = 20  # acked seqs quoted in the evidence (the `set` values carry them all)
RAFT_HOLDER = "raft"
_PAST_END = "points past the committed end"


def consumer_divergences(consumers: DataFrame, stream_facts: DataFrame, meta: DataFrame
                         ) -> DataFrame:
    """CONSUMER rows: all copies of a consumer gathered in one row (one shuffle), each compared
    with the reference copy among them. A copy on a node whose metadata view had applied
    fewer Raft entries than the newest is not compared with it (VIEW_BEHIND, a note), only
    checked against the committed end."""
    copy = F.struct("node", "holder", *_STATE)
    gathered = consumers.groupBy("stream", "consumer").agg(F.collect_list(copy).alias("copies"))
    known = gathered.join(F.broadcast(stream_facts.select("stream", "committed_end",
                                                          "view_node")), "stream")
    reference = F.try_element_at(F.filter("copies", lambda c: (c["holder"] == RAFT_HOLDER) & (
        c["node"] == F.col("view_node"))), F.lit(1))
    each = known.select("stream", "consumer", "committed_end", "view_node",
                        reference.alias("ref"), F.explode("copies").alias("c"))
    is_reference = (F.col("c.holder") == RAFT_HOLDER) & (F.col("c.node") == F.col("view_node"))
    reasons = F.array_compact(F.array(
        F.when(~is_reference & F.col("ref").isNull(),
               F.lit("not in the metadata's consumer state")),
        F.when(~is_reference & F.col("ref").isNotNull() & ~_same_state(),
               F.lit("differs from the metadata's consumer state")),
        F.when((F.col("c.ack_floor") > F.col("committed_end"))
               | (F.col("c.delivered_seq") > F.col("committed_end")),
               F.format_string(f"{_PAST_END} %d", "committed_end"))))
    found = each.withColumn("reasons", reasons).where(F.size("reasons") > 0)
    found = found.join(F.broadcast(applied_indexes(meta).withColumnRenamed("node", "c_node")),
                       F.col("c.node") == F.col("c_node"), "left").join(
        F.broadcast(applied_indexes(meta).select(
            F.col("node").alias("view_node"),
            F.col("node_applied_index").alias("newest_applied_index"))), "view_node", "left")
    behind = ((F.col("node_applied_index") < F.col("newest_applied_index"))
              & ~F.exists("reasons", lambda r: r.startswith(_PAST_END)))
    acked = F.coalesce("c.acked", F.array())
    return found.select(*divergence_columns(
        **{"class": F.when(behind, F.lit(classes.VIEW_BEHIND)).otherwise(
            F.lit(classes.CONSUMER))}, node=F.col("c.node"), holder=F.col("c.holder"),
        first_seq=null("first_seq"), last_seq=null("last_seq"), seqs=null("seqs"),
        sources=null("sources"),
        evidence=F.to_json(F.struct(
            "reasons", F.col("c.delivered_seq").alias("delivered_seq"),
            F.col("c.ack_floor").alias("ack_floor"),
            F.slice(acked, 1, acked_shown_max).alias("acked_first"),
            F.size(acked).alias("acked_count"),
            F.col("c.dead_lettered").alias("dead_lettered"), F.col("ref").alias("metadata"),
            "committed_end", "view_node", F.col("node_applied_index").alias("applied_index"),
            "newest_applied_index", _set_values().alias("set")))))


_STATE = ("delivered_seq", "ack_floor", "acked", "dead_lettered")


def _same_state() -> Column:
    return (F.col("c.delivered_seq").eqNullSafe(F.col("ref.delivered_seq"))
            & F.col("c.ack_floor").eqNullSafe(F.col("ref.ack_floor"))
            & F.coalesce("c.acked", F.array()).eqNullSafe(F.coalesce("ref.acked", F.array())))


def _set_values() -> Column:
    """The reference state clamped to the committed end; null without a reference."""
    end = F.col("committed_end")
    floor = F.least("ref.ack_floor", end)
    acked = F.filter(F.coalesce("ref.acked", F.array()), lambda seq: (seq > floor) & (seq <= end))
    return F.when(F.col("ref").isNotNull(), F.struct(
        F.least("ref.delivered_seq", end).alias("delivered_seq"), floor.alias("ack_floor"),
        acked.alias("acked")))
