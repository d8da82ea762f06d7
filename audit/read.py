"""Reads an export's tables: every node's file of one table as one DataFrame, with the explicit
schema (never inferred). The only module of the job that touches files through Spark."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from raftlog.audit import spark_schema
from raftlog.audit.inputs import ExportSet


def read_table(spark: SparkSession, exports: ExportSet, table_file: str) -> DataFrame:
    return spark.read.schema(spark_schema.SCHEMAS[table_file]).parquet(*exports.paths(table_file))

