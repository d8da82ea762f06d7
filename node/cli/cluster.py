"""`raftlog cluster ...` and `raftlog stream route`: a local cluster's processes, and the admin
Cluster service (membership, placement, authority overrides, cluster-wide stats, watch).

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

`register(commands)` adds them to the `raftlog` parser; it must run after the stream commands
are added, since `route`, `migrate`, `pin` and `unpin` join the existing `stream` group.
Process management lives in `localcluster`; output and error conventions are those of
`cli_base` and `cli_format`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from raftlog.base import subjects
from raftlog.base.errors import RaftlogError
from raftlog.node.cli import format as fmt
from raftlog.node.cli import localcluster
from raftlog.node.cli.base import (
    EXIT_ERROR,
    EXIT_OK,
    UsageError,
    address,
    common_options,
    emit,
    group,
    leaf,
    positive,
    seconds,
    show,
    typed,
    warn,
    with_client,
)
from raftlog.node.cli.client import Client, default_server, describe_failure
from raftlog.node.config import default_peer_address
from raftlog.node.transport.credentials import generate_secret
from raftlog.v1 import cluster_pb2, cluster_pb2_grpc

base_port_default = 7400  # n1 then serves gRPC on the CLI's default server address
nodes_default = 3
# A move may take the node up to 3 catch-up attempts of 30 s each plus a handover: the deadline
# of `stream migrate` is --timeout plus this, and `cluster rebalance` adds it once per step.
move_wait_s = 100.0

LocalHandler = Callable[[argparse.Namespace], int]


def register(commands: Any) -> None:
    """Adds `cluster ...` and `stream route`; call after `add_stream_commands(commands)`."""
    cluster = group(commands, "cluster", "run a local cluster; membership, placement and stats")
    _add_local_commands(cluster)
    _add_admin_commands(cluster)
    stream = _stream_group(commands)
    route = leaf(stream, "route", _stream_route, "explain a stream's placement")
    route.add_argument("name", metavar="NAME")
    _add_placement_commands(cluster, stream)


def _stream_group(commands: Any) -> Any:
    """The `stream` command's subparsers, which cli_streams created but does not hand out."""
    stream = commands.choices.get("stream")
    if stream is None:
        return group(commands, "stream", "create, inspect, change and delete streams")
    for action in stream._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise RuntimeError("the `stream` command has no actions to add `route` to")


def _add_local_commands(cluster: Any) -> None:
    up = _local_leaf(cluster, "up", _cluster_up, "start a cluster of node processes on loopback")
    up.add_argument("--nodes", type=positive, default=nodes_default, metavar="N", help="default 3")
    up.add_argument(
        "--base-port",
        type=positive,
        default=base_port_default,
        metavar="P",
        help="node i serves gRPC on P+3(i-1), Raft on the port after it and its peer "
        "listener on the next (default 7400)",
    )
    _add_data(up, required=True)
    up.add_argument("--secret-file", type=Path, metavar="FILE",
                    help="the cluster secret (default: DIR/cluster.secret, made when missing)")
    up.add_argument(
        "--no-wait", action="store_true", help="return once started, without waiting for Raft"
    )
    up.add_argument(
        "--ready-timeout",
        type=typed(seconds),
        default=localcluster.ready_timeout_s_default,
        metavar="DURATION",
        help="how long to wait for a leader and all members (default 60s)",
    )
    _local_leaf(cluster, "secret", _cluster_secret,
                "print a new cluster secret (64 random hex digits) for --secret-file")
    down = _local_leaf(cluster, "down", _cluster_down, "stop the nodes that `up` recorded")
    _add_data(down, required=True)
    down.add_argument(
        "--stop-timeout",
        type=typed(seconds),
        default=localcluster.stop_timeout_s_default,
        metavar="DURATION",
        help="SIGTERM, then SIGKILL after this long (default 15s)",
    )
    status = cluster.add_parser(
        "status",
        help="members, the Raft leader, terms and health",
        description="Members, the Raft leader, terms and each node's health, as --server sees "
        "them. With --data, also the local processes; --server then defaults to a running "
        "node of that directory.",
        parents=[common_options(per_command=True)],
    )
    _add_data(status, required=False)
    status.set_defaults(run=_guarded(_cluster_status))


def _add_data(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--data",
        type=Path,
        required=required,
        metavar="DIR",
        help="the local cluster's directory (DIR/n1, DIR/n1.log, DIR/n1.pid, ...)",
    )


