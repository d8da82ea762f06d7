"""raftlog.node.transport: gRPC plumbing shared by the layers above the engine. Imports only
`raftlog.base` and the protos.

- `rpc`           the one mapping between `RaftlogError` and gRPC status + ErrorInfo.
- `calls`         what an incoming call carries on: deadline, hop count, metadata.
- `channels`      the pool of channels to other nodes' client ports.
- `forwarding`    the one forwarder: a canonical call to the node that serves it.
- `credentials`   the cluster secret and the call tokens made from it.
- `peer`          the peer listener's gate and the client of other nodes' peer listeners.
- `malformed`     undecodable requests answered INVALID_ARGUMENT.
- `subscriptions` the bound on long-lived Subscribe calls.
"""
