"""raftlog.raft: the cluster's metadata group — members, stream assignments with fence epochs
and authority overrides, consumer progress — replicated with Raft.

- `state`    the pure state machine: `apply(state, command) -> result`, dispatching to:
  - `state_members`   members: join, leave, status;
  - `state_streams`   streams and placement: create, update, delete, promotes, overrides;
  - `state_consumers` consumers and their progress;
  - `state_rules`     what the handlers share: rejections, lookups, placement checks.
- `state_model`    `MetaState`, the metadata limits, `check_invariants`.
- `state_snapshot` the snapshot codec: `to_snapshot`, `encode_snapshot`, `from_snapshot`.
- `commands` keyword-only builders of the commands (`raft.proto`).
- `api`      what node code sees: the `MetaGroup` protocol, events, status, `ensure_ok`.
- `group`    `RaftGroup`, over pysyncobj. Only the group's modules import pysyncobj:
  - `syncobj_glue`   the patches, configuration and subclasses of pysyncobj;
  - `completions`    pysyncobj callbacks to asyncio futures, failure reasons to errors;
  - `election_guard` pre-vote, leader stickiness, stuck-loop step-down (`ElectionGuard` mixin);
  - `snapshot_io`    pysyncobj's snapshot hooks (`SnapshotIO` mixin).
- `journal`  the Raft journal on RocksDB (pysyncobj's Journal interface, durable).
- `replay`   a member's state read from its disk (snapshot + committed journal), read-only.
- `wire`     restricted pickle: no frame or log entry can run code.
- `memory`   `MemoryRaftGroup`, the in-memory twin for tests of node code.
"""
