"""`raftlog pub`: publishing to a stream, from PAYLOAD arguments, from stdin lines (read as they
arrive, in bounded chunks), or as generated load (`--count`, through `loadgen`).

Without --expect-* the messages go in PublishBatch calls of up to `pub_chunk_msgs_max`; with
them, one Publish per message, each expecting the seq the previous one got. `_PubReport`
collects the acks and per-message errors and sets the exit status (1 when any failed).
The `stream ...` commands are in `streams`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc

from raftlog.node.cli import format as fmt
from raftlog.node.cli import loadgen
from raftlog.node.cli.base import (
    EXIT_ERROR,
    EXIT_OK,
    UsageError,
    emit,
    leaf,
    non_negative,
    positive,
    seconds,
    show,
    typed,
    warn,
)
from raftlog.node.cli.client import Client
from raftlog.node.cli.scheduled import add_schedule_options, deliver_at_ms, scheduled_ack_text
from raftlog.node.ops.batches import expand_results
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import streams_pb2, types_pb2

pub_chunk_msgs_max = 1_000  # messages per PublishBatch when publishing args or stdin lines
pub_chunk_bytes_max = 4 * 1024 * 1024  # ... and payload bytes (one line more may overshoot)
stdin_lines_buffered_max = 4 * pub_chunk_msgs_max
load_time_s_default = 300.0


def add_pub_command(commands: Any) -> None:
    pub = leaf(commands, "pub", _pub, "publish messages")
    pub.description = (
        "Publish each PAYLOAD argument as one message, or each line of stdin when there are "
        "none (a payload `base64:...` is decoded). With --count, publish generated messages "
        "as a load test and print msgs/s and latency."
    )
    pub.add_argument("stream", metavar="STREAM")
    pub.add_argument("subject", metavar="SUBJECT")
    pub.add_argument("payloads", nargs="*", metavar="PAYLOAD")
    pub.add_argument(
        "-H",
        "--header",
        dest="headers",
        action="append",
        default=[],
        type=typed(fmt.parse_header),
        metavar="KEY=VALUE",
        help="repeatable",
    )
    pub.add_argument(
        "--msg-id",
        default="",
        metavar="ID",
        help="dedupe id; with several messages the n-th (n > 1) gets ID-n",
    )
    pub.add_argument(
        "--expect-last-seq",
        type=non_negative,
        metavar="N",
        help="publish only if the stream's last seq is N (then chained per message)",
    )
    pub.add_argument(
        "--expect-last-subject-seq",
        type=non_negative,
        metavar="N",
        help="publish only if the subject's last seq is N (then chained)",
    )
    add_schedule_options(pub)
    load = pub.add_argument_group("load mode")
    load.add_argument("--count", type=positive, metavar="N", help="publish N generated messages")
    load.add_argument(
        "--size",
        type=typed(fmt.parse_size),
        default=128,
        metavar="BYTES",
        help="payload size (default 128)",
    )
    load.add_argument(
        "--batch",
        type=positive,
        default=1,
        metavar="K",
        help="messages per PublishBatch call; 1 (default) = unary Publish",
    )
    load.add_argument(
        "--concurrency", type=positive, default=1, metavar="C", help="calls in flight (default 1)"
    )
    load.add_argument(
        "--max-time",
        type=typed(seconds),
        default=load_time_s_default,
        metavar="DURATION",
        help="stop after this long (default 5m)",
    )


# ---------------------------------------------------------------------------------------------
# Messages from arguments or stdin lines.


class _PubReport:
    """Acks and per-message errors of one `pub` run; text lines are printed as they come."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.acks: list[streams_pb2.PublishAck] = []
        self.errors: list[types_pb2.Error] = []

    def ack(self, ack: streams_pb2.PublishAck) -> None:
        self.acks.append(ack)
        if self.args.json:
            return
        if ack.scheduled:
            show(scheduled_ack_text(ack, self.args.subject))
        else:
            show(f"#{ack.seq} {self.args.subject}" + ("  (duplicate)" if ack.duplicate else ""))

    def error(self, error: types_pb2.Error) -> None:
        self.errors.append(error)
        warn(fmt.error_text(error.reason, error.message, dict(error.metadata)))

    def finish(self) -> int:
        duplicates = sum(1 for ack in self.acks if ack.duplicate)
        if self.args.json:
            show(
                fmt.to_json(
                    {
                        "stream": self.args.stream,
                        "published": len(self.acks) - duplicates,
                        "duplicates": duplicates,
                        "failed": len(self.errors),
                        "acks": [fmt.proto_dict(ack) for ack in self.acks],
                        "errors": [fmt.proto_dict(error) for error in self.errors],
                    }
                )
            )
        elif len(self.acks) + len(self.errors) != 1:
            show(
                f"published {len(self.acks) - duplicates} messages to {self.args.stream}"
                + (f", {duplicates} duplicates" if duplicates else "")
                + (f", {len(self.errors)} failed" if self.errors else "")
            )
        return EXIT_ERROR if self.errors else EXIT_OK


