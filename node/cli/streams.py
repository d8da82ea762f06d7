"""`raftlog stream ...` and `raftlog pub`: stream lifecycle, direct reads and publishing (from
arguments, from stdin lines, or generated load)."""

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

from raftlog.base import limits
from raftlog.node.api.batches import expand_results
from raftlog.node.cli import format as fmt
from raftlog.node.cli import loadgen
from raftlog.node.cli.base import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
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
from raftlog.node.cli.client import Client
from raftlog.node.transport.rpc import from_rpc_error
from raftlog.v1 import streams_pb2, types_pb2

pub_chunk_msgs_max = 1_000  # messages per PublishBatch when publishing args or stdin lines
pub_chunk_bytes_max = 4 * 1024 * 1024  # ... and payload bytes (one line more may overshoot)
stdin_lines_buffered_max = 4 * pub_chunk_msgs_max
load_time_s_default = 300.0


def add_stream_commands(commands: Any) -> None:
    _add_stream(commands)
    _add_pub(commands)


def _add_stream(commands: Any) -> None:
    stream = group(commands, "stream", "create, inspect, change and delete streams")
    create = leaf(stream, "create", _stream_create, "create a stream")
    create.add_argument("name", metavar="NAME")
    create.add_argument(
        "--retention",
        choices=list(fmt.RETENTION_NAMES),
        default="limits",
        help="limits (default): kept until a limit removes it; work-queue: "
        "removed once acked; interest: removed once every consumer acked",
    )
    _add_stream_limits(create, update=False)
    leaf(stream, "info", _stream_info, "show a stream's config and state").add_argument(
        "name", metavar="NAME"
    )
    ls = leaf(stream, "ls", _stream_ls, "list streams")
    ls.add_argument("--prefix", default="", help="only names starting with this")
    update = leaf(
        stream, "update", _stream_update, "change a stream's limits (lowering one prunes at once)"
    )
    update.add_argument("name", metavar="NAME")
    _add_stream_limits(update, update=True)
    rm = leaf(stream, "rm", _stream_rm, "delete a stream and all its messages")
    rm.add_argument("name", metavar="NAME")
    rm.add_argument("-f", "--force", action="store_true", help="do not ask for confirmation")
    purge = leaf(stream, "purge", _stream_purge, "remove messages (all unless narrowed)")
    purge.add_argument("name", metavar="NAME")
    purge.add_argument("--subject", default="", help="only messages matching this pattern")
    purge.add_argument(
        "--below-seq", type=non_negative, default=0, metavar="N", help="only seqs below N"
    )
    purge.add_argument(
        "--keep",
        type=non_negative,
        default=0,
        metavar="N",
        help="keep the newest N of those that match",
    )
    get = leaf(stream, "get", _stream_get, "show the message at a seq")
    get.add_argument("name", metavar="NAME")
    get.add_argument("seq", metavar="SEQ", type=non_negative)
    last = leaf(stream, "last", _stream_last, "show the latest message at a subject")
    last.add_argument("name", metavar="NAME")
    last.add_argument("subject", metavar="SUBJECT")
    subjects = leaf(stream, "subjects", _stream_subjects, "list a stream's subjects")
    subjects.add_argument("name", metavar="NAME")
    subjects.add_argument("--prefix", default="", help="only subjects starting with this")
    subjects.add_argument(
        "--limit",
        type=non_negative,
        default=0,
        metavar="N",
        help=f"at most N (default {limits.list_subjects_limit_default})",
    )
    scan = leaf(stream, "scan", _stream_scan, "list the messages at one exact subject")
    scan.add_argument("name", metavar="NAME")
    scan.add_argument("subject", metavar="SUBJECT")
    scan.add_argument("--from-seq", type=non_negative, default=0, metavar="N")
    scan.add_argument(
        "--limit",
        type=non_negative,
        default=0,
        metavar="N",
        help=f"at most N (default {limits.scan_limit_default})",
    )


