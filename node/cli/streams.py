"""`raftlog stream ...`: a stream's lifecycle (create, info, ls, update, rm, purge) and direct
reads of its messages (get, last, subjects, scan); `create --source` and `sources` come from
`sources`.

`add_stream_commands` also adds `raftlog pub` (in `publish`); `cluster` later adds `route`,
`migrate`, `pin` and `unpin` to the `stream` group.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from raftlog.base import limits
from raftlog.node.cli import format as fmt
from raftlog.node.cli.base import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    emit,
    group,
    leaf,
    non_negative,
    typed,
    warn,
)
from raftlog.node.cli.client import Client
from raftlog.node.cli.publish import add_pub_command
from raftlog.node.cli.scheduled import add_scheduled_commands
from raftlog.node.cli.sources import SPEC_HELP, add_sources_command, parse_source_spec
from raftlog.v1 import streams_pb2, types_pb2


def add_stream_commands(commands: Any) -> None:
    _add_stream(commands)
    add_pub_command(commands)


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
    create.add_argument("--source", action="append", type=typed(parse_source_spec),
                        metavar="SPEC", help=SPEC_HELP)
    add_sources_command(stream)
    add_scheduled_commands(stream)
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
    "max_msgs_per_s": "max_msgs_per_s",
    "max_bytes_per_s": "max_bytes_per_s",
    "discard": "discard",
    "max_subscriptions": "max_subscriptions",
}
_DISCARD = {"old": types_pb2.DISCARD_OLD, "new": types_pb2.DISCARD_NEW}


def _discard_policy(text: str) -> int:
    if text not in _DISCARD:
        raise ValueError(f"--discard is old or new, not {text!r}")
    return _DISCARD[text]


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
    parser.add_argument(
        "--max-msgs-per-s", type=non_negative, metavar="N",
        help=f"publish quota: at most N messages a second (docs/quotas.md){zero}")
    parser.add_argument(
        "--max-bytes-per-s", type=typed(fmt.parse_size), metavar="SIZE",
        help=f"publish quota: at most this many bytes a second, e.g. 1MB{zero}")
    parser.add_argument(
        "--discard", type=typed(_discard_policy), metavar="old|new",
        help="at --max-msgs/--max-bytes: remove the oldest messages (old, the default) or "
        "refuse new ones with RESOURCE_EXHAUSTED (new)")
    parser.add_argument(
        "--max-subscriptions", type=non_negative, metavar="N",
        help=f"at most N Subscribe calls open on the stream at once (docs/quotas.md){zero}")


# ---------------------------------------------------------------------------------------------
# Lifecycle.


async def _stream_create(client: Client, args: argparse.Namespace) -> int:
    config = types_pb2.StreamConfig(
        name=args.name,
        subjects=args.subjects or [],
        retention=fmt.RETENTION_NAMES[args.retention],
    )
    for dest, field in _STREAM_LIMIT_FIELDS.items():
        if getattr(args, dest) is not None:
            setattr(config, field, getattr(args, dest))
    config.sources.extend(args.source or [])
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


# ---------------------------------------------------------------------------------------------
# Reading messages.


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