async def _pub(client: Client, args: argparse.Namespace) -> int:
    args.deliver_at_ms = deliver_at_ms(args)
    if args.count is not None:
        expects = args.expect_last_seq, args.expect_last_subject_seq
        if args.payloads or args.msg_id or expects != (None, None):
            raise UsageError("--count generates its payloads: no PAYLOAD, --msg-id or --expect-*")
        return await _pub_load(client, args)
    args.headers = [types_pb2.Header(key=k, value=v) for k, v in args.headers]
    if args.payloads:
        payloads = [_payload_arg(text) for text in args.payloads]
        chunks: AsyncIterator[list[bytes]] = _list_chunks(payloads)
    else:
        if sys.stdin.isatty():
            warn("reading messages from stdin, one per line; Ctrl-D ends")
        chunks = _stdin_chunks()
    report = _PubReport(args)
    chained = args.expect_last_seq is not None or args.expect_last_subject_seq is not None \
        or args.deliver_at_ms != 0  # PublishBatch carries no deliver_at_ms
    publish = _pub_chained if chained else _pub_batched
    await publish(client, args, chunks, report)
    return report.finish()


def _payload_arg(text: str) -> bytes:
    try:
        return fmt.decode_payload_arg(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _msg_id(base: str, index: int) -> str:
    """The message id of the index-th message (0-based) of one `pub` run."""
    return base if not base or index == 0 else f"{base}-{index + 1}"


async def _pub_batched(
    client: Client,
    args: argparse.Namespace,
    chunks: AsyncIterator[list[bytes]],
    report: _PubReport,
) -> None:
    index = 0
    async for chunk in chunks:
        entries = [
            streams_pb2.PublishEntry(
                subject=args.subject,
                payload=payload,
                headers=args.headers,
                msg_id=_msg_id(args.msg_id, index + offset),
            )
            for offset, payload in enumerate(chunk)
        ]
        index += len(entries)
        request = streams_pb2.PublishBatchRequest(stream=args.stream, entries=entries)
        response = await client.streams.PublishBatch(request, timeout=client.deadline_s())
        for result in expand_results(response):
            if result.HasField("ack"):
                report.ack(result.ack)
            else:
                report.error(result.error)


async def _pub_chained(
    client: Client,
    args: argparse.Namespace,
    chunks: AsyncIterator[list[bytes]],
    report: _PubReport,
) -> None:
    """One Publish per message; the expectations hold for the first message and then chain
    (each next message expects the previous one's seq), so the run appends without anyone
    interleaving or stops at the first conflict."""
    expect_last, expect_subject = args.expect_last_seq, args.expect_last_subject_seq
    index = 0
    async for chunk in chunks:
        for payload in chunk:
            request = streams_pb2.PublishRequest(
                stream=args.stream,
                subject=args.subject,
                payload=payload,
                headers=args.headers,
                msg_id=_msg_id(args.msg_id, index),
                expected_last_seq=expect_last,
                expected_last_subject_seq=expect_subject,
                deliver_at_ms=args.deliver_at_ms,
            )
            index += 1
            try:
                ack = await client.streams.Publish(request, timeout=client.deadline_s())
            except grpc.RpcError as exc:
                failure = from_rpc_error(exc)
                if failure is None:
                    raise
                report.error(
                    types_pb2.Error(
                        code=exc.code().value[0],
                        reason=failure.reason.name,
                        message=failure.message,
                        metadata=failure.metadata,
                    )
                )
                return
            report.ack(ack)
            if not ack.duplicate:
                expect_last = None if expect_last is None else ack.seq
                expect_subject = None if expect_subject is None else ack.seq


async def _list_chunks(payloads: list[bytes]) -> AsyncIterator[list[bytes]]:
    for start in range(0, len(payloads), pub_chunk_msgs_max):
        yield payloads[start : start + pub_chunk_msgs_max]


async def _stdin_chunks() -> AsyncIterator[list[bytes]]:
    """Lines of stdin (without their line break), grouped into what has arrived so far: a pipe
    gives full chunks, a terminal or `tail -f` one line at a time. A reader thread blocks on
    stdin; at most `stdin_lines_buffered_max` lines wait in memory."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    slots = threading.Semaphore(stdin_lines_buffered_max)
    stop = threading.Event()

    def read() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the command is over
            for line in _stdin_lines():
                while not slots.acquire(timeout=0.2):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                loop.call_soon_threadsafe(queue.put_nowait, line)
            loop.call_soon_threadsafe(queue.put_nowait, None)

    threading.Thread(target=read, name="raftlog-pub-stdin", daemon=True).start()
    try:
        while (line := await queue.get()) is not None:
            slots.release()
            chunk, size = [line], len(line)
            while len(chunk) < pub_chunk_msgs_max and size < pub_chunk_bytes_max:
                if queue.empty() or (line := queue.get_nowait()) is None:
                    break
                slots.release()
                chunk.append(line)
                size += len(line)
            yield chunk
            if line is None:
                return
    finally:
        stop.set()


def _stdin_lines() -> Iterator[bytes]:
    stream = sys.stdin.buffer
    while line := stream.readline():
        yield line.removesuffix(b"\n").removesuffix(b"\r")


# ---------------------------------------------------------------------------------------------
# Load mode (--count).


async def _pub_load(client: Client, args: argparse.Namespace) -> int:
    payload = os.urandom(args.size)
    common = {
        "stream": args.stream,
        "subject": args.subject,
        "payload": payload,
        "count": args.count,
        "time_limit_s": args.max_time,
    }
    if args.batch == 1:
        result = await loadgen.publish_unary(client, callers=args.concurrency, **common)
        how = f"unary Publish, {args.concurrency} in flight"
    else:
        result = await loadgen.publish_batch(
            client, batch=args.batch, inflight=args.concurrency, **common
        )
        how = f"PublishBatch of {args.batch}, {args.concurrency} in flight"
    summary = result.summary()
    document = {
        "stream": args.stream,
        "subject": args.subject,
        "size": args.size,
        "batch": args.batch,
        "concurrency": args.concurrency,
        **summary,
    }
    emit(
        args,
        document,
        lambda: (
            f"published {fmt.human_count(result.msgs)} messages of {fmt.human_size(args.size)} in "
            f"{result.elapsed_s:.2f}s ({how}): {result.msgs_per_s:,.0f} msgs/s; per call "
            f"p50 {summary['p50_ms']} ms, p99 {summary['p99_ms']} ms"
            + ("" if result.stopped_by == "count" else f"; stopped by {result.stopped_by}")
        ),
    )
    if result.first_error:
        warn(result.first_error)
        return EXIT_ERROR
    return EXIT_OK
