"""The explicit Spark schemas mirror the export's Arrow schemas column by column."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from raftlog.audit import schema, spark_schema


def _arrow_shape(data_type: pa.DataType) -> object:
    if pa.types.is_list(data_type):
        return ("list", _arrow_shape(data_type.value_type))
    if pa.types.is_struct(data_type):
        return ("struct", [(f.name, _arrow_shape(f.type)) for f in data_type])
    return {pa.string(): "string", pa.int64(): "int64"}[data_type]


def _spark_shape(data_type: T.DataType) -> object:
    if isinstance(data_type, T.ArrayType):
        return ("list", _spark_shape(data_type.elementType))
    if isinstance(data_type, T.StructType):
        return ("struct", [(f.name, _spark_shape(f.dataType)) for f in data_type.fields])
    return {T.StringType(): "string", T.LongType(): "int64"}[data_type]


@pytest.mark.parametrize("table_file", schema.TABLE_FILES)
def test_every_table_has_the_same_columns_and_types(table_file: str) -> None:
    arrow, spark = schema.SCHEMAS[table_file], spark_schema.SCHEMAS[table_file]
    assert [f.name for f in spark.fields] == arrow.names
    for arrow_field, spark_field in zip(arrow, spark.fields, strict=True):
        assert _spark_shape(spark_field.dataType) == _arrow_shape(arrow_field.type), \
            f"{table_file}: column {arrow_field.name}"


def test_a_type_the_export_never_uses_is_refused() -> None:
    with pytest.raises(TypeError, match="no Spark type"):
        spark_schema.spark_type(pa.float16())
