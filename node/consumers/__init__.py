"""raftlog.node.consumers: durable consumers. Imports `raftlog.node.engine` (through the
`StreamLog` protocol), `raftlog.raft` (for `raft_store`), `raftlog.base`, the protos.

- `manager`    `ConsumerManager`: the registry of streams and consumers, create, delete, info,
               list; the top of the manager's layers below (each subclasses the one before).
- `serving`    `ManagerBase`: served streams and consumers, lookup, coalesced saves (`Flusher`),
               `Settled`, `DLQ_HEADERS`.
- `retention`  `RetentionManager`: interest retention trims.
- `settlement` `SettlementManager`: ack, term, nak, in_progress, dead letters, durability.
- `delivery`   `DeliveryManager`: fetch, redelivery, waiting for work.
- `state`      one consumer's delivery state and every rule that changes it (pure).
- `config`     consumer config validation and filter overlap rules (pure).
- `store`      the `ConsumerStore` protocol and its in-memory twin.
- `rocks_store` a `ConsumerStore` on the node's RocksDB (single node).
- `raft_store` a `ConsumerStore` committed through the Raft metadata group (cluster).
"""
