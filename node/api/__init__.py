"""raftlog.node.api: the raftlog.v1 gRPC front-ends (Streams, Consumers, Cluster). Thin: they
translate requests and call the layers below.

- `streams`, `consumers` the services over one node's engine.
- `clustered`            the same services in a cluster (metadata through Raft first).
- `cluster`              the admin Cluster service.
- `batches`              reading a PublishBatchResponse in either of its forms.
"""
