"""Collapses per-seq divergence rows into runs: consecutive seqs of one (stream, node, class)
whose authoritative record is held by the same sources become one row [first_seq, last_seq]
(a million-seq hole is one row). The evidence is the run's first seq's."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from raftlog.audit import spark_schema

_RUN_KEY = ("stream", "node", "class", "sources")


def collapse_runs(per_seq: DataFrame) -> DataFrame:
    """DIVERGENCES rows from `lineup.classify_records` rows."""
    order = Window.partitionBy(*_RUN_KEY).orderBy("seq")
    numbered = per_seq.withColumn("run", F.col("seq") - F.row_number().over(order))
    evidence_columns = [name for name in per_seq.columns if name not in _RUN_KEY]
    runs = numbered.groupBy(*_RUN_KEY, "run").agg(
        F.min("seq").alias("first_seq"), F.max("seq").alias("last_seq"),
        F.count("*").alias("seqs"),
        F.min_by(F.struct(*evidence_columns), F.col("seq")).alias("at"))
    evidence = F.to_json(F.struct(
        F.col("at.seq").alias("seq"), F.col("at.epoch").alias("epoch"),
        F.col("at.digest_hash").alias("digest_hash"), F.col("at.votes").alias("votes"),
        F.col("at.auth_epoch").alias("authority_epoch"),
        F.col("at.auth_hash").alias("authority_digest_hash"),
        F.col("at.auth_votes").alias("authority_votes"), F.col("at.majority").alias("majority"),
        F.col("at.committed_end").alias("committed_end"),
        F.col("at.has_copy").alias("has_copy"), F.col("at.copy_first").alias("copy_first_seq"),
        F.col("at.copy_last").alias("copy_last_seq"), F.col("at.head").alias("head"),
        F.col("at.heads").alias("heads"), F.col("at.primary").alias("primary"),
        F.col("at.incomplete").alias("incomplete")))
    return runs.select(
        "stream", "node", "class", "first_seq", "last_seq", "seqs",
        F.lit(None).cast("string").alias("consumer"), F.lit(None).cast("string").alias("holder"),
        "sources", evidence.alias("evidence"),
    ).select(*spark_schema.divergence_columns())
