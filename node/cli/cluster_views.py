"""Read-only views of the whole cluster: `raftlog cluster overrides` (authority overrides),
`cluster stats` (per-node totals and skew), `cluster watch` (metadata changes as they commit)
and `raftlog stream route` (why a stream lives where it does).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from raftlog.node.cli import format as fmt
from raftlog.node.cli.base import (
    EXIT_OK,
    emit,
    leaf,
    positive,
    seconds,
    show,
    typed,
    warn,
)
from raftlog.node.cli.client import Client
from raftlog.node.cli.cluster_base import stub
from raftlog.v1 import cluster_pb2


def add_view_commands(cluster: Any, stream: Any) -> None:
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
    route = leaf(stream, "route", _stream_route, "explain a stream's placement")
    route.add_argument("name", metavar="NAME")


async def _cluster_overrides(client: Client, args: argparse.Namespace) -> int:
    request = cluster_pb2.ListAuthorityOverridesRequest()
    response = await stub(client).ListAuthorityOverrides(request, timeout=client.deadline_s())

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
    stats = await stub(client).GetClusterStreamStats(request, timeout=client.deadline_s())
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
    call = stub(client).WatchStreams(cluster_pb2.WatchStreamsRequest(), timeout=args.max_time)
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
    route = await stub(client).ExplainRoute(request, timeout=client.deadline_s())
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
