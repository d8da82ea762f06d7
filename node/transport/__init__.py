"""raftlog.node.transport: gRPC plumbing shared by the layers above the engine. Imports only
`raftlog.base` and the protos.

- `rpc`           the one mapping between `RaftlogError` and gRPC status + ErrorInfo.
- `calls`         what an incoming call carries on: deadline, hop count, metadata.
- `logctx`        a call's request id and log fields; the JSON log line format.
- `channels`      the pool of channels to other nodes' client ports.
- `forwarding`    the one forwarder: a canonical call to the node that serves it.
- `credentials`   the cluster secret and the call tokens made from it.
- `peer`          the peer listener's gate and the client of other nodes' peer listeners.
- `tls`           the listeners' TLS (reloaded when the files change) and the channels'.
- `feeding`       the requests of a streaming call, drained in a task that ends with it.
- `malformed`     undecodable requests answered INVALID_ARGUMENT.
- `subscriptions` the bound on long-lived Subscribe calls.
- `metrics`       the Prometheus endpoint: registry, call interceptor, hot-path instruments;
                  `metrics_state` what a scrape reads from the node's state.
- `auth`          who a client-port call is (token, RocketMQ signature, certificate, forwarded
                  identity) and what it may do; `auth_rules` the rules' pure evaluation.
"""