# argparse dest -> field of StreamConfig and UpdateStreamRequest.
_STREAM_LIMIT_FIELDS = {
    "max_age": "max_age_ms",
    "max_msgs": "max_msgs",
    "max_bytes": "max_bytes",
    "max_msgs_per_subject": "max_msgs_per_subject",
    "max_msg_size": "max_msg_bytes",
    "dedupe_window": "dedupe_window_ms",
    "replicas": "replicas",
    "description": "description",
}


def _add_stream_limits(parser: argparse.ArgumentParser, *, update: bool) -> None:
    subjects_help = (
        "replaces the stream's subject patterns"
        if update
        else ("subject patterns the stream accepts (wildcards * and >; default: any subject)")
    )
    zero = "; 0 clears it" if update else ""
    parser.add_argument(
        "--subjects", type=typed(fmt.parse_subjects), metavar="A,B", help=subjects_help
    )
    parser.add_argument(
        "--max-age",
        type=typed(fmt.parse_duration_ms),
        metavar="DURATION",
        help=f"drop messages older than this, e.g. 1h, 30s, 500ms{zero}",
    )
    parser.add_argument(
        "--max-msgs", type=non_negative, metavar="N", help=f"keep at most N messages{zero}"
    )
    parser.add_argument(
        "--max-bytes",
        type=typed(fmt.parse_size),
        metavar="SIZE",
        help=f"keep at most this many bytes, e.g. 10MB{zero}",
    )
    parser.add_argument(
        "--max-msgs-per-subject",
        type=non_negative,
        metavar="N",
        help=f"keep at most N messages per subject{zero}",
    )
    parser.add_argument(
        "--max-msg-size",
        type=typed(fmt.parse_size),
        metavar="SIZE",
        help="largest accepted message, e.g. 1MB (default: the node's limit)",
    )
    parser.add_argument(
        "--dedupe-window",
        type=typed(fmt.parse_duration_ms),
        metavar="DURATION",
        help="window for duplicate msg ids (default 2m)",
    )
    parser.add_argument(
        "--replicas",
        type=non_negative,
        metavar="N",
        help="copies in a cluster (default 3, capped by the cluster size)",
    )
    parser.add_argument("--description", metavar="TEXT")


def _add_pub(commands: Any) -> None:
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
# Streams.


async def _stream_create(client: Client, args: argparse.Namespace) -> int:
    config = types_pb2.StreamConfig(
        name=args.name,
        subjects=args.subjects or [],
        retention=fmt.RETENTION_NAMES[args.retention],
    )
    for dest, field in _STREAM_LIMIT_FIELDS.items():
        if getattr(args, dest) is not None:
            setattr(config, field, getattr(args, dest))
    request = streams_pb2.CreateStreamRequest(config=config)
    info = await client.streams.CreateStream(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(info), lambda: fmt.stream_info_text(info))
    return EXIT_OK


async def _stream_info(client: Client, args: argparse.Namespace) -> int:
    request = streams_pb2.GetStreamInfoRequest(name=args.name)
    info = await client.streams.GetStreamInfo(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(info), lambda: fmt.stream_info_text(info))
    return EXIT_OK


async def _stream_ls(client: Client, args: argparse.Namespace) -> int:
    request = streams_pb2.ListStreamsRequest(prefix=args.prefix)
    response = await client.streams.ListStreams(request, timeout=client.deadline_s())

    def text() -> str:
        if not response.streams:
            return f"no streams starting with {args.prefix!r}" if args.prefix else "no streams"
        return fmt.streams_table(response.streams)

    emit(args, fmt.proto_dict(response), text)
    return EXIT_OK


async def _stream_update(client: Client, args: argparse.Namespace) -> int:
    request = streams_pb2.UpdateStreamRequest(name=args.name)
    changed = False
    for dest, field in _STREAM_LIMIT_FIELDS.items():
        if getattr(args, dest) is not None:
            setattr(request, field, getattr(args, dest))
            changed = True
    if args.subjects is not None:
        request.subjects.subjects.extend(args.subjects)
        changed = True
    if not changed:
        raise UsageError("nothing to change: give at least one of --subjects, --max-age, ...")
    response = await client.streams.UpdateStream(request, timeout=client.deadline_s())

    def text() -> str:
        body = fmt.stream_info_text(response.info)
        return body + (
            f"\n\npruned {fmt.human_count(response.pruned)} messages" if response.pruned else ""
        )

    emit(args, fmt.proto_dict(response), text)
    return EXIT_OK


