"""raftlog.node.api: the gRPC front-ends on the client port. Thin: each call becomes a
canonical request handed to `raftlog.node.ops`, whose answer (or RaftlogError, as status +
ErrorInfo through `transport.rpc`) goes back. The seed protocols' front-ends sit beside these.
Imports only `ops` and `transport` of raftlog.node, and raftlog.base and the protos.

- `streams`   raftlog.v1 Streams.
- `consumers` raftlog.v1 Consumers.
- `cluster`   raftlog.v1 Cluster, the admin service (membership needs the cluster credential).
- `auth`      raftlog.v1 Auth: users, their tokens and rules (docs/auth.md).
- `kv`        raftlog.v1 KV, buckets of keys on streams.
- `objects`   raftlog.v1 Objects, buckets of objects on streams; `waymaker_objects` the same store
  behind the Waymaker service's nine object RPCs.
- `waymaker`  the Waymaker seed's WaymakerStreamsService (docs/waymaker.md), with
  `waymaker_convert` (its messages <-> raftlog.v1), `waymaker_codes` (result codes) and
  `waymaker_ids` (uint64 node ids); `waymaker_sources` its stream sources (GetStreamSources);
  `waymaker_cluster` its cluster RPCs, `waymaker_answer` how a unary call answers.
- `kafkapixy` Kafka-Pixy's package-less `KafkaPixy` service over topics (docs/kafkapixy.md).
- `rocketmq_v2` apache.rocketmq.v2.MessagingService over topics, for RocketMQ 5 clients
  (docs/rocketmq.md); `rocketmq_v2_pull` its pull-consumer RPCs, `rocketmq_v2_telemetry`
  its Telemetry stream.
- `rocketmq_v1` apache.rocketmq.v1.MessagingService (the seed's), business status in
  ResponseCommon.status (docs/rocketmq-v1.md).
- `transactions` raftlog.v1.Transactions: prepare, commit, rollback, list (docs/transactions.md).
- `waymaker_kv`, `waymaker_collections` the Waymaker KV and collections services (method names
  raftlog's, messages the seed's) over the same KV and collection operations as raftlog.v1.
"""
