"""Scheduled messages on the command line (docs/scheduled.md): `raftlog pub ... --delay 30s`
or `--deliver-at ISO8601|MS` (the options; `publish` sends each message as one Publish),
`raftlog stream scheduled NAME` (what waits for a stream) and `raftlog stream unschedule NAME
SEQ` (cancel one waiting message by its schedule seq).
"""

from __future__ import annotations

import argparse
from typing import Any

from raftlog.base.clock import SystemClock
from raftlog.node.cli import format as fmt
from raftlog.node.cli.base import EXIT_OK, UsageError, emit, leaf, non_negative, positive, typed
from raftlog.node.cli.client import Client
from raftlog.v1 import streams_pb2


def add_schedule_options(pub: argparse.ArgumentParser) -> None:
    """--delay and --deliver-at of `raftlog pub`."""
    when = pub.add_mutually_exclusive_group()
    when.add_argument("--delay", type=typed(fmt.parse_duration_ms), metavar="DURATION",
                      help="deliver each message this long from now (e.g. 30s, 5m, 1h)")
    when.add_argument("--deliver-at", type=typed(fmt.parse_time_ms), metavar="TIME",
                      help="deliver at this time: ISO 8601 (2026-11-22T10:00:00Z) or ms since "
                      "the epoch")


def deliver_at_ms(args: argparse.Namespace) -> int:
    """The deliver_at_ms of `pub`'s messages; 0 = publish at once."""
    delay, at = getattr(args, "delay", None), getattr(args, "deliver_at", None)
    if delay is None and at is None:
        return 0
    if args.count is not None:
        raise UsageError("--delay and --deliver-at are not for load mode (--count)")
    if args.expect_last_seq is not None or args.expect_last_subject_seq is not None:
        raise UsageError("a scheduled message cannot expect a last seq")
    if at is not None:
        return int(at)
    return SystemClock().wall_ms() + int(delay or 0)


def scheduled_ack_text(ack: streams_pb2.PublishAck, subject: str) -> str:
    return (f"scheduled #{ack.seq} {subject} in {ack.stream}, due "
            f"{fmt.human_time_ms(ack.deliver_at_ms)}" + ("  (duplicate)" if ack.duplicate else ""))


def add_scheduled_commands(stream: Any) -> None:
    """`raftlog stream scheduled` and `raftlog stream unschedule`, in the `stream` group."""
    listing = leaf(stream, "scheduled", _scheduled, "list a stream's scheduled messages")
    listing.add_argument("name", metavar="NAME")
    listing.add_argument("--from-seq", type=non_negative, default=0, metavar="SEQ",
                         help="first schedule seq to list")
    listing.add_argument("--limit", type=positive, default=0, metavar="N",
                         help="at most N (default: the server's, 100)")
    cancel = leaf(stream, "unschedule", _unschedule,
                  "cancel a scheduled message before it is due")
    cancel.add_argument("name", metavar="NAME")
    cancel.add_argument("seq", type=positive, metavar="SEQ", help="its schedule seq")


def scheduled_text(response: streams_pb2.ListScheduledResponse) -> str:
    if not response.messages:
        return "no scheduled messages"
    rows = [(str(m.schedule_seq), fmt.human_time_ms(m.deliver_at_ms), m.subject,
             fmt.human_size(m.size), m.msg_id or "-") for m in response.messages]
    table = fmt.render_table(("SEQ", "DUE", "SUBJECT", "SIZE", "MSG ID"), rows,
                             right_align=(0, 3))
    more = f"\nmore from --from-seq {response.next_seq}" if response.next_seq else ""
    return f"{table}{more}"


async def _scheduled(client: Client, args: argparse.Namespace) -> int:
    request = streams_pb2.ListScheduledRequest(stream=args.name, from_seq=args.from_seq,
                                               limit=args.limit)
    response = await client.streams.ListScheduled(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(response), lambda: scheduled_text(response))
    return EXIT_OK


async def _unschedule(client: Client, args: argparse.Namespace) -> int:
    request = streams_pb2.CancelScheduledRequest(stream=args.name, schedule_seq=args.seq)
    response = await client.streams.CancelScheduled(request, timeout=client.deadline_s())
    message = response.message
    emit(args, fmt.proto_dict(response),
         lambda: f"cancelled #{message.schedule_seq} {message.subject} (was due "
                 f"{fmt.human_time_ms(message.deliver_at_ms)})")
    return EXIT_OK