async def _stream_rm(client: Client, args: argparse.Namespace) -> int:
    if not args.force:
        if not sys.stdin.isatty():
            warn(
                f"error: refusing to delete stream {args.name!r} without --force "
                "(stdin is not a terminal, so there is nobody to confirm)"
            )
            return EXIT_USAGE
        request = streams_pb2.GetStreamInfoRequest(name=args.name)
        info = await client.streams.GetStreamInfo(request, timeout=client.deadline_s())
        question = (
            f"Delete stream {args.name} with {fmt.human_count(info.state.messages)} "
            f"messages ({fmt.human_size(info.state.bytes)}) and its "
            f"{info.state.consumers} consumers? [y/N] "
        )
        if input(question).strip().lower() not in ("y", "yes"):
            warn("not deleted")
            return EXIT_ERROR
    await client.streams.DeleteStream(
        streams_pb2.DeleteStreamRequest(name=args.name), timeout=client.deadline_s()
    )
    emit(args, {"deleted": args.name}, lambda: f"deleted stream {args.name}")
    return EXIT_OK


async def _stream_purge(client: Client, args: argparse.Namespace) -> int:
    request = streams_pb2.PurgeStreamRequest(
        name=args.name, subject=args.subject, below_seq=args.below_seq, keep=args.keep
    )
    response = await client.streams.PurgeStream(request, timeout=client.deadline_s())
    emit(
        args,
        fmt.proto_dict(response),
        lambda: f"purged {fmt.human_count(response.purged)} messages from {args.name}",
    )
    return EXIT_OK


async def _stream_get(client: Client, args: argparse.Namespace) -> int:
    request = streams_pb2.GetMessageRequest(stream=args.name, seq=args.seq)
    message = await client.streams.GetMessage(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(message), lambda: fmt.message_text(message))
    return EXIT_OK


async def _stream_last(client: Client, args: argparse.Namespace) -> int:
    request = streams_pb2.ReadLatestAtSubjectRequest(stream=args.name, subject=args.subject)
    message = await client.streams.ReadLatestAtSubject(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(message), lambda: fmt.message_text(message))
    return EXIT_OK


async def _stream_subjects(client: Client, args: argparse.Namespace) -> int:
    request = streams_pb2.ListSubjectsByPrefixRequest(
        stream=args.name, prefix=args.prefix, limit=args.limit
    )
    response = await client.streams.ListSubjectsByPrefix(request, timeout=client.deadline_s())
    emit(
        args,
        fmt.proto_dict(response),
        lambda: fmt.subjects_table(response) if response.subjects else "no subjects",
    )
    return EXIT_OK


async def _stream_scan(client: Client, args: argparse.Namespace) -> int:
    request = streams_pb2.ScanExactAtSubjectRequest(
        stream=args.name, subject=args.subject, from_seq=args.from_seq, limit=args.limit
    )
    response = await client.streams.ScanExactAtSubject(request, timeout=client.deadline_s())

    def text() -> str:
        lines = [fmt.message_text(m) for m in response.messages] or ["no messages"]
        if response.next_seq:
            lines.append(f"(more: --from-seq {response.next_seq})")
        return "\n".join(lines)

    emit(args, fmt.proto_dict(response), text)
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# Publishing.


class _PubReport:
    """Acks and per-message errors of one `pub` run; text lines are printed as they come."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.acks: list[streams_pb2.PublishAck] = []
        self.errors: list[types_pb2.Error] = []

    def ack(self, ack: streams_pb2.PublishAck) -> None:
        self.acks.append(ack)
        if not self.args.json:
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
    chained = args.expect_last_seq is not None or args.expect_last_subject_seq is not None
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
