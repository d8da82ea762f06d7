"""The Spark consistency audit: every replica of every stream exported, lined up message by
message, every divergence classified, a repair plan applied through the peer API.

- `schema.py`: the export's layout (one directory per node: a manifest and Parquet tables) and
  its Arrow schemas; the one place a column is defined.
- `export*.py`: a node's RocksDB (a stopped node's data directory, or a checkpoint a running
  node took) to that layout: `export` (one node), `export_source` (the read-only open),
  `export_rows` (records to rows), `export_meta` (the Raft view), `export_writer` (Parquet),
  `export_child` (the process a node runs for an online export), `export_client` (online, from
  every member), `cli_export` (`raftlog audit export`).
- the Spark job (`raftlog audit run`): pure DataFrame transforms, the classification, the
  report and the repair plan; `raftlog audit cluster up|down` for a local standalone cluster.
- `raftlog audit repair --plan FILE`: dry run by default, `--apply` through the peer API.

Imports raftlog.base, raftlog.raft, raftlog.node and the protos. Nothing under base/, raft/,
node/ or chaos/ imports this package (tests/unit/layers.py): a node runs the exporter as a child
process.
"""
