"""raftlog.node.consumers: durable consumers. Imports `raftlog.node.engine` (through the
`StreamLog` protocol), `raftlog.raft` (for `raft_store`), `raftlog.base`, the protos.

- `manager`    `ConsumerManager`: delivery, acks, redelivery, dead letters, removal policies.
- `state`      one consumer's delivery state and every rule that changes it (pure).
- `config`     consumer config validation and filter overlap rules (pure).
- `store`      the `ConsumerStore` protocol and its in-memory twin.
- `rocks_store` a `ConsumerStore` on the node's RocksDB (single node).
- `raft_store` a `ConsumerStore` committed through the Raft metadata group (cluster).
"""
