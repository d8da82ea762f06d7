"""raftlog.node.engine: the storage engine of one node. Knows no gRPC and no cluster; imports
only `raftlog.base` and the protos.

- `storage`       the node's one RocksDB and its group-commit writer.
- `keys`          RocksDB key layouts.
- `stream`        one stream: publish, reads, retention, its counters.
- `streams`       every stream of the node: create, update, delete, list.
- `stream_config` validation of stream configs and updates.
- `log`           `StreamLog`, what consumers read a stream through, and its in-memory twin.
"""
