"""One export table as a Parquet file, written a record batch at a time (never the whole
table in memory), with its row count."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

import pyarrow as pa
import pyarrow.parquet as pq

# Rows a writer is handed at once: the exporter takes its columns at this many rows, so memory
# stays near one batch of one table whatever the node holds.
batch_rows_max = 64 * 1024
parquet_compression = "zstd"


class TableWriter:
    """`with TableWriter(path, schema) as writer: writer.write(batch)`; an empty table still
    gets a file (with the schema and no rows)."""

    def __init__(self, path: Path, table: pa.Schema) -> None:
        self.path = path
        self.schema = table
        self.rows = 0
        self._writer = pq.ParquetWriter(str(path), table, compression=parquet_compression,
                                        write_page_index=True)

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self._writer.write_batch(batch, row_group_size=batch_rows_max)
            self.rows += batch.num_rows

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
