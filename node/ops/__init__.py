"""raftlog.node.ops: the protocol-neutral operations every front-end calls (publish, fetch, ack,
create/update/delete, list, subscribe, watch, membership). An operation checks its request,
decides where it is served (here, or forwarded to the stream's primary or the Raft leader) and
applies the metadata rules (through Raft first in a cluster). Requests and answers are in their
canonical form, the raftlog.v1 messages: a front-end for another protocol translates into them,
and forwarding names only their methods.

Imports `cluster`, `consumers`, `engine`, `transport`, raftlog.raft, raftlog.base, protos.

- `operations`  the bundle a front-end gets: `standalone(...)` or `clustered(...)`.
- `streams`     stream operations (metadata, reads, publish).
- `publish`     publishing: batches, the stream of messages, the split across primaries.
- `consumers`   consumer operations (metadata, fetch, ack/nak/term/in-progress, subscribe).
- `subscribe`   the subscription loop on the stream's primary.
- `metadata`    the metadata rules' interface, and a node on its own.
- `raft_first`  the metadata rules of a cluster: through Raft first, lists span the cluster.
- `membership`  join, leave, migrate, rebalance: on the Raft leader.
- `status`      read-only cluster views and the authority overrides.
- `audit_export` the audit export of this running node: checkpoint, exporter process, files.
- `users`       the cluster's users and their tokens, through Raft (docs/auth.md).
- `route`       here or forwarded: a stream's primary, the Raft leader.
- `canonical`   the canonical calls and the method paths forwarding uses.
- `batches`     reading a PublishBatchResponse in either of its forms.
- `reads`       ReadMessages on the stream's primary: from a seq or time, filtered, waiting.
- `leader_loops` the reconcile loop of work run for the streams a node leads.
- `sources`     the stream sources' tails a node runs for the streams it leads (`source_tail`
                one tail, `source_status` what they report).
- `partitions`  topics: N partition streams under one name, keys hashed to partitions,
                consumer groups and their offsets (docs/partitions.md).
- `kafkapixy_groups` Kafka-Pixy's groups: consume one message across a topic's partitions,
                ack by (partition, offset) (docs/kafkapixy.md).
- `rocketmq`    RocketMQ's names, receipt handles and groups over topics (docs/rocketmq.md);
                `rocketmq_dlq` retry back-off and the move to `%DLQ%<group>`, `rocketmq_receive`
                the v1 POP receive over a topic's queues, `rocketmq_time` when a delayed
                message is due, `rocketmq_orphans` which open transaction to ask about next,
                `rocketmq_offsets` queue offsets, committed offsets and recall handles.
- `schedule`    delayed publishes: the schedule stream of a target (`schedule_layout` names
                and records, `schedule_runner` the schedulers of the streams a node leads;
                docs/scheduled.md).
- `transactions` two-phase publishes: half messages, commit/rollback, orphans
                (`transactions_layout` ids and records, `transactions_janitor` timeouts;
                docs/transactions.md).
- `kv`          KV buckets on a stream per bucket (`kv_entries` the mapping, `kv_watch` watches).
- `objects`     the object store on a stream per bucket (`objects_layout` the subjects and
                metadata, `objects_upload` one put and the sweep of abandoned uploads).
"""
