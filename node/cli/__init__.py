"""raftlog.node.cli: the `raftlog` command. Talks to nodes over gRPC; never imports the engine,
consumers, replication or cluster packages.

- `main`        the entry point and the `raftlog node` command.
- `base`        options, exit codes and output every command shares.
- `streams`, `publish`, `consumers`  the `stream`, `pub` and `consumer|fetch|sub|health` commands.
- `cluster`     adds the `cluster` command, whose subcommands live in `cluster_local` (up,
                secret, down), `cluster_members` (status, join, leave), `cluster_views`
                (overrides, stats, watch, stream route) and `cluster_placement` (stream
                migrate|pin|unpin, rebalance, clear-authority), sharing `cluster_base`.
- `format`      parsing and rendering (pure).
- `client`      a small asyncio client of one node.
- `loadgen`     load generators for `raftlog pub --count` and the benchmarks.
- `numaflow`    `raftlog numaflow-source`, a Numaflow user-defined source sidecar; its server
                `numaflow_source` (loaded only when the command runs) calls the cluster as a client.
- `localcluster` N node processes on loopback: the lifecycle (up, status, down), with
                `localcluster_layout` (directory, ports, command lines), `localcluster_procs`
                (pid files, /proc checks, stopping) and `localcluster_wait` (health, readiness).
- `certs`       a local CA and certificates for `cluster up --tls`.
- `grpc_stack`  the gRPC stack a node process runs on, chosen before grpc is imported
                (`__main__` and `raftlog node` re-execute the process with it).

This package's `__init__` imports nothing: `python -m raftlog.node.cli` must reach `__main__`
before grpc is imported.
"""
