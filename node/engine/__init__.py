"""raftlog.node.engine: the storage engine of one node. Knows no gRPC and no cluster; imports
only `raftlog.base` and the protos.

- `store`         `MessageStore`, what streams are kept in, and `StoreBatch`: the protocol.
- `rocks_store`   the `MessageStore` on the node's RocksDB.
- `memory_store`  its in-memory twin, for tests.
- `storage`       the node's one RocksDB and its group-commit writer.
- `keys`          RocksDB key layouts.
- `stream`        `Stream`, one stream on this node: the concerns below put together.
- `stream_core`   a stream's record, counters, commit seq and role; the storage primitives.
- `stream_publish` publishing: drafts, checks, seq assignment, the commit wait.
- `stream_reads`  reads by seq, scans, subjects, the consumers' start points.
- `stream_retention` limits, age expiry, removal, purges.
- `stream_replica` the replica side: applying a primary's batch, fencing.
- `replica_batch` checking a primary's batch before it is applied, and the bounds (pure).
- `streams`       every stream of the node: create, update, delete, list.
- `stream_config` validation of stream configs and updates.
- `log`           `StreamLog`, what consumers read a stream through, and its in-memory twin.
"""
