"""raftlog.node.cli: the `raftlog` command. Talks to nodes over gRPC; never imports the engine,
consumers, replication or cluster packages.

- `main`        the entry point and the `raftlog node` command.
- `base`        options, exit codes and output every command shares.
- `streams`, `consumers`, `cluster`  the command groups.
- `format`      parsing and rendering (pure).
- `client`      a small asyncio client of one node.
- `loadgen`     load generators for `raftlog pub --count` and the benchmarks.
- `localcluster` N node processes on loopback.
"""

from raftlog.node.cli.main import main

__all__ = ["main"]
