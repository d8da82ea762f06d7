"""`raftlog cluster ...` and the cluster's `raftlog stream` actions. This module only adds them
to the `raftlog` parser; each group of subcommands lives in a module of its own.

    raftlog cluster up --nodes 3 --base-port 7400 --data DIR     start N nodes on loopback
    raftlog cluster down --data DIR                              stop exactly those
    raftlog cluster status [--data DIR]                          members, leader, health (+ pids)
    raftlog cluster join ID --raft A --grpc B | leave ID         one membership change
    raftlog cluster secret                                       print a new cluster secret
    raftlog cluster overrides | stats | watch                    cluster-wide views
    raftlog cluster rebalance --plan FILE|- | STREAM=NODE ...    move streams, one step at a time
    raftlog cluster clear-authority NAME                         drop a stream's authority override
    raftlog stream route NAME                                    why a stream lives where it does
    raftlog stream migrate NAME NODE [--pin]                     move a stream's primary to NODE
    raftlog stream pin NAME | unpin NAME                         keep (or release) an override

- `cluster_local`      `cluster up|secret|down`: node processes on loopback (see `localcluster`).
- `cluster_members`    `cluster status|join|leave`: the members, and changing them.
- `cluster_views`      `cluster overrides|stats|watch` and `stream route`: read-only views.
- `cluster_placement`  `stream migrate|pin|unpin` and `cluster rebalance|clear-authority`:
                       moving streams, and their authority overrides.
- `cluster_base`       what they share: the Cluster service stub and local-only subcommands.

`register(commands)` adds them to the `raftlog` parser; it must run after the stream commands
are added, since `route`, `migrate`, `pin` and `unpin` join the existing `stream` group. Output
and error conventions are those of `base` and `format`.
"""

from __future__ import annotations

import argparse
from typing import Any

from raftlog.node.cli.base import group
from raftlog.node.cli.cluster_local import add_local_commands
from raftlog.node.cli.cluster_members import add_member_commands
from raftlog.node.cli.cluster_placement import add_placement_commands
from raftlog.node.cli.cluster_views import add_view_commands


def register(commands: Any) -> None:
    """Adds `cluster ...` and `stream route|migrate|pin|unpin`; call after
    `add_stream_commands(commands)`. The order of the calls is the order of `--help`."""
    cluster = group(commands, "cluster", "run a local cluster; membership, placement and stats")
    add_local_commands(cluster)  # up, secret, down
    add_member_commands(cluster)  # status, join, leave
    stream = _stream_group(commands)
    add_view_commands(cluster, stream)  # overrides, stats, watch; stream route
    add_placement_commands(cluster, stream)  # stream migrate|pin|unpin; rebalance, clear-authority


def _stream_group(commands: Any) -> Any:
    """The `stream` command's subparsers, which `streams` created but does not hand out."""
    stream = commands.choices.get("stream")
    if stream is None:
        return group(commands, "stream", "create, inspect, change and delete streams")
    for action in stream._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise RuntimeError("the `stream` command has no actions to add `route` to")
