"""raftlog.node.api: the gRPC front-ends on the client port. Thin: each call becomes a
canonical request handed to `raftlog.node.ops`, whose answer (or RaftlogError, as status +
ErrorInfo through `transport.rpc`) goes back. The seed protocols' front-ends sit beside these.
Imports only `ops` and `transport` of raftlog.node, and raftlog.base and the protos.

- `streams`   raftlog.v1 Streams.
- `consumers` raftlog.v1 Consumers.
- `cluster`   raftlog.v1 Cluster, the admin service (membership needs the cluster credential).
"""
