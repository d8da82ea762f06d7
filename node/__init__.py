"""raftlog.node: the node process, in layers. A package may import the ones listed after it,
and `raftlog.raft`, `raftlog.base` and the protos; never one listed before it.

- `cli`         the `raftlog` command and its helpers (client, formatting, local cluster, load).
                Talks to nodes over gRPC only; never imports engine internals.
- `server`      the process: builds every layer and serves the listeners (`config` its flags).
- `api`         the gRPC front-ends: raftlog.v1 Streams, Consumers and Cluster, thin.
- `ops`         the protocol-neutral operations every front-end calls: check the request,
                decide local or forward, apply the Raft-first metadata rules.
- `transport`   gRPC plumbing: channel pool and forwarder, errors <-> gRPC status, the peer
                listener's credential, interceptors.
- `cluster`     coordinator, ring, placement, failover, liveness; quorum arithmetic is pure.
- `replication` the primary's side (links, commit rule, lease), the replica's side, and the
                Replication service on the peer listener.
- `consumers`   durable consumers: manager, per-consumer state, config, stores.
- `engine`      the storage engine: RocksDB, streams, retention, reads. No gRPC, no cluster.

The data path of a publish: api (front-end) -> ops (route: here, or transport forwards it to the
primary) -> engine (store, group commit) -> replication (replicate, commit) -> ops -> api (ack).
"""
