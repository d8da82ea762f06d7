"""raftlog.raft: the cluster's metadata group — members, stream assignments with fence epochs
and authority overrides, consumer progress — replicated with Raft.

- `state`    the pure state machine: `apply(state, command) -> result`, invariants, snapshots.
- `commands` keyword-only builders of the commands (`raft.proto`).
- `api`      what node code sees: the `MetaGroup` protocol, events, status, `ensure_ok`.
- `group`    `RaftGroup`, over pysyncobj (the only module that imports it).
- `journal`  the Raft journal on RocksDB (pysyncobj's Journal interface, durable).
- `wire`     restricted pickle: no frame or log entry can run code.
- `memory`   `MemoryRaftGroup`, the in-memory twin for tests of node code.
"""