def _local_leaf(
    commands: Any, name: str, handler: LocalHandler, help_text: str
) -> argparse.ArgumentParser:
    """A subcommand that works on local processes: only --json, no node connection."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON document"
    )
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=help_text, description=help_text, parents=[options]
    )
    parser.set_defaults(run=_guarded(handler))
    return parser


def _guarded(handler: LocalHandler) -> LocalHandler:
    def run(args: argparse.Namespace) -> int:
        args.json = getattr(args, "json", False)
        try:
            return handler(args)
        except localcluster.LocalClusterError as exc:
            warn(fmt.error_text(exc.reason.name, exc.message, {}))
            return EXIT_ERROR

    return run


def _add_admin_commands(cluster: Any) -> None:
    join = leaf(cluster, "join", _cluster_join,
                "add a running node to the cluster (start it first, with --peers naming the "
                "members and the cluster secret)")
    join.add_argument("node_id", metavar="NODE_ID")
    join.add_argument("--raft", required=True, type=typed(address), metavar="HOST:PORT")
    join.add_argument("--grpc", required=True, type=typed(address), metavar="HOST:PORT")
    join.add_argument("--peer", type=typed(address), metavar="HOST:PORT",
                      help="its peer listener (default: the Raft host, Raft port + 1)")
    leave = leaf(cluster, "leave", _cluster_leave, "remove a node (then stop it)")
    leave.add_argument("node_id", metavar="NODE_ID")
    leaf(cluster, "overrides", _cluster_overrides, "list authority overrides")
    stats = leaf(cluster, "stats", _cluster_stats, "per-node stream totals and skew")
    stats.add_argument("--streams", action="store_true", help="also list every stream")
    watch = leaf(
        cluster,
        "watch",
        _cluster_watch,
        "print stream, consumer, authority and member changes as they commit (Ctrl-C ends it)",
    )
    watch.add_argument("--count", type=positive, metavar="N", help="stop after N events")
    watch.add_argument(
        "--max-time", type=typed(seconds), metavar="DURATION", help="stop after this long"
    )


# ---------------------------------------------------------------------------------------------
# Local processes.


def _cluster_up(args: argparse.Namespace) -> int:
    nodes = localcluster.up(
        nodes=args.nodes,
        base_port=args.base_port,
        data_dir=args.data,
        secret_file=args.secret_file,
    )
    ready: cluster_pb2.ClusterStatus | None = None
    failure: localcluster.LocalClusterError | None = None
    if not args.no_wait:
        try:
            ready = localcluster.wait_ready(nodes, args.ready_timeout)
        except localcluster.LocalClusterError as exc:
            failure = exc
    document = {
        "nodes": [_local_node_dict(node) for node in nodes],
        "ready": ready is not None,
        "raft_leader": ready.raft_leader if ready is not None else "",
    }
    emit(args, document, lambda: _up_text(nodes, ready))
    root = nodes[0].spec.root
    if failure is not None:
        warn(fmt.error_text(failure.reason.name, failure.message, {}))
        warn(
            f"nodes that still run are left running: see {root}/n*.log, stop them with "
            f"`raftlog cluster down --data {root}`"
        )
        return EXIT_ERROR
    secret = args.secret_file or nodes[0].spec.secret_path
    warn(f"admin calls (join, leave, migrate, pin, rebalance) need the cluster secret: "
         f"export RAFTLOG_SECRET_FILE={secret}")
    warn(f"stop with: raftlog cluster down --data {root}")
    return EXIT_OK


def _cluster_secret(args: argparse.Namespace) -> int:
    show(generate_secret())
    return EXIT_OK


def _local_node_dict(node: localcluster.LocalNode) -> dict[str, object]:
    return {
        "node_id": node.node_id,
        "grpc_address": node.grpc_address,
        "raft_address": node.raft_address,
        "peer_address": node.spec.peer_address,
        "pid": node.pid,
        "log": str(node.log_path),
        "data_dir": str(node.spec.data_dir),
    }


def _up_text(
    nodes: Sequence[localcluster.LocalNode], ready: cluster_pb2.ClusterStatus | None
) -> str:
    table = fmt.render_table(
        ["ID", "GRPC", "RAFT", "PEER", "PID", "LOG"],
        [(n.node_id, n.grpc_address, n.raft_address, n.spec.peer_address, n.pid, n.log_path)
         for n in nodes],
        right_align=[4],
    )
    if ready is None:
        return table
    return f"{table}\n\nready: Raft leader {ready.raft_leader}, term {ready.raft_term}"


def _cluster_down(args: argparse.Namespace) -> int:
    results = localcluster.down(args.data, args.stop_timeout)
    document = {
        "stopped": [
            {"node_id": r.node_id, "pid": r.pid, "outcome": r.outcome.value} for r in results
        ]
    }

    def text() -> str:
        if not results:
            return f"no nodes recorded under {args.data}"
        rows = [(r.node_id, r.pid or "-", r.outcome.value) for r in results]
        return fmt.render_table(["ID", "PID", "OUTCOME"], rows, right_align=[1])

    emit(args, document, text)
    survivors = [r for r in results if r.outcome is localcluster.StopOutcome.SURVIVED]
    for result in results:
        if result.outcome is localcluster.StopOutcome.REFUSED:
            warn(
                f"{result.node_id}: pid {result.pid} now belongs to another program; "
                "not signalled, stale pid file removed"
            )
        elif result.outcome is localcluster.StopOutcome.UNREADABLE:
            warn(f"{result.node_id}: cannot read {result.pid_path}; left in place")
    if survivors:
        names = ", ".join(f"{r.node_id} (pid {r.pid})" for r in survivors)
        warn(fmt.error_text("STOP_FAILED", f"still running after SIGKILL: {names}", {}))
        return EXIT_ERROR
    return EXIT_OK


def _cluster_status(args: argparse.Namespace) -> int:
    local = localcluster.status(args.data) if args.data is not None else None
    server = _status_server(args.server, local)
    try:
        answer = asyncio.run(_get_status(server, timeout_s=args.timeout or None))
    except grpc.RpcError as exc:
        if local is not None:
            emit(args, {"local": _local_dicts(local)}, lambda: _local_table(local))
        warn(describe_failure(exc, address=server))
        return EXIT_ERROR
    document = fmt.proto_dict(answer)
    if local is not None:
        document["local"] = _local_dicts(local)
    emit(args, document, lambda: _status_text(answer, local))
    return EXIT_OK


def _status_server(server: str, local: Sequence[localcluster.NodeProcessStatus] | None) -> str:
    """--server, unless it was left at the default and --data names nodes elsewhere."""
    if local is None or server != default_server():
        return server
    running = [node.grpc_address for node in local if node.alive]
    return server if server in running or not running else running[0]


async def _get_status(server: str, *, timeout_s: float | None) -> cluster_pb2.ClusterStatus:
    async with Client(server, timeout_s=timeout_s) as client:
        return await _stub(client).GetClusterStatus(
            cluster_pb2.GetClusterStatusRequest(), timeout=client.deadline_s()
        )


def _local_dicts(local: Sequence[localcluster.NodeProcessStatus]) -> list[dict[str, object]]:
    return [
        {
            "node_id": node.node_id,
            "pid": node.pid,
            "state": node.state.value,
            "grpc_address": node.grpc_address,
            "raft_address": node.raft_address,
            "log": str(node.log_path),
        }
        for node in local
    ]


def _local_table(local: Sequence[localcluster.NodeProcessStatus]) -> str:
    if not local:
        return "no local nodes recorded"
    rows = [(n.node_id, n.pid, n.state.value, n.grpc_address, n.log_path) for n in local]
    return fmt.render_table(["ID", "PID", "PROCESS", "GRPC", "LOG"], rows, right_align=[1])


# ---------------------------------------------------------------------------------------------
# The Cluster service.


def _stub(client: Client) -> cluster_pb2_grpc.ClusterAsyncStub:
    return cluster_pb2_grpc.ClusterStub(client.channel)


def health_name(value: cluster_pb2.NodeHealth.ValueType) -> str:
    return cluster_pb2.NodeHealth.Name(value).removeprefix("NODE_HEALTH_").lower()


def _status_text(
    status: cluster_pb2.ClusterStatus,
    local: Sequence[localcluster.NodeProcessStatus] | None = None,
) -> str:
    by_id = {node.node_id: node for node in local or ()}
    headers = ["ID", "HEALTH", "LEADER", "CONNECTED", "GRPC", "RAFT", "PRIMARIES", "REPLICAS"]
    if local is not None:
        headers += ["PID", "PROCESS"]
    rows = []
    for node in status.nodes:
        row: list[object] = [
            node.node_id,
            health_name(node.health),
            "*" if node.node_id == status.raft_leader else "",
            "yes" if node.connected else "no",
            node.grpc_address,
            node.raft_address,
            node.primaries,
            node.replicas,
        ]
        if local is not None:
            mine = by_id.get(node.node_id)
            row += [mine.pid, mine.state.value] if mine else ["-", "-"]
        rows.append(row)
    head = (
        f"Raft leader {status.raft_leader or 'none'}, term {status.raft_term}, "
        f"commit {status.commit_index}, applied {status.applied_index} "
        f"(answered by {status.answered_by or '?'})"
    )
    lines = [head, "", fmt.render_table(headers, rows, right_align=[6, 7])]
    members = {node.node_id for node in status.nodes}
    strays = [node for node in local or () if node.node_id not in members]
    if strays:
        lines += ["", "local nodes that are not members:", _local_table(strays)]
    return "\n".join(lines)


async def _cluster_join(client: Client, args: argparse.Namespace) -> int:
    request = cluster_pb2.JoinNodeRequest(
        node_id=args.node_id, raft_address=args.raft, grpc_address=args.grpc,
        peer_address=args.peer or default_peer_address(args.raft),
    )
    status = await _stub(client).JoinNode(request, timeout=client.deadline_s(),
                                          metadata=client.admin("JoinNode"))
    emit(args, fmt.proto_dict(status), lambda: _status_text(status))
    return EXIT_OK


async def _cluster_leave(client: Client, args: argparse.Namespace) -> int:
    request = cluster_pb2.LeaveNodeRequest(node_id=args.node_id)
    status = await _stub(client).LeaveNode(request, timeout=client.deadline_s(),
                                           metadata=client.admin("LeaveNode"))
    emit(args, fmt.proto_dict(status), lambda: _status_text(status))
    warn(f"{args.node_id} left the cluster; stop its process now")
    return EXIT_OK


async def _cluster_overrides(client: Client, args: argparse.Namespace) -> int:
    request = cluster_pb2.ListAuthorityOverridesRequest()
    response = await _stub(client).ListAuthorityOverrides(request, timeout=client.deadline_s())

    def text() -> str:
        if not response.overrides:
            return "no authority overrides"
        rows = [
            (
                o.stream,
                o.claimant,
                o.fence_epoch,
                "yes" if o.pinned else "no",
                fmt.human_time_ms(o.set_ms),
            )
            for o in response.overrides
        ]
        return fmt.render_table(
            ["STREAM", "CLAIMANT", "FENCE EPOCH", "PINNED", "SET"], rows, right_align=[2]
        )

    emit(args, fmt.proto_dict(response), text)
    return EXIT_OK


async def _cluster_stats(client: Client, args: argparse.Namespace) -> int:
    request = cluster_pb2.GetClusterStreamStatsRequest()
    stats = await _stub(client).GetClusterStreamStats(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(stats), lambda: stats_text(stats, streams=args.streams))
    return EXIT_OK


def stats_text(stats: cluster_pb2.ClusterStreamStats, *, streams: bool) -> str:
    rows = [
        (
            n.node_id,
            "yes" if n.reachable else "NO",
            n.streams,
            fmt.human_count(n.messages),
            fmt.human_size(n.bytes),
        )
        for n in stats.nodes
    ]
    lines = [
        fmt.render_table(
            ["NODE", "REACHABLE", "STREAMS", "MESSAGES", "BYTES"], rows, right_align=[2, 3, 4]
        ),
        "",
        f"skew (max / mean per reachable node; 1.00 = even): streams {stats.stream_skew:.2f}, "
        f"bytes {stats.bytes_skew:.2f}",
    ]
    if streams and stats.streams:
        per_stream = [
            (
                s.stream,
                s.primary,
                fmt.human_count(s.messages),
                fmt.human_size(s.bytes),
                s.last_seq,
                s.consumers,
            )
            for s in stats.streams
        ]
        lines += [
            "",
            fmt.render_table(
                ["STREAM", "PRIMARY", "MESSAGES", "BYTES", "LAST SEQ", "CONSUMERS"],
                per_stream,
                right_align=[2, 3, 4, 5],
            ),
        ]
    return "\n".join(lines)


async def _cluster_watch(client: Client, args: argparse.Namespace) -> int:
    call = _stub(client).WatchStreams(cluster_pb2.WatchStreamsRequest(), timeout=args.max_time)
    events: list[cluster_pb2.WatchEvent] = []

    async def consume() -> str:
        async for event in call:
            events.append(event)
            if not args.json:
                show(event_text(event))
            if args.count is not None and len(events) >= args.count:
                return f"received {args.count} events"
        return "the node ended the watch"

    stopped = "interrupted"
    task = asyncio.current_task()
    try:
        with _signals_cancel(task) as interrupted:
            stopped = await consume()
    except asyncio.CancelledError:
        if task is None or not interrupted.is_set():
            raise
        task.uncancel()
    except grpc.RpcError as exc:
        if not (args.max_time and _is_deadline(exc)):
            raise
        stopped = f"--max-time {args.max_time:g}s reached"
    finally:
        call.cancel()
    if args.json:
        show(fmt.to_json({"events": [fmt.proto_dict(e) for e in events], "stopped": stopped}))
    else:
        warn(f"{stopped}: {len(events)} events")
    return EXIT_OK


def _is_deadline(exc: grpc.RpcError) -> bool:
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def event_text(event: cluster_pb2.WatchEvent) -> str:
    kind = cluster_pb2.WatchEventType.Name(event.type).removeprefix("WATCH_EVENT_TYPE_")
    fields = [
        ("stream", event.stream),
        ("consumer", event.consumer),
        ("node", event.node_id),
    ]
    parts = [f"{key}={value}" for key, value in fields if value]
    if event.type == cluster_pb2.WATCH_EVENT_TYPE_AUTHORITY_CHANGED:
        parts += [f"claimant={event.claimant or '(cleared)'}", f"fence_epoch={event.fence_epoch}"]
    return f"{fmt.human_time_ms(event.ts_ms)}  #{event.index}  {kind.lower()}  {' '.join(parts)}"


@contextlib.contextmanager
def _signals_cancel(task: asyncio.Task[Any] | None) -> Iterator[threading.Event]:
    """While inside, Ctrl-C or SIGTERM cancels `task` (so a watch ends with exit status 0 and
    prints what it collected); the yielded event says whether that happened."""
    interrupted = threading.Event()
    if task is None or threading.current_thread() is not threading.main_thread():
        yield interrupted
        return
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        interrupted.set()
        task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal)
    try:
        yield interrupted
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


# ---------------------------------------------------------------------------------------------
# stream route.


async def _stream_route(client: Client, args: argparse.Namespace) -> int:
    request = cluster_pb2.ExplainRouteRequest(stream=args.name)
    route = await _stub(client).ExplainRoute(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(route), lambda: route_text(route))
    return EXIT_OK


def route_text(route: cluster_pb2.RouteExplanation) -> str:
    exists = "" if route.exists else " (does not exist: placement if it were created now)"
    primary = route.primary or "none"
    if route.primary_grpc_address:
        primary += f" ({route.primary_grpc_address})"
    epoch = f"{route.fence_epoch}"
    if route.epoch_start_seq:
        epoch += f" (from seq {route.epoch_start_seq})"
    fields: list[tuple[str, object]] = [
        ("Primary", primary),
        ("Replicas", ", ".join(route.replicas) or "none"),
        ("Ring owner", route.ring_owner or "none"),
        ("Override", route.override_claimant or "none"),
        ("Pinned", "yes" if route.pinned else "no"),
        ("Fence epoch", epoch),
        ("Reason", route.reason or "-"),
    ]
    return fmt.render_block(f"Stream {route.stream}{exists}", fields)


# ---------------------------------------------------------------------------------------------
# Placement and authority: stream migrate|pin|unpin, cluster rebalance|clear-authority.


def _add_placement_commands(cluster: Any, stream: Any) -> None:
    migrate = leaf(
        stream,
        "migrate",
        _stream_migrate,
        "move a stream's primary to NODE: it becomes a replica if it is not one, catches up, "
        f"then takes over at the next fence epoch (the deadline is --timeout + {move_wait_s:g}s)",
    )
    migrate.add_argument("name", metavar="NAME")
    migrate.add_argument("target", metavar="NODE", help="node id of the new primary")
    migrate.add_argument(
        "--pin", action="store_true", help="keep the stream on NODE (exempt from clean-up)"
    )
    pin = leaf(stream, "pin", _stream_pin, "pin a stream to its authority override's node")
    pin.add_argument("name", metavar="NAME")
    unpin = leaf(stream, "unpin", _stream_unpin, "release a pinned authority override")
    unpin.add_argument("name", metavar="NAME")

    rebalance = leaf(
        cluster,
        "rebalance",
        _cluster_rebalance,
        "run a plan of stream moves in order, one outcome per step (exit 1 if any step failed)",
    )
    rebalance.add_argument(
        "pairs",
        nargs="*",
        metavar="STREAM=NODE",
        help="a step: move STREAM's primary to NODE (or give --plan)",
    )
    rebalance.add_argument(
        "--plan",
        metavar="FILE",
        help='JSON steps, [{"stream": "a", "target": "n2"}, ...] or {"steps": [...]}; '
        "- reads stdin",
    )
    rebalance.add_argument(
        "--stop-on-error", action="store_true", help="stop at the first failed step"
    )
    # The plan is read and checked before connecting: bad input exits 2 and sends nothing.
    rebalance.set_defaults(run=_with_plan(with_client(_cluster_rebalance)))
    clear = leaf(
        cluster,
        "clear-authority",
        _cluster_clear_authority,
        "drop a stream's authority override (placement falls back to the ring)",
    )
    clear.add_argument("name", metavar="NAME")


async def _stream_migrate(client: Client, args: argparse.Namespace) -> int:
    request = cluster_pb2.MigrateStreamRequest(stream=args.name, target=args.target, pin=args.pin)
    answer = await _stub(client).MigrateStream(
        request, timeout=client.deadline_s(extra_s=move_wait_s),
        metadata=client.admin("MigrateStream")
    )
    emit(args, fmt.proto_dict(answer), lambda: migrate_text(answer, pinned=args.pin))
    return EXIT_OK


def migrate_text(answer: cluster_pb2.MigrateStreamResponse, *, pinned: bool = False) -> str:
    fields: list[tuple[str, object]] = [
        ("Primary", f"{answer.from_node or '?'} -> {answer.to_node}"),
        ("Fence epoch", answer.fence_epoch),
        ("Start seq", answer.epoch_start_seq or "-"),
        ("Outcome", answer.outcome or "-"),
        ("Attempts", answer.attempts),
    ]
    if pinned:
        fields.append(("Pinned", "yes"))
    return fmt.render_block(f"Stream {answer.stream}", fields)


async def _stream_pin(client: Client, args: argparse.Namespace) -> int:
    return await _set_pinned(client, args, pinned=True)


async def _stream_unpin(client: Client, args: argparse.Namespace) -> int:
    return await _set_pinned(client, args, pinned=False)


async def _set_pinned(client: Client, args: argparse.Namespace, *, pinned: bool) -> int:
    request = cluster_pb2.SetStreamPinnedRequest(stream=args.name, pinned=pinned)
    await _stub(client).SetStreamPinned(request, timeout=client.deadline_s(),
                                        metadata=client.admin("SetStreamPinned"))
    document = {"stream": args.name, "pinned": pinned}
    if pinned:
        text = f"stream {args.name} pinned to its authority override's node"
    else:
        text = f"stream {args.name} unpinned"
    emit(args, document, lambda: text)
    return EXIT_OK


async def _cluster_clear_authority(client: Client, args: argparse.Namespace) -> int:
    request = cluster_pb2.ClearStreamAuthorityRequest(stream=args.name)
    answer = await _stub(client).ClearStreamAuthority(
        request, timeout=client.deadline_s(), metadata=client.admin("ClearStreamAuthority"))
    document = {"stream": args.name, **fmt.proto_dict(answer)}
    if answer.cleared:
        text = f"cleared the authority override of stream {args.name}"
    else:
        text = f"stream {args.name} had no authority override: nothing cleared"
    emit(args, document, lambda: text)
    return EXIT_OK


def _with_plan(run: LocalHandler) -> LocalHandler:
    """Parses --plan or the STREAM=NODE pairs into `args.steps` before `run` connects."""

    def planned(args: argparse.Namespace) -> int:
        args.steps = plan_steps(args.plan, args.pairs)
        return run(args)

    return planned


def plan_steps(plan: str | None, pairs: Sequence[str]) -> list[cluster_pb2.RebalanceStep]:
    """The steps of `cluster rebalance`, from a --plan file (`-` = stdin) or STREAM=NODE pairs;
    raises UsageError naming what is wrong."""
    if plan is not None and pairs:
        raise UsageError("give --plan FILE or STREAM=NODE pairs, not both")
    if plan is None:
        if not pairs:
            raise UsageError("nothing to do: give --plan FILE (or -) or STREAM=NODE pairs")
        return [_pair_step(pair) for pair in pairs]
    source = "stdin" if plan == "-" else plan
    try:
        text = sys.stdin.read() if plan == "-" else Path(plan).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read --plan {source}: {exc}") from None
    return parse_plan(text, source=source)


def _pair_step(pair: str) -> cluster_pb2.RebalanceStep:
    stream, sep, target = pair.partition("=")
    if not sep or not stream or not target or "=" in target:
        raise UsageError(f"not a STREAM=NODE pair: {pair!r}")
    return _step(stream, target, where=f"pair {pair!r}")


def parse_plan(text: str, *, source: str = "plan") -> list[cluster_pb2.RebalanceStep]:
    """`[{"stream": "a", "target": "n2"}, ...]` or `{"steps": [...]}` -> steps."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--plan {source} is not JSON: {exc}") from None
    if isinstance(document, dict):
        if set(document) != {"steps"}:
            raise UsageError(
                f'--plan {source}: an object plan has exactly one key, "steps" '
                f"(found {', '.join(map(repr, sorted(document))) or 'none'})"
            )
        document = document["steps"]
    if not isinstance(document, list):
        raise UsageError(
            f'--plan {source}: expected a list of {{"stream": ..., "target": ...}} steps'
        )
    if not document:
        raise UsageError(f"--plan {source} has no steps")
    steps = []
    for number, item in enumerate(document, start=1):
        where = f"--plan {source}, step {number}"
        if not isinstance(item, dict):
            raise UsageError(f'{where}: expected {{"stream": ..., "target": ...}}, got {item!r}')
        unknown = sorted(set(item) - {"stream", "target"})
        if unknown:
            raise UsageError(f"{where}: unknown key {unknown[0]!r} (a step has stream and target)")
        stream, target = _plan_string(item, "stream", where), _plan_string(item, "target", where)
        steps.append(_step(stream, target, where=where))
    return steps


