"""The export's tables as explicit Spark schemas, derived from the Arrow schemas in `schema.py`
(the one place a column is defined), and the schema of the audit's own output, `DIVERGENCES`.

Reading with these schemas (never inferring) means a file whose columns drifted fails loudly in
the input checks (`inputs.py`) instead of turning into nulls here.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from raftlog.audit import schema

_SCALARS: dict[pa.DataType, T.DataType] = {
    pa.string(): T.StringType(),
    pa.int64(): T.LongType(),
    pa.int32(): T.IntegerType(),
    pa.bool_(): T.BooleanType(),
    pa.float64(): T.DoubleType(),
}


def spark_type(arrow_type: pa.DataType) -> T.DataType:
    """The Spark type for an Arrow type of the export; TypeError for one the export never uses."""
    if arrow_type in _SCALARS:
        return _SCALARS[arrow_type]
    if pa.types.is_list(arrow_type):
        return T.ArrayType(spark_type(arrow_type.value_type), containsNull=True)
    if pa.types.is_struct(arrow_type):
        return T.StructType([T.StructField(field.name, spark_type(field.type), nullable=True)
                             for field in arrow_type])
    raise TypeError(f"no Spark type for the Arrow type {arrow_type}")


def spark_schema(arrow_schema: pa.Schema) -> T.StructType:
    return T.StructType([T.StructField(field.name, spark_type(field.type), nullable=True)
                         for field in arrow_schema])


MESSAGES = spark_schema(schema.MESSAGES)
STREAMS = spark_schema(schema.STREAMS)
CONSUMERS = spark_schema(schema.CONSUMERS)
META = spark_schema(schema.META)
SCHEMAS: dict[str, T.StructType] = {
    schema.MESSAGES_FILE: MESSAGES, schema.STREAMS_FILE: STREAMS,
    schema.CONSUMERS_FILE: CONSUMERS, schema.META_FILE: META,
}

# One row per divergence: a (stream, node, class) and, for record classes, a run of consecutive
# seqs [first_seq, last_seq] (`seqs` of them). `sources` are the listed replicas that hold the
# authoritative record over the whole run (a repair may copy from any of them). `evidence` is a
# JSON object whose keys depend on the class (see `classes.py`).
DIVERGENCES = T.StructType([
    T.StructField("stream", T.StringType(), nullable=True),
    T.StructField("node", T.StringType(), nullable=True),
    T.StructField("class", T.StringType(), nullable=True),
    T.StructField("first_seq", T.LongType(), nullable=True),
    T.StructField("last_seq", T.LongType(), nullable=True),
    T.StructField("seqs", T.LongType(), nullable=True),
    T.StructField("consumer", T.StringType(), nullable=True),
    T.StructField("holder", T.StringType(), nullable=True),
    T.StructField("sources", T.ArrayType(T.StringType(), containsNull=True), nullable=True),
    T.StructField("evidence", T.StringType(), nullable=True),
])


def divergence_columns(**values: Column) -> list[Column]:
    """The DIVERGENCES columns in order, typed: `values` by name, else the column of that name
    (or null for `consumer`, `holder`, `sources`, the seq columns when absent)."""
    return [(values[field.name] if field.name in values else F.col(field.name))
            .cast(field.dataType).alias(field.name) for field in DIVERGENCES]


def null(name: str) -> Column:
    """A typed null for the DIVERGENCES column `name`."""
    return F.lit(None).cast(DIVERGENCES[name].dataType)
