"""The records behind the evidence: every node's record at a few (stream, seq) keys (the first
seq of each record divergence, the first differing seq of each stream), read back from the
messages so the report can show real digests and the records side by side.

`records_at` is the pure part: a filter on the seqs (pushed down to Parquet, which skips the
row groups that cannot hold them) and a join on the exact keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from raftlog.audit import classes
from raftlog.audit.divergence import Divergence

samples_max = 200  # (stream, seq) keys read back


def sample_keys(divergences: Iterable[Divergence]) -> list[tuple[str, int]]:
    """The first differing seq of each stream, then each record divergence's first seq, up to
    `samples_max` keys."""
    records = sorted((d for d in divergences if d.cls in classes.RECORD_CLASSES
                      and d.first_seq is not None), key=lambda d: (d.stream, d.first_seq or 0))
    firsts: dict[str, int] = {}
    for item in records:
        firsts.setdefault(item.stream, item.first_seq or 0)
    keys = list(dict.fromkeys([*firsts.items(),
                               *((d.stream, d.first_seq or 0) for d in records)]))
    return keys[:samples_max]


def records_at(messages: DataFrame, keys: DataFrame, seqs: Sequence[int]) -> DataFrame:
    """Every node's MESSAGES row at the (stream, seq) rows of `keys`; `seqs` are the keys'
    seqs, for the Parquet filter. Adds `digest_hash` as the line-up computes it."""
    wanted = messages.where(F.col("seq").isin(*sorted(set(seqs)))) if seqs else messages.limit(0)
    return wanted.join(F.broadcast(keys), ["stream", "seq"]).withColumn(
        "digest_hash", F.col("digest_key"))
