"""Block digests: the cheap first pass that keeps a healthy cluster's records out of the
line-up.

Each replica's seqs are cut into blocks of `block_seqs` consecutive seqs. Per (stream, node,
block, epoch) one aggregation computes the row count, the lowest and highest seq and the XOR of
a 64-bit hash of every (seq, digest key): a map-side aggregation that turns millions of rows into a
few thousand without a shuffle of the rows themselves. A block is *clean* when

- every active slot of the stream (listed and exported) holds it, with the same set of
  (epoch, rows, lowest seq, highest seq, hash) groups: then, but with probability 2^-64 per
  block, every copy holds the same records at the same seqs; and
- every group's seqs lie inside the seq range the epoch history assigns to its epoch (the
  same rule as `lineup.suspects`; a range check is exact because a group is one epoch and an
  epoch's seqs are one interval).

A clean block contains no seq that `lineup.suspects` would keep, so only the rows of the other
blocks (`suspect_blocks`) are lined up. Rows of nodes a stream does not list, or of streams the
metadata does not know, never reach the line-up either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from raftlog.audit import facts

block_seqs = 4096  # seqs per block: 10M rows are ~2,500 blocks per replica
# Runs of suspect blocks pushed to the Parquet reader as a filter; past it, the join alone
# picks the rows (a filter that long costs more to evaluate than it saves).
pushdown_ranges_max = 64


def block_of(seq: Column) -> Column:
    return F.floor(seq / F.lit(block_seqs)).cast("long")


def block_groups(messages: DataFrame) -> DataFrame:
    """(stream, node, block, epoch, rows, low, high, mix) per group of MESSAGES rows."""
    return messages.groupBy(
        "stream", "node", block_of(F.col("seq")).alias("block"), "epoch").agg(
        F.count(F.lit(1)).alias("rows"), F.min("seq").alias("low"),
        F.max("seq").alias("high"),
        F.bit_xor(F.xxhash64("seq", "digest_key")).alias("mix"))


def suspect_blocks(groups: DataFrame, stream_facts: DataFrame, slots: int) -> DataFrame:
    """(stream, block) of every block that is not clean (see the module docstring), from
    `block_groups` and the facts with their slot columns.

    One aggregation per block: its groups (one per slot and epoch) `n`, their distinct
    signatures `d` and the slots present `p`. A slot's groups have distinct epochs, so it
    holds at most `d` signatures and `n <= p * d`, equal only when every slot present holds
    every signature: the same groups."""
    slot_of = stream_facts.select(
        "stream", "hist_first_epoch", "hist_first_start", _active_slots(slots).alias("active"),
        F.posexplode("replicas").alias("slot", "node"))
    spans = stream_facts.select("stream", F.explode("ranges").alias("epoch", "span")).select(
        "stream", "epoch", F.col("span.start").alias("span_start"),
        F.col("span.end").alias("span_end"))
    placed = groups.join(F.broadcast(slot_of), ["stream", "node"]).join(
        F.broadcast(spans), ["stream", "epoch"], "left")
    in_span = F.when(F.col("span_start").isNotNull(),
                     (F.col("low") >= F.col("span_start")) & (F.col("high") < F.col("span_end"))
                     ).otherwise(F.col("hist_first_start").isNull() | (
                         (F.col("high") < F.col("hist_first_start"))
                         & (F.col("epoch") < F.col("hist_first_epoch"))))
    per_block = placed.groupBy("stream", "block").agg(
        F.count(F.lit(1)).alias("n"),
        F.size(F.collect_set(F.xxhash64("epoch", "rows", "low", "high", "mix"))).alias("d"),
        F.collect_set("slot").alias("present"),
        F.bool_and(F.coalesce(in_span, F.lit(False))).alias("in_span"),
        F.first("active").alias("active"))
    clean = ((F.col("n") == F.size("present") * F.col("d")) & F.col("in_span")
             & (F.size(F.array_except("active", "present")) == 0))
    return per_block.where(~clean).select("stream", "block")


def in_blocks(messages: DataFrame, blocks: DataFrame, known: Sequence[tuple[str, int]] = ()
              ) -> DataFrame:
    """The MESSAGES rows that fall in `blocks` (stream, block). `known`: the same blocks
    when the caller holds them: up to `pushdown_ranges_max` runs of them also become a filter
    on (stream, seq) that the Parquet reader applies to its row groups' and pages' statistics,
    so the rest of the files is not even decoded."""
    if known:
        ranges = block_ranges(known)
        if len(ranges) <= pushdown_ranges_max:
            messages = messages.where(reduce(Column.__or__, [
                (F.col("stream") == stream) & F.col("seq").between(low, high)
                for stream, low, high in ranges]))
    return messages.join(F.broadcast(blocks), (messages["stream"] == blocks["stream"]) & (
        block_of(messages["seq"]) == blocks["block"]), "left_semi")


def block_ranges(known: Sequence[tuple[str, int]]) -> list[tuple[str, int, int]]:
    """(stream, first seq, last seq) of each run of consecutive blocks."""
    ranges: list[tuple[str, int, int]] = []
    for stream, block in sorted(set(known)):
        low, high = block * block_seqs, (block + 1) * block_seqs - 1
        if ranges and ranges[-1][0] == stream and ranges[-1][2] + 1 == low:
            ranges[-1] = (stream, ranges[-1][1], high)
        else:
            ranges.append((stream, low, high))
    return ranges


def _active_slots(slots: int) -> Column:
    """The stream's active slot numbers as an array (only those are compared)."""
    chosen = [F.when(F.col(facts.active(k)), F.lit(k)) for k in range(slots)]
    listed = F.array(*chosen) if chosen else F.array().cast("array<int>")
    return F.filter(listed, lambda k: k.isNotNull())
