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
- `route`       here or forwarded: a stream's primary, the Raft leader.
- `canonical`   the canonical calls and the method paths forwarding uses.
- `batches`     reading a PublishBatchResponse in either of its forms.
"""
