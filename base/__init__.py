"""raftlog.base: what every layer shares, and nothing else. Imports no other raftlog package
and never grpc, RocksDB or pysyncobj.

- `errors`   the one error catalogue: `Reason` (with the name of its gRPC status code, as text)
             and `RaftlogError`.
- `clock`    time, injected: the only place that reads the machine's clocks.
- `limits`   every limit of a node, with its unit last (docs/limits.md).
- `subjects` names and subjects: validation and wildcard matching.
- `subject_transform` NATS-style subject rewrites (`{{wildcard(N)}}`), for stream sources.
- `files`    durable file helpers (fsync of a directory).
- `fatal`    a write or fsync the disk refused ends the process.
"""
