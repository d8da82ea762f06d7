"""raftlog.node.replication: copies of a stream on other nodes. Imports `engine`, `transport`
(peer calls), `raftlog.base`, the protos.

- `primary` the primary's side: links to replica nodes, per-stream progress, the commit rule and
            the read lease.
- `links`   what a link needs of the wire (`LinkTransport`, `LinkCall`) and the gRPC
            implementation (the Replicate call on the peer listener).
- `memory_link` the in-memory implementation: simulated nodes of one process, with faults
            (cut, drop, delay), for tests.
- `replica` the replica side's rules, by name (they live in the engine, which applies them:
            engine/replica_batch.py, engine/stream_replica.py; the bounds of a batch are the
            `replication_*` names in base/limits.py).
- `service` the Replication gRPC service on the peer listener.
"""
