"""raftlog.node.cluster: a node's place in the cluster. Imports `replication`, `consumers`,
`engine`, `transport` (peer calls), `raftlog.raft`, `raftlog.base`, the protos.

- `coordinator` the metadata group, membership, keeping the local engine in line with Raft.
- `ring`        the consistent-hash ring (pure).
- `placement`   moving primaries and keeping replica counts.
- `replica_sets` which replica-set change is safe, and the most complete copy (pure).
- `failover`    replacing lost or deposed primaries, run by the Raft leader.
- `liveness`    who is alive, judged from the event loop that serves requests.
- `existence`   answering NOT_FOUND only once the metadata confirms it.
"""
