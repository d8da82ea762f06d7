"""`raftlog consumer ...`, `raftlog fetch`, `raftlog sub` and `raftlog health`: durable
consumers, reading messages (acked unless --no-ack) and checking a node."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from raftlog.base import limits
from raftlog.node.cli import format as fmt
from raftlog.node.cli.base import (
    EXIT_ERROR,
    EXIT_OK,
    UsageError,
    emit,
    group,
    leaf,
    non_negative,
    positive,
    seconds,
    show,
    typed,
    warn,
)
from raftlog.node.cli.client import Client, call_timeout_s_default
from raftlog.v1 import consumers_pb2, types_pb2

sub_ack_period_s = 0.05  # `sub` acks what it printed at least this often


def add_consumer_commands(commands: Any) -> None:
    _add_consumer(commands)
    _add_fetch(commands)
    _add_sub(commands)
    _add_health(commands)


def _add_consumer(commands: Any) -> None:
    consumer = group(commands, "consumer", "create, inspect and delete durable consumers")
    create = leaf(consumer, "create", _consumer_create, "create a durable consumer")
    create.add_argument("stream", metavar="STREAM")
    create.add_argument("name", metavar="NAME")
    create.add_argument(
        "--filter",
        default="",
        metavar="SUBJECT",
        help="only subjects matching this pattern (default: all)",
    )
    create.add_argument(
        "--deliver",
        choices=list(fmt.DELIVER_NAMES),
        help="where to start (default all; implied by --start-seq/--start-time)",
    )
    create.add_argument("--start-seq", type=positive, metavar="N")
    create.add_argument(
        "--start-time",
        type=typed(fmt.parse_time_ms),
        metavar="TIME",
        help="ISO 8601 (no zone = local time) or ms since the epoch",
    )
    create.add_argument(
        "--ack-wait",
        type=typed(fmt.parse_duration_ms),
        metavar="DURATION",
        help="redeliver when not acked within this (default 30s)",
    )
    create.add_argument(
        "--max-deliver",
        type=non_negative,
        default=0,
        metavar="N",
        help="deliveries before a message is given up (default unlimited)",
    )
    create.add_argument(
        "--backoff",
        type=typed(fmt.parse_duration_list_ms),
        default=[],
        metavar="D1,D2",
        help="delays before redeliveries, e.g. 1s,5s,30s",
    )
    create.add_argument(
        "--max-ack-pending",
        type=non_negative,
        default=0,
        metavar="N",
        help="unacked deliveries before fetch gives nothing (default 1000)",
    )
    create.add_argument(
        "--dead-letter",
        default="",
        metavar="SUBJECT",
        help="republish given-up messages here (same stream)",
    )
    create.add_argument("--description", default="", metavar="TEXT")
    for name, handler, help_text in (
        ("info", _consumer_info, "show a consumer's config and state"),
        ("rm", _consumer_rm, "delete a consumer"),
    ):
        action = leaf(consumer, name, handler, help_text)
        action.add_argument("stream", metavar="STREAM")
        action.add_argument("name", metavar="NAME")
    leaf(consumer, "ls", _consumer_ls, "list a stream's consumers").add_argument(
        "stream", metavar="STREAM"
    )


def _add_fetch(commands: Any) -> None:
    fetch = leaf(commands, "fetch", _fetch, "fetch a batch of messages and ack them")
    fetch.add_argument("stream", metavar="STREAM")
    fetch.add_argument("consumer", metavar="CONSUMER")
    fetch.add_argument("--batch", type=positive, default=10, metavar="N", help="default 10")
    fetch.add_argument(
        "--wait",
        type=typed(fmt.parse_duration_ms),
        default=2000,
        metavar="DURATION",
        help="wait this long for a first message (default 2s)",
    )
    fetch.add_argument("--no-ack", action="store_true", help="leave the messages pending")


def _add_sub(commands: Any) -> None:
    sub = leaf(
        commands,
        "sub",
        _sub,
        "print messages as they arrive and ack them (Ctrl-C ends it, exit status 0)",
    )
    sub.add_argument("stream", metavar="STREAM")
    sub.add_argument("consumer", metavar="CONSUMER")
    sub.add_argument(
        "--batch",
        type=positive,
        default=0,
        metavar="N",
        help="messages per server-side fetch (default 64)",
    )
    sub.add_argument("--no-ack", action="store_true", help="leave the messages pending")
    sub.add_argument(
        "--count",
        type=positive,
        metavar="N",
        help="stop after N messages (the node may already have handed out the next batch: "
        "those are redelivered after the ack wait)",
    )
    sub.add_argument("--stop-when-empty", action="store_true", help="stop once nothing is pending")


def _add_health(commands: Any) -> None:
    health = leaf(commands, "health", _health, "check that the node is serving")
    health.add_argument(
        "--wait",
        type=typed(seconds),
        default=0.0,
        metavar="DURATION",
        help="keep trying this long (default: ask once)",
    )


# ---------------------------------------------------------------------------------------------
# Consumers.


async def _consumer_create(client: Client, args: argparse.Namespace) -> int:
    deliver = _deliver_policy(args)
    config = consumers_pb2.ConsumerConfig(
        name=args.name,
        filter_subject=args.filter,
        deliver_policy=fmt.DELIVER_NAMES[deliver],
        opt_start_seq=args.start_seq or 0,
        opt_start_time_ms=args.start_time or 0,
        ack_wait_ms=args.ack_wait or 0,
        max_deliver=args.max_deliver,
        backoff_ms=args.backoff,
        max_ack_pending=args.max_ack_pending,
        dead_letter_subject=args.dead_letter,
        description=args.description,
    )
    request = consumers_pb2.CreateConsumerRequest(stream=args.stream, config=config)
    info = await client.consumers.CreateConsumer(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(info), lambda: fmt.consumer_info_text(info))
    return EXIT_OK


def _deliver_policy(args: argparse.Namespace) -> str:
    implied = (
        "by-start-seq"
        if args.start_seq is not None
        else "by-start-time"
        if args.start_time is not None
        else "all"
    )
    deliver: str = args.deliver or implied
    if args.start_seq is not None and args.start_time is not None:
        raise UsageError("give --start-seq or --start-time, not both")
    if deliver == "by-start-seq" and args.start_seq is None:
        raise UsageError("--deliver by-start-seq needs --start-seq N")
    if deliver == "by-start-time" and args.start_time is None:
        raise UsageError("--deliver by-start-time needs --start-time TIME")
    if deliver != implied and implied != "all":
        raise UsageError(f"--deliver {deliver} does not take --start-seq/--start-time")
    return deliver


async def _consumer_info(client: Client, args: argparse.Namespace) -> int:
    request = consumers_pb2.GetConsumerInfoRequest(stream=args.stream, consumer=args.name)
    info = await client.consumers.GetConsumerInfo(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(info), lambda: fmt.consumer_info_text(info))
    return EXIT_OK


async def _consumer_ls(client: Client, args: argparse.Namespace) -> int:
    request = consumers_pb2.ListConsumersRequest(stream=args.stream)
    response = await client.consumers.ListConsumers(request, timeout=client.deadline_s())
    emit(
        args,
        fmt.proto_dict(response),
        lambda: (
            fmt.consumers_table(response.consumers)
            if response.consumers
            else f"no consumers on {args.stream}"
        ),
    )
    return EXIT_OK


async def _consumer_rm(client: Client, args: argparse.Namespace) -> int:
    request = consumers_pb2.DeleteConsumerRequest(stream=args.stream, consumer=args.name)
    await client.consumers.DeleteConsumer(request, timeout=client.deadline_s())
    emit(
        args,
        {"deleted": args.name, "stream": args.stream},
        lambda: f"deleted consumer {args.name} of {args.stream}",
    )
    return EXIT_OK


async def _ack(client: Client, args: argparse.Namespace, seqs: list[int]) -> int:
    """Acks `seqs`; returns how many the node accepted and warns about each one it refused
    (the others are acked all the same)."""
    request = consumers_pb2.AckRequest(stream=args.stream, consumer=args.consumer, seqs=seqs)
    reply = await client.consumers.Ack(request, timeout=client.deadline_s())
    refused = [result for result in reply.results if result.HasField("error")]
    for result in refused:
        warn(f"seq {result.seq} not acked: {result.error.reason}: {result.error.message}")
    return len(seqs) - len(refused)


async def _fetch(client: Client, args: argparse.Namespace) -> int:
    request = consumers_pb2.FetchRequest(
        stream=args.stream, consumer=args.consumer, batch=args.batch, max_wait_ms=args.wait
    )
    deadline_s = client.deadline_s(extra_s=args.wait / 1000)
    response = await client.consumers.Fetch(request, timeout=deadline_s)
    seqs = [message.seq for message in response.messages]
    acked = await _ack(client, args, seqs) if seqs and not args.no_ack else 0

    def text() -> str:
        if not seqs:
            return f"no messages (waited {fmt.human_duration_ms(args.wait)})"
        lines = [fmt.message_text(message) for message in response.messages]
        lines.append(
            f"acked {acked} messages"
            if not args.no_ack
            else f"{len(seqs)} messages left unacked (redelivered after the ack wait)"
        )
        return "\n".join(lines)

    document = fmt.proto_dict(response)
    document["acked"] = acked
    emit(args, document, text)
    return EXIT_OK


class _Acker:
    """Collects seqs and acks them in one call every `sub_ack_period_s` (and at the end)."""

    def __init__(self, client: Client, args: argparse.Namespace) -> None:
        self.client, self.args = client, args
        self.pending: list[int] = []
        self.acked = 0

    async def flush(self) -> None:
        while self.pending:
            seqs = self.pending[: limits.ack_seqs_max]
            accepted = await _ack(self.client, self.args, seqs)
            del self.pending[: len(seqs)]
            self.acked += accepted

    async def run(self) -> None:
        while True:
            await asyncio.sleep(sub_ack_period_s)
            await self.flush()


async def _sub(client: Client, args: argparse.Namespace) -> int:
    batch = args.batch or limits.subscribe_batch_default
    if args.count is not None:  # the node hands out whole batches: ask for no more than needed
        batch = min(batch, args.count)
    request = consumers_pb2.SubscribeRequest(
        stream=args.stream,
        consumer=args.consumer,
        batch=batch,
        stop_when_empty=args.stop_when_empty,
    )
    call = client.consumers.Subscribe(request)
    acker = _Acker(client, args)
    messages: list[types_pb2.Message] = []
    stopped = "interrupted"

    async def consume() -> str:
        async for event in call:
            if event.HasField("stopped"):
                return event.stopped.reason or "stopped by the node"
            if not event.HasField("message"):
                continue
            messages.append(event.message)
            if not args.json:
                show(fmt.message_text(event.message))
            if not args.no_ack:
                acker.pending.append(event.message.seq)
            if args.count is not None and len(messages) >= args.count:
                return f"received {args.count} messages"
        return "the node ended the subscription"

    acking = asyncio.create_task(acker.run())
    task = asyncio.current_task()
    try:
        with _signals_cancel(task):
            stopped = await consume()
    except asyncio.CancelledError:
        if not _signal_seen.is_set() or task is None:
            raise
        task.uncancel()
    finally:
        call.cancel()
        acking.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await acking
        await acker.flush()  # also when the subscription failed: ack what was printed
    if args.json:
        show(
            fmt.to_json(
                {
                    "messages": [fmt.proto_dict(m) for m in messages],
                    "acked": acker.acked,
                    "stopped": stopped,
                }
            )
        )
    else:
        warn(f"{stopped}: {len(messages)} messages, {acker.acked} acked")
    return EXIT_OK  # Ctrl-C is the normal way to end `sub`


_signal_seen = threading.Event()


@contextlib.contextmanager
def _signals_cancel(task: asyncio.Task[Any] | None) -> Iterator[None]:
    """While inside, Ctrl-C or SIGTERM cancels `task` (so it can ack what it printed) instead
    of raising wherever the program happens to be."""
    _signal_seen.clear()
    if task is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        _signal_seen.set()
        task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal)
    try:
        yield
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


async def _health(client: Client, args: argparse.Namespace) -> int:
    started = time.monotonic()
    if args.wait > 0:
        serving = await client.wait_serving(timeout_s=args.wait)
    else:
        serving = await client.is_serving(timeout_s=client.deadline_s() or call_timeout_s_default)
    status = "SERVING" if serving else "NOT_SERVING"
    waited_s = round(time.monotonic() - started, 3)
    emit(
        args,
        {"server": args.server, "status": status, "waited_s": waited_s},
        lambda: f"{args.server}: {status}" + ("" if serving else " (or unreachable)"),
    )
    return EXIT_OK if serving else EXIT_ERROR
