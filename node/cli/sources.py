"""Stream sources on the command line: `raftlog stream create NAME --source SPEC` (the SPEC
parser) and `raftlog stream sources [NAME]` (every tail's position, totals and last error).

A SPEC is the source stream's name, then comma-separated settings:

    orders[,filter=orders.eu.>][,start-seq=N|start-time=ISO][,transform=SRC=>DST]
          [,backfill=N][,on-drop=halt|skip][,dlq=STREAM]

e.g. `orders,filter=orders.eu.>,transform=orders.*.>=>audit.{{wildcard(1)}}.x,dlq=errors`.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from raftlog.base import subjects
from raftlog.base.errors import RaftlogError
from raftlog.base.subject_transform import SubjectTransform
from raftlog.node.cli import format as fmt
from raftlog.node.cli.base import EXIT_OK, emit, leaf
from raftlog.node.cli.client import Client
from raftlog.v1 import streams_pb2, types_pb2

SPEC_HELP = ("copy messages from another stream; SPEC: SOURCE[,filter=PATTERN]"
             "[,start-seq=N|start-time=ISO][,transform=SRC=>DST][,backfill=N]"
             "[,on-drop=halt|skip][,dlq=STREAM] (repeatable)")
_ON_DROP = {"halt": types_pb2.SOURCE_ON_DROP_HALT,
            "skip": types_pb2.SOURCE_ON_DROP_SKIP_TO_FIRST_AVAILABLE}
_KEYS = ("filter", "start-seq", "start-time", "transform", "backfill", "on-drop", "dlq")


def _whole(key: str, text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"--source {key}= takes a whole number, not {text!r}")
    return int(text)


def _time_ms(text: str) -> int:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--source start-time= takes an ISO time such as "
                         f"2026-01-31T12:00:00Z, not {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _transform(text: str) -> types_pb2.SubjectTransform:
    pattern, arrow, destination = text.partition("=>")
    if not arrow:
        raise ValueError(f"--source transform= takes SRC=>DST, not {text!r}")
    SubjectTransform.parse(pattern=pattern, destination=destination)
    return types_pb2.SubjectTransform(source_pattern=pattern, destination=destination)


def parse_source_spec(text: str) -> types_pb2.StreamSource:
    """One --source SPEC; ValueError says what is wrong (argparse then exits 2)."""
    name, *settings = text.split(",")
    source = types_pb2.StreamSource(stream=name.strip())
    seen: set[str] = set()
    try:
        subjects.validate_name(source.stream, what="source stream")
        for setting in settings:
            key, equals, value = setting.partition("=")
            key, value = key.strip(), value.strip()
            if not equals or key not in _KEYS:
                raise ValueError(f"--source: unknown setting {setting!r} (settings: "
                                 f"{', '.join(_KEYS)})")
            if key in seen:
                raise ValueError(f"--source: {key}= given twice")
            seen.add(key)
            _apply(source, key, value)
    except RaftlogError as err:
        raise ValueError(f"--source {text!r}: {err.message}") from None
    if source.start_seq and source.start_time_ms:
        raise ValueError("--source: start-seq and start-time are exclusive")
    return source


def _apply(source: types_pb2.StreamSource, key: str, value: str) -> None:
    if key == "filter":
        source.filter_subject = subjects.validate_pattern(value)
    elif key == "start-seq":
        source.start_seq = _whole(key, value)
    elif key == "start-time":
        source.start_time_ms = _time_ms(value)
    elif key == "transform":
        source.subject_transform.CopyFrom(_transform(value))
    elif key == "backfill":
        source.max_initial_backfill = _whole(key, value)
    elif key == "on-drop":
        if value not in _ON_DROP:
            raise ValueError(f"--source on-drop= takes halt or skip, not {value!r}")
        source.on_drop = _ON_DROP[value]
    elif key == "dlq":
        source.dlq_stream = subjects.validate_name(value, what="dead-letter stream")


def add_sources_command(stream: Any) -> None:
    """`raftlog stream sources [NAME]`, in the `stream` group."""
    parser = leaf(stream, "sources", _stream_sources,
                  "list the tails of stream sources across the cluster")
    parser.add_argument("name", metavar="NAME", nargs="?", default="",
                        help="only the sources of this stream")


def sources_text(response: streams_pb2.GetStreamSourcesResponse) -> str:
    rows = [("SOURCING", "SOURCE", "NODE", "COPIED TO", "NEXT", "SOURCE END", "PULLED",
             "ERROR")]
    for s in response.sources:
        error = ("HALTED: " if s.halted else "") + s.last_error
        rows.append((s.sourcing_stream, s.source_stream, s.node or "-",
                     str(s.last_sourced_seq), str(s.next_seq), str(s.source_last_seq),
                     str(s.pulled_total), error or "-"))
    lines = [] if len(rows) > 1 else ["no source tails are running"]
    if len(rows) > 1:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        lines = ["  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)),
                            row[-1]]).rstrip() for row in rows]
    if response.unreachable:
        lines.append(f"not answering: {', '.join(response.unreachable)}")
    return "\n".join(lines)


async def _stream_sources(client: Client, args: argparse.Namespace) -> int:
    request = streams_pb2.GetStreamSourcesRequest(stream=args.name)
    response = await client.streams.GetStreamSources(request, timeout=client.deadline_s())
    emit(args, fmt.proto_dict(response), lambda: sources_text(response))
    return EXIT_OK
