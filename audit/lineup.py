"""Lines the replicas up per (stream, seq) and classifies each copy's record: the hot path.

`line_up` is the pivot per node. Each message row is placed in its node's slot of the stream's
replica list (the k-th replica), and the rows are pivoted to one row per (stream, seq) with each
slot's epoch and digest hash side by side (`e_<k>`, `h_<k>`, null where that replica holds no
record). Slots, not node ids, make the columns: the width is the widest replica set, not the
cluster's size. Rows of nodes the stream does not list and of streams the metadata does not
know are dropped here (they are UNLISTED_REPLICA / UNKNOWN_STREAM, decided per copy). The digest
travels as its 64-bit key (`digest_key`, schema.py), not 64 hex characters, to keep the shuffle
narrow; the report shows the real digests.

`classify_records` first drops the rows where every exported replica holds the same record
under an epoch the history assigns to that seq (`suspects`: nearly every row of a healthy
cluster), then decides the authoritative record of the rest:
- a record (epoch, digest) held by a majority of the stream's replicas, whose epoch is the one
  the epoch history assigns to that seq (at most one record can be that);
- else, at or below the committed end, the highest-epoch record consistent with the history
  among the replicas' copies, when all copies under that epoch agree on its digest (a
  committed record a majority no longer holds: under-replicated, not lost);
- else none.
and the class of each exported replica's record: HOLE (absent, at or above the copy's own head,
and inside its own range or at or below the committed end), HEAD (absent below the copy's head
but at or above the authoritative head), EPOCH / CONTENT (differs from the authority in epoch /
in digest only); without an authority: EXTRA_TAIL past the committed end, else EPOCH (its epoch
is not the history's, or a copy holds a higher one) or CONTENT.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from raftlog.audit import classes, facts


def epoch_col(k: int) -> str:
    return f"e_{k}"


def hash_col(k: int) -> str:
    return f"h_{k}"


def line_up(messages: DataFrame, stream_facts: DataFrame, slots: int) -> DataFrame:
    """(stream, seq, e_0, h_0, ..., e_<slots-1>, h_<slots-1>) from MESSAGES rows: the pivot as
    one aggregation, a column pair per slot. Each message finds its slot through a broadcast
    hash join on (stream, node) with a one-integer payload; nothing else is computed per
    message."""
    slot_of = stream_facts.select("stream", F.posexplode("replicas").alias("slot", "node"))
    placed = messages.select("stream", "node", "seq", "epoch", "digest_key").join(
        F.broadcast(slot_of), ["stream", "node"])
    placed = placed.select("stream", "seq", "slot", "epoch",
                           F.col("digest_key").alias("digest_hash"))
    per_slot = []
    for k in range(slots):
        mine = F.col("slot") == k
        per_slot += [F.max(F.when(mine, F.col("epoch"))).alias(epoch_col(k)),
                     F.max(F.when(mine, F.col("digest_hash"))).alias(hash_col(k))]
    return placed.groupBy("stream", "seq").agg(*per_slot)


def suspects(wide: DataFrame, stream_facts: DataFrame, slots: int) -> DataFrame:
    """The rows of `wide` where the copies do not all agree: some exported replica lacks the
    seq or holds another (epoch, digest), or their epoch is not the history's for the seq.
    Two broadcast joins with narrow payloads (the slots' flags; the epoch's seq range) and a
    small expression: nearly every row of a healthy cluster stops here."""
    flags = stream_facts.select("stream", "hist_first_epoch", "hist_first_start",
                                *[facts.active(k) for k in range(slots)])
    spans = stream_facts.select("stream", F.explode("ranges").alias("epoch", "span")).select(
        F.col("stream").alias("span_stream"), F.col("epoch").alias("span_epoch"),
        F.col("span.start").alias("span_start"), F.col("span.end").alias("span_end"))
    null_long = F.lit(None).cast("long")
    active = [F.col(facts.active(k)) for k in range(slots)]
    ref_epoch = F.coalesce(*[F.when(active[k], F.col(epoch_col(k))) for k in range(slots)],
                           null_long)
    ref_hash = F.coalesce(*[F.when(active[k], F.col(hash_col(k))) for k in range(slots)],
                          null_long)
    rows = wide.join(F.broadcast(flags), "stream").withColumns(
        {"ref_epoch": ref_epoch, "ref_hash": ref_hash})
    rows = rows.join(F.broadcast(spans), (F.col("stream") == F.col("span_stream"))
                     & (F.col("ref_epoch") == F.col("span_epoch")), "left")
    seq, epoch = F.col("seq"), F.col("ref_epoch")
    ok = F.when(F.col("span_start").isNotNull(),
                (seq >= F.col("span_start")) & (seq < F.col("span_end"))).otherwise(
        F.col("hist_first_start").isNull() | ((seq < F.col("hist_first_start"))
                                               & (epoch < F.col("hist_first_epoch"))))
    agree = reduce(lambda a, b: a & b, [
        ~active[k] | (F.col(epoch_col(k)).eqNullSafe(F.col("ref_epoch"))
                      & F.col(hash_col(k)).eqNullSafe(F.col("ref_hash"))) for k in range(slots)],
        F.lit(True))
    return rows.where(~(agree & F.coalesce(ok, F.lit(False)))).select(wide.columns)


def classify_records(wide: DataFrame, stream_facts: DataFrame, slots: int) -> DataFrame:
    """One row per (stream, seq, replica) whose record diverges, with its class, the authority,
    the replicas holding the authority (`sources`) and the evidence columns.

    Past the cheap filter, a row's copies are an array of structs handled with array functions:
    small expressions (quick to plan) for the few rows that diverge."""
    rows = suspects(wide, stream_facts, slots).join(F.broadcast(stream_facts), "stream")
    copies = F.array(*[F.struct(
        F.col(facts.slot_node(k)).alias("node"), F.col(facts.active(k)).alias("active"),
        F.col(epoch_col(k)).alias("e"), F.col(hash_col(k)).alias("h"),
        F.col(facts.first(k)).alias("first"), F.col(facts.last(k)).alias("last"),
        F.col(facts.has_copy(k)).alias("has_copy"),
    ) for k in range(slots)])
    rows = rows.select("stream", "seq", "majority", "committed_end", "head", "heads", "primary",
                       "incomplete", "ranges", "hist_first_epoch", "hist_first_start",
                       copies.alias("copies"))
    rows = rows.withColumn("copies", F.transform("copies", lambda c: c.withField(
        "ok", _epoch_ok(c["e"])).withField("votes", F.size(F.filter(
            "copies", lambda q: (q["e"] == c["e"]) & (q["h"] == c["h"]))))))
    rows = rows.withColumns(_authority())
    rows = rows.withColumns({
        "sources": F.transform(F.filter("copies", lambda c: (c["e"] == F.col("auth.e")) & (
            c["h"] == F.col("auth.h"))), lambda c: c["node"]),
        "copies": F.filter(F.transform("copies", lambda c: c.withField(
            "class", _record_class(c))), lambda c: c["class"].isNotNull())})
    # explode_outer, then a filter on its output: a plain explode lets the optimizer infer
    # `size(copies) > 0` and push it, every expression above inlined, into the join (code
    # past the JVM's 64 KB method limit, then interpreted).
    exploded = rows.select("*", F.explode_outer("copies").alias("copy")).where(
        F.col("copy").isNotNull())
    return exploded.select(
        "stream", "seq", "copy.node", "copy.class", "sources", F.col("copy.e").alias("epoch"),
        F.col("copy.h").alias("digest_hash"), "copy.votes",
        F.col("copy.first").alias("copy_first"), F.col("copy.last").alias("copy_last"),
        "copy.has_copy", F.col("auth.e").alias("auth_epoch"),
        F.col("auth.h").alias("auth_hash"), F.col("auth.votes").alias("auth_votes"),
        "majority", "committed_end", "head", "heads", "primary", "incomplete")


def _epoch_ok(epoch: Column) -> Column:
    """Is `epoch` the one the history assigns to this seq? (null for a null epoch)"""
    seq = F.col("seq")
    span = F.try_element_at(F.col("ranges"), epoch)
    older_than_history = (seq < F.col("hist_first_start")) & (epoch < F.col("hist_first_epoch"))
    return F.when(epoch.isNull(), F.lit(None)).when(
        span.isNotNull(), (seq >= span["start"]) & (seq < span["end"])).otherwise(
        F.col("hist_first_start").isNull() | older_than_history)


def _authority() -> dict[str, Column]:
    """`auth` (the authoritative copy's struct, or null) and `top_epoch` (see the module
    docstring)."""
    candidates = F.filter("copies", lambda c: c["ok"])
    by_majority = F.try_element_at(F.filter(
        candidates, lambda c: c["votes"] >= F.col("majority")), F.lit(1))
    top_epoch = F.array_max(F.transform(candidates, lambda c: c["e"]))
    at_top = F.filter(candidates, lambda c: c["e"] == top_epoch)
    agreed = F.size(F.array_distinct(F.transform(at_top, lambda c: c["h"]))) == 1
    fallback = F.when((F.col("seq") <= F.col("committed_end")) & agreed,
                      F.try_element_at(at_top, F.lit(1)))
    return {"auth": F.coalesce(by_majority, fallback), "top_epoch": top_epoch}


def _record_class(c: Column) -> Column:
    epoch, digest, first, last = c["e"], c["h"], c["first"], c["last"]
    seq, committed_end = F.col("seq"), F.col("committed_end")
    auth_epoch, auth_hash = F.col("auth.e"), F.col("auth.h")
    has_auth, held = F.col("auth").isNotNull(), epoch.isNotNull()
    inside = ~c["has_copy"] | ((seq >= first) & ((seq <= last) | (seq <= committed_end)))
    absent = (F.when(inside, F.lit(classes.HOLE))
              .when((seq < first) & (seq >= F.col("head")), F.lit(classes.HEAD)))
    present = (F.when(epoch != auth_epoch, F.lit(classes.EPOCH))
               .when(digest != auth_hash, F.lit(classes.CONTENT)))
    unresolved = (F.when(seq > committed_end, F.lit(classes.EXTRA_TAIL))
                  .when(~c["ok"] | (epoch < F.col("top_epoch")), F.lit(classes.EPOCH))
                  .otherwise(F.lit(classes.CONTENT)))
    decided = (F.when(has_auth & ~held, absent).when(has_auth, present)
               .when(held, unresolved))
    return F.when(c["active"], decided)