def _plan_string(item: dict[str, object], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise UsageError(f"{where}: {key!r} must be a non-empty string, not {value!r}")
    return value


def _step(stream: str, target: str, *, where: str) -> cluster_pb2.RebalanceStep:
    try:
        subjects.validate_name(stream, what="stream")
        subjects.validate_name(target, what="node")
    except RaftlogError as exc:
        raise UsageError(f"{where}: {exc.message}") from None
    return cluster_pb2.RebalanceStep(stream=stream, target=target)


async def _cluster_rebalance(client: Client, args: argparse.Namespace) -> int:
    steps: list[cluster_pb2.RebalanceStep] = args.steps
    request = cluster_pb2.RebalanceStreamsRequest(steps=steps, stop_on_error=args.stop_on_error)
    deadline = client.deadline_s(extra_s=move_wait_s * len(steps))
    answer = await _stub(client).RebalanceStreams(request, timeout=deadline,
                                                  metadata=client.admin("RebalanceStreams"))
    emit(args, fmt.proto_dict(answer), lambda: rebalance_text(answer))
    if answer.failed:
        not_run = sum(1 for o in answer.outcomes if not o.ran)
        warn(
            fmt.error_text(
                "STEPS_FAILED",
                f"{answer.failed} of {len(answer.outcomes)} steps failed, {not_run} not run",
                {},
            )
        )
        return EXIT_ERROR
    return EXIT_OK


def step_outcome_text(outcome: cluster_pb2.RebalanceStepOutcome) -> str:
    if not outcome.ran:
        return "not run"
    if outcome.ok:
        moved = outcome.result
        return f"ok: {moved.from_node or '?'} -> {moved.to_node}, fence epoch {moved.fence_epoch}"
    error = outcome.error
    return fmt.error_text(error.reason or "UNKNOWN", error.message, error.metadata)


def rebalance_text(answer: cluster_pb2.RebalanceStreamsResponse) -> str:
    rows = [
        (number, o.step.stream, o.step.target, step_outcome_text(o))
        for number, o in enumerate(answer.outcomes, start=1)
    ]
    table = fmt.render_table(["STEP", "STREAM", "TARGET", "OUTCOME"], rows, right_align=[0])
    not_run = sum(1 for o in answer.outcomes if not o.ran)
    summary = f"{answer.succeeded} succeeded, {answer.failed} failed, {not_run} not run"
    return f"{table}\n\n{summary}"
