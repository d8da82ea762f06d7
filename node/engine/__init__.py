"""raftlog.node.engine: the storage engine of one node. Knows no gRPC and no cluster; imports
only `raftlog.base` and the protos.

- `storage`       the node's one RocksDB and its group-commit writer.
- `keys`          RocksDB key layouts.
- `stream`        `Stream`, one stream on this node: the concerns below put together, and its
                  replica side.
- `stream_core`   a stream's record, counters, commit seq and role; the storage primitives.
- `stream_publish` publishing: drafts, checks, seq assignment, the commit wait.
- `stream_reads`  reads by seq, scans, subjects, the consumers' start points.
- `stream_retention` limits, age expiry, removal, purges.
- `streams`       every stream of the node: create, update, delete, list.
- `stream_config` validation of stream configs and updates.
- `log`           `StreamLog`, what consumers read a stream through, and its in-memory twin.
"""
